"""trainer.keep_best: the checkpoint of the best logged value is kept beside the last k, and survives resume."""

from __future__ import annotations

import json

import pytest
import torch

from searchr1_lld.bookkeeping import checkpoint as ckpt
from searchr1_lld.bookkeeping.best_checkpoint import BEST_FILE, BestCheckpoint, load_best, write_best
from searchr1_lld.config import ConfigError, load_config

from conftest import REPO_ROOT
from test_trainer import _cfg, _trainer, shared_retriever  # noqa: F401  (the module's retriever fixture)


def _save(run_dir, step, k, keep=()):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return ckpt.save_checkpoint(run_dir, step, model=model, optimizer=opt, scheduler=sched, trainer_state={},
                                keep_last_k=k, save_policy=False, keep_steps=keep)


def _steps(run_dir):
    return [ckpt.checkpoint_step(p) for p in ckpt.list_checkpoints(run_dir)]


def test_pruning_spares_the_kept_steps(tmp_path):
    for s in (1, 2, 3, 4):
        _save(tmp_path, s, k=2, keep={2})
    assert _steps(tmp_path) == [2, 3, 4]
    assert ckpt.prune_checkpoints(tmp_path, 1) == [ckpt.checkpoint_root(tmp_path) / f"step_00000{s}"
                                                   for s in (2, 3)]
    assert _steps(tmp_path) == [4]


@pytest.mark.parametrize("mode, values, best", [("max", [0.2, 0.5, 0.5, 0.1], (1, 0.5)),
                                                ("min", [0.2, float("nan"), 0.1, None], (2, 0.1))])
def test_best_is_strictly_better_and_finite(mode, values, best):
    b = BestCheckpoint("m", mode)
    for step, v in enumerate(values):
        if b.improves(v):
            b.record(step, v, f"step_{step}")
    assert (b.step, b.value) == best


def test_a_record_is_continued_only_for_the_same_metric_and_an_earlier_step(tmp_path):
    write_best(tmp_path, BestCheckpoint("eval/avg_em", "max", 0.4, 3, "p"))
    same, note = load_best(tmp_path, "eval/avg_em", "max", resumed_step=5)
    assert (same.step, same.value, note) == (3, 0.4, "")
    other, note = load_best(tmp_path, "eval/em", "max", resumed_step=5)
    assert other.step is None and "tracked afresh" in note
    later, note = load_best(tmp_path, "eval/avg_em", "max", resumed_step=2)
    assert later.step is None and "after the resumed step 2" in note


def test_an_eval_metric_needs_eval_every():
    with pytest.raises(ConfigError, match="trainer.keep_best"):
        load_config(None, ["trainer.keep_best=eval/val_em", "trainer.eval_every=0", "data.val_holdout.size=5"])
    load_config(None, ["trainer.keep_best=eval/val_em", "trainer.eval_every=5", "data.val_holdout.size=5"])
    with pytest.raises(ConfigError, match="keep_best_mode"):
        load_config(None, ["trainer.keep_best=actor/entropy", "trainer.keep_best_mode=median"])


PAPER_CONFIGS = sorted([*(REPO_ROOT / "configs" / "paper").glob("*.yaml"), *(REPO_ROOT / "configs" / "ablations").glob(
    "*.yaml")])


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_paper_configs_keep_best_refuses_a_test_split(path):
    """Every paper and ablation config keeps its best checkpoint by the validation split held out of its training
    rows; pointed at a metric of a test split it does not start, and the error names the field and the fix."""
    cfg = load_config(path)
    assert (cfg.trainer.keep_best, cfg.trainer.select_on_test) == ("eval/val_em", False)
    assert cfg.data.val_holdout.size > 0 and not cfg.data.val_files
    for test_metric in ("eval/avg_em", "eval/nq/em", "eval/em"):
        with pytest.raises(ConfigError, match=r"^trainer.keep_best: .* test split .*trainer.select_on_test=true"):
            load_config(path, [f"trainer.keep_best={test_metric}"])
    # the authors' practice, asked for by name
    load_config(path, ["trainer.keep_best=eval/avg_em", "trainer.select_on_test=true"])


def test_keep_best_on_validation_needs_one_validation_split():
    for metric in ("eval/val_em", "eval/val/nq/em", "eval/val_sub_em"):
        with pytest.raises(ConfigError, match="logged only with a validation split"):
            load_config(None, [f"trainer.keep_best={metric}", "trainer.eval_every=5"])
        load_config(None, [f"trainer.keep_best={metric}", "trainer.eval_every=5", "data.val_files=[v.jsonl]"])
    with pytest.raises(ConfigError, match="one validation split"):
        load_config(None, ["data.val_holdout.size=5", "data.val_files=[v.jsonl]"])
    with pytest.raises(ConfigError, match="data.val_holdout.size: must be >= 0"):
        load_config(None, ["data.val_holdout.size=-1"])
    load_config(None, ["trainer.keep_best=actor/entropy", "trainer.eval_every=0"])  # a training metric: no split


def _scripted(trainer, scores):
    """The real step, plus a logged metric whose values the test chooses (so the best step is known)."""
    real, it = trainer.train_step, iter(scores)
    trainer.train_step = lambda: {**real(), "test/score": next(it)}
    return trainer


def test_the_best_checkpoint_outlives_the_last_k_and_a_resume(tmp_path, tiny_world, shared_retriever):  # noqa: F811
    common = ["trainer.save_every=1", "trainer.keep_last_k=1", "trainer.keep_best=test/score",
              "trainer.ppo_epochs=1", "trainer.probe_every=0", "trainer.resume=auto"]
    tr = _scripted(_trainer(_cfg(tmp_path, *common, "trainer.total_steps=4"), tiny_world, shared_retriever),
                   [0.2, 0.5, 0.1, 0.3])
    tr.run(evaluate=False)
    run_dir = tmp_path / "run"
    assert _steps(run_dir) == [2, 4]  # the best (step 2, 0.5) and the last one
    record = json.loads((run_dir / BEST_FILE).read_text())
    assert (record["step"], record["value"], record["metric"]) == (2, 0.5, "test/score")
    assert record["path"].endswith("step_000002")

    # a restart: step 5 (0.4) is not better than the recorded 0.5, so step 2 stays the best and stays on disk
    cfg = _cfg(tmp_path, *common, "trainer.total_steps=5")
    tr = _scripted(_trainer(cfg, tiny_world, shared_retriever), [0.4])
    tr.run(evaluate=False, allow_changes=["trainer.total_steps"])
    assert _steps(run_dir) == [2, 5]
    assert json.loads((run_dir / BEST_FILE).read_text())["step"] == 2

    # a new best replaces it: the earlier best is pruned once the new record is written
    cfg = _cfg(tmp_path, *common, "trainer.total_steps=7")
    tr = _scripted(_trainer(cfg, tiny_world, shared_retriever), [0.9, 0.0])
    tr.run(evaluate=False, allow_changes=["trainer.total_steps"])
    assert _steps(run_dir) == [6, 7]
    assert json.loads((run_dir / BEST_FILE).read_text())["step"] == 6
