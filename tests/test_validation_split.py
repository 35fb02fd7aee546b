"""A run's validation split, held out of its training rows: never trained on, scored during training source by source,
read by trainer.keep_best; the test sets (eval.datasets) scored once, at the last step, unless trainer.select_on_test
(the authors' practice, which warns)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from searchr1_lld.config import load_config
from searchr1_lld.data.splits import question_key
from searchr1_lld.learner.trainer import Trainer

from conftest import on_world
from test_trainer import SMALL, shared_retriever  # noqa: F401  (the module's retriever fixture)

COMMON = [*SMALL, "trainer.total_steps=2", "trainer.eval_every=1", "trainer.save_every=0", "trainer.resume=never",
          "trainer.ppo_epochs=1", "trainer.probe_every=0", "trainer.run_name=run"]


def _two_source_train_file(tmp_path, tiny_world):
    """The world's training rows, every other one labelled nq, the rest hotpotqa (two sources, as a paper mix)."""
    rows = [json.loads(x) for x in (tiny_world / "qa" / "train.jsonl").read_text().splitlines()]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({**r, "data_source": "nq" if i % 2 else "hotpotqa"}) + "\n"
                            for i, r in enumerate(rows)))
    return path


def test_a_run_never_trains_on_its_held_out_questions_and_keeps_its_best_by_them(tmp_path, tiny_world,
                                                                                  shared_retriever):  # noqa: F811
    train_file = _two_source_train_file(tmp_path, tiny_world)
    cfg = load_config(None, [*COMMON, f"trainer.output_dir={tmp_path}", "data.val_holdout.size=3",
                             "trainer.keep_best=eval/val_em"])
    tr = Trainer(on_world(cfg, tiny_world, "data.val_files=[]", f"data.train_files=[{train_file}]"),
                 retriever=shared_retriever)
    prompts: list[dict] = []
    draw = tr.next_rows
    tr.next_rows = lambda: (rows := draw(), prompts.extend(rows))[0]
    res = tr.run(evaluate=False)

    assert Counter(r["data_source"] for r in tr.val_rows) == {"nq": 3, "hotpotqa": 3}
    held = {question_key(r["question"]) for r in tr.val_rows}
    assert prompts and not {question_key(r["question"]) for r in prompts} & held  # never trained on
    assert not {question_key(r["question"]) for r in tr.train_rows} & held
    for m in res.history:  # each source's curve, and their mean weighted by questions
        assert m["eval/val_em"] == pytest.approx((3 * m["eval/val/nq/em"] + 3 * m["eval/val/hotpotqa/em"]) / 6)
    nq_rows = [r for r in tr.val_rows if r["data_source"] == "nq"]
    assert tr.evaluate(nq_rows)["em"] == res.history[-1]["eval/val/nq/em"]
    best = json.loads((res.run_dir / "best_checkpoint.json").read_text())
    assert best["metric"] == "eval/val_em" and best["step"] in (1, 2)


def test_the_test_sets_are_scored_once_at_the_last_step_unless_select_on_test(tmp_path, tiny_world, capsys,
                                                                               shared_retriever):  # noqa: F811
    benchmark = f"eval.datasets=[heldout={tiny_world / 'qa' / 'test.jsonl'}]"
    cfg = load_config(None, [*COMMON, f"trainer.output_dir={tmp_path / 'ours'}", benchmark, "trainer.eval_limit=2"])
    res = Trainer(on_world(cfg, tiny_world), retriever=shared_retriever).run(evaluate=False)
    assert [("eval/heldout/em" in m, "eval/val_em" in m) for m in res.history] == [(False, True), (True, True)]
    assert res.history[-1]["eval/avg_em"] == res.history[-1]["eval/heldout/em"]
    assert "select_on_test" not in capsys.readouterr().out

    authors = load_config(None, [*COMMON, f"trainer.output_dir={tmp_path / 'authors'}", benchmark,
                                 "trainer.eval_limit=2", "trainer.select_on_test=true",
                                 "trainer.keep_best=eval/avg_em"])
    with pytest.warns(UserWarning, match="select_on_test=true: eval.datasets .* not a held-out estimate"):
        tr = Trainer(on_world(authors, tiny_world), retriever=shared_retriever)
    res = tr.run(evaluate=False)
    assert ["eval/heldout/em" in m for m in res.history] == [True, True]
    assert "WARNING: trainer.select_on_test=true" in capsys.readouterr().out  # in the run's log too
    assert json.loads((res.run_dir / "best_checkpoint.json").read_text())["metric"] == "eval/avg_em"
