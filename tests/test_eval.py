"""Evaluator: metrics on hand-written cases, average / relative gain arithmetic, tables, resume, sharding, compare."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest

from searchr1_lld import evaluation as ev
from searchr1_lld.config import RolloutConfig


def _traj(row, prediction, *, turns=2, searches=1, invalid=0, truncated=False, queries=("q",), ids=(("d1", "d2"),)):
    text = f"<search> q </search> ... <answer> {prediction} </answer>" if prediction is not None else "no answer"
    return SimpleNamespace(row=row, prediction=prediction, num_turns=turns, valid_searches=searches,
                           invalid_actions=invalid, truncated=truncated, queries=list(queries),
                           retrieved_ids=[list(i) for i in ids], response_text=text,
                           finish_reason="answer" if prediction is not None else "max_turns")


def _row(i, golds, hops=None):
    row = {"id": f"r{i}", "question": f"question {i}", "golden_answers": golds, "data_source": "t", "metadata": {}}
    if hops is not None:
        row["metadata"] = {"hops": hops}
    return row


def test_record_scores_em_subem_f1():
    r = ev.record_from_trajectory(_traj(_row(0, ["Barack Obama", "Obama"]), "The Obama!"), "nq")
    assert (r["em"], r["sub_em"]) == (1.0, 1.0)  # "the obama" -> "obama" equals a gold
    r = ev.record_from_trajectory(_traj(_row(0, ["Paris"]), "paris france"), "nq")
    assert r["em"] == 0.0 and r["sub_em"] == 1.0
    assert r["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # precision 1/2, recall 1/1
    r = ev.record_from_trajectory(_traj(_row(0, ["Paris"]), None), "nq")
    assert (r["em"], r["sub_em"], r["f1"]) == (0.0, 0.0, 0.0)
    assert r["queries"] == ["q"] and r["retrieved_ids"] == [["d1", "d2"]] and r["golden_answers"] == ["Paris"]


def test_dataset_metrics_hand_computed():
    recs = [
        ev.record_from_trajectory(_traj(_row(0, ["a1"], hops=1), "a1", turns=2, searches=1), "synthetic"),
        ev.record_from_trajectory(_traj(_row(1, ["b2"], hops=2), "wrong", turns=4, searches=2, invalid=1,
                                        truncated=True), "synthetic"),
        ev.record_from_trajectory(_traj(_row(2, ["c3"], hops=2), "c3", turns=3, searches=3, invalid=2), "synthetic"),
        ev.record_from_trajectory(_traj(_row(3, ["d4"], hops=1), None, turns=1, searches=0), "synthetic"),
    ]
    m = ev.dataset_metrics(recs)
    assert m["n"] == 4
    assert m["em"] == pytest.approx(2 / 4)
    assert m["mean_valid_searches"] == pytest.approx((1 + 2 + 3 + 0) / 4)
    assert m["mean_turns"] == pytest.approx((2 + 4 + 3 + 1) / 4)
    assert m["invalid_action_rate"] == pytest.approx(3 / 10)
    assert m["truncation_rate"] == pytest.approx(1 / 4)
    assert m["answer_rate"] == pytest.approx(3 / 4)
    assert (m["n_single_hop"], m["em_single_hop"]) == (2, pytest.approx(0.5))
    assert (m["n_multi_hop"], m["em_multi_hop"]) == (2, pytest.approx(0.5))
    # benchmark rows carry no hops -> no hop sub-scores
    plain = ev.dataset_metrics([ev.record_from_trajectory(_traj(_row(0, ["x"]), "x"), "nq")])
    assert "em_single_hop" not in plain
    with pytest.raises(ev.EvalError):
        ev.dataset_metrics([])


def test_average_is_unweighted_and_relative_gain():
    recs = [{"dataset": "nq", "em": 1.0}] + [{"dataset": "hotpotqa", "em": 0.0}] * 3
    recs = [dict(r, id=str(i), sub_em=r["em"], f1=r["em"], num_turns=1, valid_searches=1, invalid_actions=0,
                 truncated=False, prediction="x") for i, r in enumerate(recs)]
    res = ev.summarize(recs, order=["nq", "hotpotqa"])
    assert list(res["datasets"]) == ["nq", "hotpotqa"]
    assert res["average_em"] == pytest.approx(0.5)  # mean of 1.0 and 0.0, not the pooled 0.25
    assert res["n"] == 4
    assert ev.relative_gain(0.430, 0.312) == pytest.approx(0.37820512820512)  # the paper's +37.8%
    assert ev.relative_gain(0.3, 0.0) is None


def _res(name, ems):
    ds = {d: {"em": v, "n": 10} for d, v in ems.items()}
    return name, {"name": name, "datasets": ds, "average_em": sum(ems.values()) / len(ems)}


def test_tables_paper_layout_and_gain():
    methods = [_res("GRPO", {"hotpotqa": 0.2, "nq": 0.4}), _res("LLDS", {"nq": 0.5, "hotpotqa": 0.4}),
               _res("zero", {"nq": 0.3})]
    md = ev.markdown_table(methods)
    lines = md.strip().splitlines()
    assert lines[0] == "| Method | NQ | HotpotQA | Avg. | Gain |"  # paper column order, not insertion order
    assert lines[2] == "| GRPO | 0.400 | 0.200 | 0.300 | base |"
    assert lines[3] == "| LLDS | 0.500 | 0.400 | 0.450 | +50.0% |"
    assert lines[4] == "| zero | 0.300 | - | 0.300 | +0.0% |"
    rows = list(csv.reader(io.StringIO(ev.csv_table(methods))))
    assert rows[0] == ["Method", "NQ", "HotpotQA", "Avg.", "Gain"] and rows[2][4] == "+50.0%"
    single = ev.markdown_table(methods[:1])
    assert "Gain" not in single


def test_parse_datasets_and_shard():
    assert ev.parse_datasets("nq, HotpotQA") == ["nq", "hotpotqa"]
    assert ev.parse_datasets("all") == list(ev.BENCHMARKS)
    for bad in ("nq,webq", "", "nq,nq", "synthetic", "=a.jsonl", "x=", "nq,nq=a.jsonl"):
        with pytest.raises(ev.EvalError):
            ev.parse_datasets(bad)
    # a rows file: NAME=PATH, reported as NAME, the path's case kept
    assert ev.parse_datasets("nq,Held=Dir/Test.jsonl") == ["nq", "Held=Dir/Test.jsonl"]
    assert [ev.dataset_name(s) for s in ev.parse_datasets(["bamboogle", "held=a.jsonl"])] == ["bamboogle", "held"]
    assert ev.parse_shard("1/4") == (1, 4) and ev.parse_shard(None) is None
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(ev.EvalError):
            ev.parse_shard(bad)
    rows = [{"id": i} for i in range(10)]
    parts = [ev.shard_rows(rows, (i, 3)) for i in range(3)]
    assert sorted(r["id"] for p in parts for r in p) == list(range(10))
    assert [r["id"] for r in parts[1]] == [1, 4, 7]


class ScriptedRollout:
    """Stands in for run_agent_loop: answers the gold for even ids, 'wrong' for odd ids; records every call."""

    def __init__(self, fail_after: int | None = None):
        self.seen: list[str] = []
        self.fail_after = fail_after

    def __call__(self, rows, *, backend, tokenizer, retriever, cfg, n, greedy, template, chat_template, progress):
        assert greedy and n == 1 and cfg.max_turns == 4 and cfg.topk == 3
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise RuntimeError("simulated crash")
        self.seen += [r["id"] for r in rows]
        return [_traj(r, r["golden_answers"][0] if int(r["id"][1:]) % 2 == 0 else "wrong") for r in rows]


def test_sampled_em_averages_every_sample_by_hand():
    """3 questions x 4 samples; sample j of question i is right when (i + j) % 3 == 0: right answers
    q0: j=0,3 (2/4), q1: j=2 (1/4), q2: j=1 (1/4) -> EM 4/12; single-hop (q0, q1) 3/8, multi-hop (q2) 1/4."""
    rows = [_row(0, ["g0"], hops=1), _row(1, ["g1"], hops=1), _row(2, ["g2"], hops=2)]
    calls = []

    def rollout(batch, *, backend, tokenizer, retriever, cfg, n, greedy, template, chat_template, progress):
        assert not greedy and n == 4
        calls.append([r["id"] for r in batch])
        return [_traj(r, r["golden_answers"][0] if (int(r["id"][1:]) + j) % 3 == 0 else "wrong")
                for r in batch for j in range(n)]

    cfg = ev.eval_rollout_config(RolloutConfig(temperature=0.7), max_turns=4, topk=3)
    m = ev.sampled_em(rows, backend=None, tokenizer=None, retriever=None, rollout_cfg=cfg, samples=4, batch_size=2,
                      progress=False, rollout_fn=rollout)
    assert calls == [["r0", "r1"], ["r2"]]
    assert m["em"] == pytest.approx(4 / 12) and m["n"] == 12 and m["questions"] == 3 and m["samples"] == 4
    assert m["em_single_hop"] == pytest.approx(3 / 8) and m["em_multi_hop"] == pytest.approx(1 / 4)
    assert m["temperature"] == 0.7
    with pytest.raises(ev.EvalError):
        ev.sampled_em(rows, backend=None, tokenizer=None, retriever=None, rollout_cfg=cfg, samples=0,
                      progress=False, rollout_fn=rollout)

    def short(batch, **kw):
        return rollout(batch, **kw)[:-1]

    with pytest.raises(ev.EvalError, match="trajectories"):
        ev.sampled_em(rows, backend=None, tokenizer=None, retriever=None, rollout_cfg=cfg, samples=4,
                      progress=False, rollout_fn=short)


def _run(tmp_path, rollout, rows, **kw):
    cfg = ev.eval_rollout_config(RolloutConfig(), max_turns=4, topk=3)
    return ev.evaluate(rows, backend=None, tokenizer=None, retriever=None, rollout_cfg=cfg, out_dir=tmp_path,
                       batch_size=3, progress=False, rollout_fn=rollout, **kw)


def test_evaluate_outputs_and_resume_after_crash(tmp_path):
    rows = {"nq": [_row(i, [f"g{i}"]) for i in range(7)], "bamboogle": [_row(i, [f"g{i}"]) for i in range(4)]}
    crashing = ScriptedRollout(fail_after=6)  # two batches of nq land, the third crashes
    with pytest.raises(RuntimeError):
        _run(tmp_path, crashing, rows)
    assert len(ev.read_records(tmp_path / ev.TRAJECTORIES)) == 6  # flushed per batch: nothing lost
    # a crash mid-write leaves a partial line; it is dropped and the row redone
    with open(tmp_path / ev.TRAJECTORIES, "a") as f:
        f.write('{"dataset": "nq", "id": "r6", "em"')
    resumed = ScriptedRollout()
    res = _run(tmp_path, resumed, rows, name="tiny")
    assert resumed.seen == ["r6", "r0", "r1", "r2", "r3"]  # only unfinished rows
    recs = ev.read_records(tmp_path / ev.TRAJECTORIES)
    assert len(recs) == 11 and len({(r["dataset"], r["id"]) for r in recs}) == 11
    assert res["datasets"]["nq"]["em"] == pytest.approx(4 / 7)  # ids 0, 2, 4, 6 answered right
    assert res["datasets"]["bamboogle"]["em"] == pytest.approx(2 / 4)
    assert res["average_em"] == pytest.approx((4 / 7 + 2 / 4) / 2)
    on_disk = json.loads((tmp_path / ev.RESULTS_JSON).read_text())
    assert on_disk["datasets"]["nq"]["n"] == 7 and on_disk["name"] == "tiny"
    assert "| tiny | 0.571 | 0.500 | 0.536 |" in (tmp_path / ev.RESULTS_MD).read_text()
    assert (tmp_path / ev.RESULTS_CSV).read_text().startswith("Method,NQ,Bamboogle,Avg.")
    # a full rerun does no work at all
    again = ScriptedRollout()
    assert _run(tmp_path, again, rows)["average_em"] == pytest.approx(res["average_em"])
    assert again.seen == []


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / ev.TRAJECTORIES
    p.write_text('{"dataset": "nq", "id": "1"}\nnot json\n{"dataset": "nq", "id": "2"}\n')
    with pytest.raises(ev.EvalError, match=r"corrupt trajectories file: .*:2: not valid JSON"):
        ev.read_records(p)


def test_shards_merge_to_the_unsharded_result(tmp_path):
    rows = {"nq": [_row(i, [f"g{i}"]) for i in range(9)]}
    full = _run(tmp_path / "full", ScriptedRollout(), rows)
    for i in range(3):
        assert _run(tmp_path / "sharded", ScriptedRollout(), rows, shard=(i, 3)) is None
    assert not (tmp_path / "sharded" / ev.RESULTS_JSON).exists()
    merged = ev.merge_shards(tmp_path / "sharded", order=["nq"])
    assert merged["datasets"] == full["datasets"]
    assert len(ev.read_records(tmp_path / "sharded" / ev.TRAJECTORIES)) == 9
    (tmp_path / "sharded" / "trajectories.shard-0-of-2.jsonl").write_text("")
    with pytest.raises(ev.EvalError, match="disagree"):
        ev.merge_shards(tmp_path / "sharded")


def test_compare_dirs_cli(tmp_path):
    import importlib.util
    from pathlib import Path

    for name, ems in (("grpo", {"nq": 0.25, "hotpotqa": 0.25}), ("llds", {"nq": 0.5, "hotpotqa": 0.25})):
        d = tmp_path / name
        d.mkdir()
        ev.write_results(d, _res(name, ems)[1])
    spec = importlib.util.spec_from_file_location("eval_cli", Path(__file__).resolve().parents[1] / "eval.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--compare-dirs", str(tmp_path / "grpo"), str(tmp_path / "llds"), "--out",
                     str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / ev.RESULTS_MD).read_text()
    # the paper's layout: the seven benchmarks (a row's Avg. over fewer is marked), gain, the paper's column
    assert "| Method | NQ | TriviaQA | PopQA | HotpotQA | 2Wiki | Musique | Bamboogle | Avg. | Gain | Paper Avg. |" in md
    assert "| llds | 0.500 | - | - | 0.250 | - | - | - | 0.375† | +50.0% | — |" in md
    assert "†: averaged over the datasets the row has" in md and "—: the design notes quote no paper number" in md
    assert (tmp_path / "cmp" / ev.RESULTS_CSV).read_text().splitlines()[2] == (
        "llds,0.500,-,-,0.250,-,-,-,0.375†,+50.0%,—")
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert summary["base"] == "grpo" and summary["methods"]["llds"]["relative_gain"] == pytest.approx(0.5)
    assert cli.main(["--compare-dirs", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    # two result dirs under one name (e.g. both RUN/eval of runs evaluated without --name): two rows, not one
    for run, ems in (("run-a", {"nq": 0.25, "hotpotqa": 0.25}), ("run-b", {"nq": 0.75, "hotpotqa": 0.25})):
        (tmp_path / run / "eval").mkdir(parents=True)
        ev.write_results(tmp_path / run / "eval", _res("eval", ems)[1])
    dirs = [str(tmp_path / "run-a" / "eval"), str(tmp_path / "run-b" / "eval")]
    assert cli.main(["--compare-dirs", *dirs, "--out", str(tmp_path / "cmp2")]) == 0
    methods = json.loads((tmp_path / "cmp2" / "comparison.json").read_text())["methods"]
    assert sorted(methods) == sorted(f"eval ({d})" for d in dirs)
    assert methods[f"eval ({dirs[1]})"]["average_em"] == pytest.approx(0.5)
    # --baseline: the gain column relative to a named row, which comes first
    assert cli.main(["--compare-dirs", str(tmp_path / "grpo"), str(tmp_path / "llds"), "--baseline", "llds",
                     "--out", str(tmp_path / "cmp3")]) == 0
    summary = json.loads((tmp_path / "cmp3" / "comparison.json").read_text())
    assert summary["base"] == "llds" and summary["methods"]["grpo"]["relative_gain"] == pytest.approx((0.25 - 0.375) / 0.375)
    md = (tmp_path / "cmp3" / ev.RESULTS_MD).read_text()
    assert md.index("| llds |") < md.index("| grpo |")
    assert cli.main(["--compare-dirs", str(tmp_path / "grpo"), "--baseline", "ppo", "--out", str(tmp_path / "x")]) == 2


def test_model_labels_name_the_run_and_step():
    assert ev.model_label("runs/tiny-ab12/checkpoints/step_000026/policy") == "tiny-ab12-step_000026"
    assert ev.model_label("/abs/runs/lab/grpo-seed0/checkpoints/step_000060/policy") == "grpo-seed0-step_000060"
    assert ev.model_label(".cache/world/model") == "world-model"
    assert ev.model_label("SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Ins") == "LLDS-A-GRPO-Qwen2.5-7B-Ins"
    assert ev.distinct_labels(["a", "b", "a"], ["x", "y", "z"]) == ["a (x)", "b", "a (z)"]
    with pytest.raises(ev.EvalError, match="same label and the same source"):
        ev.distinct_labels(["a", "a"], ["x", "x"])


def test_benchmark_rows_from_a_local_flashrag_mirror(tmp_path):
    (tmp_path / "bamboogle").mkdir()
    raw = [{"id": f"b{i}", "question": f"who made thing {i}", "golden_answers": [f"Maker {i}"]} for i in range(5)]
    (tmp_path / "bamboogle" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    rows = ev.load_eval_rows(["bamboogle"], flashrag_dir=tmp_path, limit=3)["bamboogle"]
    assert [r["id"] for r in rows] == ["b0", "b1", "b2"]
    assert rows[0]["question"] == "who made thing 0?" and rows[0]["golden_answers"] == ["Maker 0"]
    with pytest.raises(ev.EvalError, match="musique"):
        ev.load_eval_rows(["musique"], flashrag_dir=tmp_path)
    (tmp_path / "bamboogle" / "test.jsonl").write_text(json.dumps(raw[0]) + "\n" + json.dumps(raw[0]) + "\n")
    with pytest.raises(ev.EvalError, match="not unique"):
        ev.load_eval_rows(["bamboogle"], flashrag_dir=tmp_path)


def test_cli_default_tokenizer(tmp_path):
    import importlib.util
    from pathlib import Path

    from searchr1_lld.config import load_config
    from searchr1_lld.evaluation import command as cli

    ckpt = tmp_path / "policy"
    ckpt.mkdir()
    plain = load_config()
    assert cli.default_tokenizer(str(ckpt), plain) == str(ckpt)
    tok = load_config(None, [f"model.tokenizer_path={tmp_path / 'tok'}"])  # a world's run names its tokenizer
    assert cli.default_tokenizer(str(ckpt), tok) == str(tmp_path / "tok")
    hub = load_config(None, ["model.path=Qwen/Qwen2.5-3B"])  # a run's config names its base model
    assert cli.default_tokenizer(str(ckpt), hub) == "Qwen/Qwen2.5-3B"
    (ckpt / "tokenizer.json").write_text("{}")
    assert cli.default_tokenizer(str(ckpt), hub) == str(ckpt)


# --------------------------------------------------------------------------------------------------------------------
# Provenance: a rerun into the same --out never mixes two models' or settings' results
# --------------------------------------------------------------------------------------------------------------------


def _provenance(model_dir, rows, **kw):
    settings = dict(rollout_cfg=ev.eval_rollout_config(RolloutConfig(), max_turns=4, topk=3), template="base",
                    backend="hf", dtype="auto", retriever="http://127.0.0.1:8000")
    settings.update(kw)
    return ev.eval_provenance(model_path=model_dir, tokenizer_path=model_dir, rows_by_dataset=rows, **settings)


def test_resume_refuses_another_model_or_settings(tmp_path):
    rows = {"nq": [_row(i, [f"g{i}"]) for i in range(5)]}
    model_a, model_b = tmp_path / "a", tmp_path / "b"
    for d, byte in ((model_a, b"\x01"), (model_b, b"\x02")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"weights" + byte)
        (d / "config.json").write_text("{}")
    out = tmp_path / "out"
    prov_a = _provenance(model_a, rows)
    ev.check_provenance(out, None, prov_a)
    _run(out, ScriptedRollout(), rows)
    ev.check_provenance(out, None, prov_a)  # same model and settings: resume is fine
    # another model (a copy with other weights under the same path counts as another model too)
    with pytest.raises(ev.EvalError, match=r"weights_sha256.*--overwrite") as e:
        ev.check_provenance(out, None, _provenance(model_b, rows))
    assert "model:" in str(e.value)
    (model_a / "model.safetensors").write_bytes(b"weights\x03")
    with pytest.raises(ev.EvalError, match="weights_sha256"):
        ev.check_provenance(out, None, _provenance(model_a, rows))
    (model_a / "model.safetensors").write_bytes(b"weights\x01")
    # other decoding settings, another retriever, other rows
    with pytest.raises(ev.EvalError, match=r"decoding.max_turns: 4 -> 2"):
        ev.check_provenance(out, None, _provenance(
            model_a, rows, rollout_cfg=ev.eval_rollout_config(RolloutConfig(), max_turns=2, topk=3)))
    with pytest.raises(ev.EvalError, match="retriever"):
        ev.check_provenance(out, None, _provenance(model_a, rows, retriever="/some/index"))
    with pytest.raises(ev.EvalError, match="datasets.nq"):
        ev.check_provenance(out, None, _provenance(model_a, {"nq": rows["nq"][:3]}))
    # --overwrite starts over
    ev.check_provenance(out, None, _provenance(model_b, rows), overwrite=True)
    assert not (out / ev.TRAJECTORIES).exists() and not (out / ev.RESULTS_JSON).exists()
    ev.check_provenance(out, None, _provenance(model_b, rows))


def test_results_without_provenance_are_not_resumed(tmp_path):
    rows = {"nq": [_row(i, [f"g{i}"]) for i in range(3)]}
    _run(tmp_path, ScriptedRollout(), rows)  # written without provenance (as by an older version)
    with pytest.raises(ev.EvalError, match="unknown model"):
        ev.check_provenance(tmp_path, None, _provenance(tmp_path, rows))


def test_merge_refuses_shards_of_different_evaluations(tmp_path):
    rows = {"nq": [_row(i, [f"g{i}"]) for i in range(4)]}
    for i, retriever in enumerate(("http://a", "http://b")):
        ev.check_provenance(tmp_path, (i, 2), _provenance(tmp_path, rows, retriever=retriever))
        _run(tmp_path, ScriptedRollout(), rows, shard=(i, 2))
    with pytest.raises(ev.EvalError, match="different evaluations"):
        ev.merge_shards(tmp_path)


def test_paper_table_quotes_the_papers_averages_next_to_their_runs(tmp_path):
    """A run of a paper config gets the average docs/design.md quotes for it: found through the evaluation's
    provenance (model RUN/checkpoints/step_N/policy -> RUN/config.yaml's name) or the row label; others get —."""
    import yaml

    seven = {d: 0.4 for d in ev.BENCHMARKS}
    run = tmp_path / "runs" / "paper" / "renamed-run"
    (run / "checkpoints" / "step_001005" / "policy").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"name": "qwen2.5-7b-base_nq-hotpotqa_llds-ma"}))
    by_provenance = tmp_path / "eval-a"
    ev.write_results(by_provenance, _res("mine", {**seven, "nq": 0.54})[1])
    (by_provenance / "trajectories.provenance.json").write_text(
        json.dumps({"model": str(run / "checkpoints" / "step_001005" / "policy")}))
    methods = [("qwen2.5-3b-base_nq-hotpotqa_grpo-1a2b3c-step_001005", _res("x", seven)[1]),
               ("mine", _res("mine", {**seven, "nq": 0.54})[1]),
               ("qwen2.5-3b-base_nq_grpo-9f-step_000050", _res("y", seven)[1])]
    table = ev.paper_table(methods, [None, by_provenance, None])
    assert table["header"][-3:] == ["Avg.", "Gain", "Paper Avg."]
    assert [r[-1] for r in table["rows"]] == ["0.312", "0.462", "—"]  # NQ-only 3B: not quoted
    assert [r[-3] for r in table["rows"]] == ["0.400", "0.420", "0.400"]  # all seven: no † mark
    assert table["rows"][1][-2] == "+5.0%"
    m = table["methods"]
    assert m["mine"]["paper_config"] == "qwen2.5-7b-base_nq-hotpotqa_llds-ma"
    assert m["mine"]["paper_average_em"] == 0.462 and m["qwen2.5-3b-base_nq_grpo-9f-step_000050"]["paper_average_em"] is None
    assert ev.paper_config("qwen2.5-3b-base_nq-hotpotqa_llds-ma") == "qwen2.5-3b-base_nq-hotpotqa_llds-ma"
    assert ev.paper_config("qwen2.5-3b-base_nq-hotpotqa_llds-1-step_2") is None  # LLDS without MA: not quoted
    # a table without any of the seven benchmarks (the synthetic world) has no paper column
    world = ev.paper_table([("a", _res("a", {"synthetic": 0.5})[1])])
    assert world["header"] == ["Method", "synthetic", "Avg."] and not world["notes"]


def test_data_file_gives_one_benchmark_per_data_source_read_once(tmp_path, monkeypatch):
    """eval.py --data: Search-R1's merged test.parquet (several data_source values) is one benchmark per source; a
    file without data_source is one benchmark named by the file; each file is read once."""
    import importlib.util
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    import searchr1_lld.data.jsonl as jsonl
    from searchr1_lld.evaluation import command

    merged = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": src, "question": f"q{i}", "golden_answers": [f"a{i}"],
         "reward_model": {"style": "rule", "ground_truth": {"target": [f"a{i}"]}},
         "extra_info": {"split": "test", "index": i}}
        for i, src in enumerate(["nq", "bamboogle", "nq", "musique", "bamboogle"])]), merged)
    plain = tmp_path / "mine.jsonl"
    plain.write_text(json.dumps({"id": "x", "question": "q", "golden_answers": ["a"]}) + "\n")
    spec = importlib.util.spec_from_file_location("eval_cli", Path(__file__).resolve().parents[1] / "eval.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    reads = []
    real = jsonl.read_rows
    counting = lambda path: reads.append(str(path)) or real(path)  # noqa: E731
    monkeypatch.setattr(jsonl, "read_rows", counting)
    monkeypatch.setattr("searchr1_lld.evaluation.run.read_rows", counting)
    monkeypatch.setattr("searchr1_lld.evaluation.command.read_rows", counting)
    args = cli.build_parser().parse_args(["--data", str(merged), str(plain), "--out", str(tmp_path / "o")])
    s = command.resolve(command.EvalOptions(**vars(args)))
    assert s.datasets == [f"nq={merged}", f"bamboogle={merged}", f"musique={merged}", f"mine={plain}"]
    rows = ev.load_eval_rows(s.datasets, file_rows=s.file_rows)
    assert {k: [r["id"] for r in v] for k, v in rows.items()} == {
        "nq": ["nq-test-0", "nq-test-2"], "bamboogle": ["bamboogle-test-1", "bamboogle-test-4"],
        "musique": ["musique-test-3"], "mine": ["x"]}
    assert reads == [str(merged), str(plain)]  # once each


class _StreamedBackend:
    """Stands in for a running vLLM engine: records what each load streams into it."""

    def __init__(self):
        self.loads: list[dict] = []

    def load_weights(self, named):
        self.loads.append({n: t.clone() for n, t in named})


def _tiny_checkpoint(path, seed, **config):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(Qwen2Config(**{**cfg, **config}))
    model.save_pretrained(path)
    return model


def test_later_checkpoints_stream_into_the_first_vllm_engine_or_are_refused(tmp_path, monkeypatch):
    """One engine per process: the first checkpoint builds it (make_backend), a later one of the same model is
    streamed into it from its safetensors, one of another shape or tokenizer is refused naming why."""
    import torch

    from searchr1_lld.evaluation import engines

    built = []
    monkeypatch.setattr(engines, "make_backend", lambda cfg, **kw: built.append(kw["model_path"]) or _StreamedBackend())
    vocab = SimpleNamespace(get_vocab=lambda: {"a": 0, "b": 1})
    _tiny_checkpoint(tmp_path / "a", 0)
    b = _tiny_checkpoint(tmp_path / "b", 1)
    _tiny_checkpoint(tmp_path / "wide", 2, hidden_size=32)
    pool = ev.CheckpointEngines(RolloutConfig(backend="vllm"))
    first = pool.backend_for(str(tmp_path / "a"), vocab, "tok")
    assert pool.backend_for(str(tmp_path / "b"), vocab, "tok") is first and built == [str(tmp_path / "a")]
    (streamed,) = first.loads
    assert streamed.keys() == dict(b.named_parameters()).keys()
    assert all(torch.equal(streamed[n], p) for n, p in b.named_parameters())
    with pytest.raises(ev.EvalError, match="config differs from .*a's in hidden_size.*--compare-dirs"):
        pool.backend_for(str(tmp_path / "wide"), vocab, "tok")
    with pytest.raises(ev.EvalError, match="its tokenizer differs"):
        pool.backend_for(str(tmp_path / "b"), SimpleNamespace(get_vocab=lambda: {"a": 0}), "tok")
    hf = ev.CheckpointEngines(RolloutConfig(backend="hf"))  # plain torch models: one each, the previous freed
    hf.backend_for(str(tmp_path / "a"), vocab, "tok")
    hf.backend_for(str(tmp_path / "wide"), vocab, "tok")
    assert built[1:] == [str(tmp_path / "a"), str(tmp_path / "wide")]


def test_fixed_subsample_is_balanced_over_hops_and_the_same_for_every_caller():
    import random

    from searchr1_lld.evaluation import fixed_subsample

    rows = [{"id": f"q{i}", "metadata": {"hops": 1 if i < 6 else 2}} for i in range(10)]
    sub = fixed_subsample(rows, 5)
    assert [r["metadata"]["hops"] for r in sub].count(1) == 3 and len(sub) == 5  # 6/10 and 4/10 of 5: 3 and 2
    assert [r["id"] for r in sub] == [r["id"] for r in rows if r in sub]  # in the rows' order
    shuffled = random.Random(1).sample(rows, len(rows))
    assert {r["id"] for r in fixed_subsample(shuffled, 5)} == {r["id"] for r in sub}  # not by position
    assert fixed_subsample(rows, 0) == rows and fixed_subsample(rows, 99) == rows
    # remainders: 7 of 10 -> 4.2 and 2.8: the larger remainder (two-hop) gets the seventh
    assert [r["metadata"]["hops"] for r in fixed_subsample(rows, 7)].count(2) == 3
    assert len(fixed_subsample([{"id": "a"}, {"id": "b"}, {"id": "c"}], 2)) == 2  # no hops: one group
