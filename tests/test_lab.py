"""The death-spiral lab: method configs, phase/trend analysis on hand-made records, and the quick mode end to end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import searchr1_lab as lab
from searchr1_lld.config import ConfigError
from searchr1_lld.instruments.monitor import PHASES

# ----------------------------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------------------------


def _lab_cfg(path):
    """A lab config's run settings (on a world in .cache/world: the paths are only named, not read)."""
    return lab.lab_config(path, [], ".cache/world")


def _method_configs(config_path, tmp_path, overrides=()):
    return [lab.method_config(config_path, list(overrides), m, s, world_dir=tmp_path / "w", runs_dir=tmp_path / "r")
            for s in (0, 1) for m in lab.METHODS.values()]


def test_quick_lab_is_on_the_demo_world_whose_warm_start_is_shipped():
    """--quick takes minutes on a fresh clone: its world is the default one (what `make demo` builds in
    .cache/world, which the lab then reuses) and the repository ships that world's policy, so building the world
    elsewhere never trains a warm start (ensure_world takes assets/warm-start when its config hash matches)."""
    from searchr1_lld.world import load_world_config, world_config_hash
    from searchr1_lld.world.shipped import shipped_for

    _, world_file, _ = lab.read_lab_config(lab.QUICK_CONFIG, [])
    quick_hash = world_config_hash(load_world_config(world_file))
    (demo_world,) = re.findall(r"^world:.*\n\t.*--config (\S+) --out \.cache/world",
                               (lab.REPO_ROOT / "Makefile").read_text(), re.MULTILINE)
    assert quick_hash == world_config_hash(load_world_config(demo_world))  # what `make demo` built in .cache/world
    assert shipped_for(quick_hash) is not None, f"{world_file}: no policy shipped in assets/warm-start for it"


@pytest.mark.parametrize("config_path", [lab.FULL_CONFIG, lab.QUICK_CONFIG])
def test_methods_differ_only_in_llds_switches(config_path, tmp_path):
    cfgs = _method_configs(config_path, tmp_path, ["trainer.lr=3e-4"])
    lab.check_only_llds_differs(cfgs)  # raises otherwise
    by_name = {c.trainer.run_name: c for c in cfgs}
    grpo, ma = by_name["grpo-seed0"], by_name["llds_ma-seed1"]
    assert grpo.algorithm.llds.enabled is False
    assert (ma.algorithm.llds.enabled, ma.algorithm.llds.gate, ma.algorithm.llds.ma) == (True, "action", "adaptive")
    assert by_name["llds_response-seed0"].algorithm.llds.gate == "response"
    assert by_name["llds_action-seed0"].algorithm.llds.ma == "off"
    assert {c.trainer.lr for c in cfgs} == {3e-4}  # user overrides reach every method
    assert ma.trainer.seed == 1 and ma.trainer.resume == "auto"  # an interrupted run resumes
    assert lab.config_differences(grpo, by_name["grpo-seed1"]) == ["trainer.run_name", "trainer.seed"]


def test_finished_runs_are_reused_only_with_the_same_config(tmp_path):
    """Resumable, splittable lab: a run whose lab_run.json holds exactly this config is finished; any other
    setting (or no record) means it must be trained."""
    cfg = lab.method_config(lab.QUICK_CONFIG, [], lab.METHODS["grpo"], 0, world_dir=tmp_path / "w",
                            runs_dir=tmp_path / "r")
    assert not lab.finished(cfg, tmp_path / "r")
    run_dir = tmp_path / "r" / cfg.trainer.run_name
    run_dir.mkdir(parents=True)
    (run_dir / lab.RUN_RECORD).write_text(json.dumps({"method": "grpo", "seed": 0, "config": cfg.to_dict()}))
    assert lab.finished(cfg, tmp_path / "r")
    other = lab.method_config(lab.QUICK_CONFIG, ["trainer.lr=5e-4"], lab.METHODS["grpo"], 0,
                              world_dir=tmp_path / "w", runs_dir=tmp_path / "r")
    assert not lab.finished(other, tmp_path / "r")


def test_a_run_record_cut_off_while_written_is_named_and_not_reused(tmp_path):
    """lab_run.json is written whole or not at all; a truncated one is named in the error and its run retrained."""
    from searchr1_lab import running
    cfg = lab.method_config(lab.QUICK_CONFIG, [], lab.METHODS["grpo"], 0, world_dir=tmp_path / "w",
                            runs_dir=tmp_path / "r")
    run_dir = tmp_path / "r" / cfg.trainer.run_name
    run_dir.mkdir(parents=True)
    with pytest.raises(ConfigError, match="lab_run.json missing"):
        running.read_run_record(run_dir)
    record = {"method": "grpo", "seed": 0, "config": cfg.to_dict()}
    running.write_run_record(run_dir, record)
    assert running.read_run_record(run_dir) == record
    assert sorted(p.name for p in run_dir.iterdir()) == [lab.RUN_RECORD]  # no temporary file left behind
    (run_dir / lab.RUN_RECORD).write_text(json.dumps(record)[:50])
    with pytest.raises(ConfigError, match="lab_run.json is not JSON"):
        running.read_run_record(run_dir)
    with pytest.raises(ConfigError, match="lab_run.json is not JSON"):
        running.load_run(cfg, tmp_path / "r")
    assert not lab.finished(cfg, tmp_path / "r")


def test_check_rejects_methods_tuned_differently(tmp_path):
    a = lab.method_config(lab.FULL_CONFIG, [], lab.METHODS["grpo"], 0, world_dir=tmp_path, runs_dir=tmp_path)
    b = lab.method_config(lab.FULL_CONFIG, ["trainer.lr=5e-4"], lab.METHODS["llds_action"], 0, world_dir=tmp_path,
                          runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="trainer.lr"):
        lab.check_only_llds_differs([a, b])


def test_lab_config_makes_llds_act():
    """Several updates per rollout batch: logp_new moves away from logp_old, so LLDS is not a no-op."""
    cfg = _lab_cfg(lab.FULL_CONFIG)
    tc = cfg.trainer
    assert tc.ppo_epochs * (tc.train_batch_size * cfg.rollout.n // tc.ppo_mini_batch_size) > 1  # responses


def test_parse_seeds_and_methods():
    assert lab.parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("", "0,0", "a", "-1"):
        with pytest.raises(ConfigError):
            lab.parse_seeds(bad)
    assert [m.key for m in lab.parse_methods("grpo,llds_ma")] == ["grpo", "llds_ma"]
    with pytest.raises(ConfigError):
        lab.parse_methods("grpo,ppo")


# ----------------------------------------------------------------------------------------------------------------
# Analysis on hand-made records
# ----------------------------------------------------------------------------------------------------------------


def test_mean_std_by_hand():
    mu, sd, n = lab.mean_std([0.2, 0.4, float("nan"), None])
    assert (mu, n) == (pytest.approx(0.3), 2)
    assert sd == pytest.approx(math.sqrt(((0.1) ** 2 + (0.1) ** 2) / 1))
    assert lab.mean_std([0.5]) == (0.5, 0.0, 1)
    mu, sd, n = lab.mean_std([])
    assert n == 0 and math.isnan(mu)


def _records(rewards, logps, phases, grad=None):
    grad = grad or [1.0] * len(rewards)
    return [{"step": i + 1, "reward/em_mean": r, "lld/correct_logp_old_per_token": c, "phase/name": p,
             "actor/grad_norm": g, "actor/entropy": 1.0}
            for i, (r, c, p, g) in enumerate(zip(rewards, logps, phases, grad))]


def test_phase_summary_counts_first_steps_and_warnings():
    # reward rises steadily while the correct likelihood falls: the raw rules name steady_decay (and warn) from step 3
    # (min_points = 3); with persistence 2 the detector reports it, and warns, from step 4. phase/name (the trainer's
    # online label) is not read: the phases are recomputed.
    recs = _records([0.1, 0.2, 0.3, 0.4, 0.5], [-1.0, -1.1, -1.2, -1.3, -1.4],
                    ["healthy", "healthy", "steady_decay", "steady_decay", "accelerated_collapse"])
    ph = lab.phase_summary(recs)
    assert ph["persistence"] == 2
    assert ph["first_step"] == {"healthy": 1, "early_stagnation": None, "steady_decay": 4, "accelerated_collapse": None}
    assert ph["steps_in"] == {"healthy": 3, "early_stagnation": 0, "steady_decay": 2, "accelerated_collapse": 0}
    assert ph["final"] == "steady_decay" and ph["collapse_step"] is None
    assert ph["warning_steps"] == [4, 5]
    assert ph["warning"]["outcome"] == "false_alarm"  # alarm raised, and the reward never collapsed


def _collapse_run(n_before, n_after):
    """Reward and likelihood rise then fall, grad norm and entropy explode, reward crashes to 0 for n_after steps."""
    rewards = [0.1 + 0.02 * i for i in range(n_before)] + [0.0] * n_after
    logps = [-0.5 - 0.05 * i for i in range(n_before)] + [-3.0] * n_after
    grad = [1.0] * n_before + [20.0] * n_after
    return _records(rewards, logps, ["healthy"] * (n_before + n_after), grad=grad)


def test_collapse_needs_evidence_proportional_to_the_run():
    # one crashed step at the end of a 3-step run is not enough evidence for a collapse
    short = _collapse_run(2, 1)
    assert lab.phase_summary(short)["collapse_step"] is None
    # the same pattern held for 4 steps in a 24-step run (persistence ceil(0.1 * 24) = 3): collapse, reported after
    # three consecutive collapse steps
    long = _collapse_run(20, 4)
    ph = lab.phase_summary(long)
    assert ph["persistence"] == 3
    assert ph["collapse_step"] == 23  # raw collapse at steps 21, 22, 23
    assert ph["warning"]["collapse_step"] == 22  # reward alone: 2-step mean <= 0.3 x peak from step 22 to the end
    assert lab.lld_verdict(lab.trend_summary(long), ph) == "collapse"
    # the same 24 steps judged as a 60-step run need ceil(0.1 * 60) = 6 steps of evidence: not yet
    assert lab.phase_summary(long, run_steps=60)["collapse_step"] is None


def test_trend_and_verdict():
    recs = _records([0.1, 0.1, 0.1, 0.4, 0.4, 0.4], [-1.0, -0.8, -0.9, -1.5, -1.5, -1.5], ["healthy"] * 6,
                    grad=[1.0, 1.0, 1.0, 2.0, 9.0, 3.0])
    t = lab.trend_summary(recs)
    assert t["reward_start"] == pytest.approx(0.1) and t["reward_end"] == pytest.approx(0.4)
    assert t["correct_logp_start"] == pytest.approx(-0.9) and t["correct_logp_end"] == pytest.approx(-1.5)
    assert t["correct_logp_peak"] == pytest.approx(-0.8) and t["grad_norm_max"] == 9.0
    ph = lab.phase_summary(recs)
    assert lab.lld_verdict(t, ph) == "LLD"
    flat = lab.trend_summary(_records([0.1] * 6, [-1.0] * 6, ["healthy"] * 6))
    assert lab.lld_verdict(flat, lab.phase_summary(_records([0.1] * 6, [-1.0] * 6, ["healthy"] * 6))) == "none"
    # a drop within noise (0.02 nats/token < LLD_MARGIN) is not called LLD
    small = _records([0.1] * 3 + [0.4] * 3, [-0.9] * 3 + [-0.92] * 3, ["healthy"] * 6)
    assert lab.lld_verdict(lab.trend_summary(small), lab.phase_summary(small)) == "none"
    # the probe set's likelihood falling counts too
    t_probe = {**flat, "reward_end": 0.4, "probe_logp_start": -0.3, "probe_logp_end": -0.5}
    assert lab.lld_verdict(t_probe, lab.phase_summary(small)) == "LLD"
    collapsed = lab.phase_summary(_collapse_run(20, 4))
    assert lab.lld_verdict(flat, collapsed) == "collapse"
    # the trainer's online label alone (phase/name) does not make a verdict: the phases are recomputed
    online = lab.phase_summary(_records([0.1] * 3, [-1.0] * 3, ["healthy", "healthy", "accelerated_collapse"]))
    assert lab.lld_verdict(flat, online) == "none"
    # the reward falling to nothing is a collapse even when the detector, which reads the likelihood, stays healthy
    fell = _records([0.4] * 6 + [0.0] * 6, [-1.0] * 12, ["healthy"] * 12)
    fell_phases = lab.phase_summary(fell)
    # step 8: the first whose two-step mean (steps 7-8: 0.0) is at or below 0.3 x the peak 0.4 (step 7: 0.2 is not)
    assert fell_phases["collapse_step"] is None and fell_phases["warning"]["collapse_step"] == 8
    assert lab.lld_verdict(lab.trend_summary(fell), fell_phases) == "collapse"


def test_aggregate_mean_std_per_method():
    runs = [{"method": "grpo", "seed": s, "eval": {"em": em, "em_single_hop": em, "em_multi_hop": 0.0,
                                                   "mean_valid_searches": 1.0}}
            for s, em in ((0, 0.2), (1, 0.4))]
    (row,) = lab.aggregate(runs, [lab.METHODS["grpo"]])
    assert row["seeds"] == [0, 1]
    assert row["em"]["mean"] == pytest.approx(0.3) and row["em"]["std"] == pytest.approx(math.sqrt(0.02))
    assert lab.fmt_ms(row["em"]) == "0.300 ± 0.141"


def test_two_lab_jobs_take_turns_on_the_warm_start(tmp_path):
    """lab.exclusive: a second holder of the lock (another lab job on the same runs dir) waits for the first."""
    import threading
    import time

    lock, events = tmp_path / "runs" / "warm_start.lock", []

    def job(name: str, hold_s: float) -> None:
        with lab.exclusive(lock):
            events.append(f"{name} in")
            time.sleep(hold_s)
            events.append(f"{name} out")

    first = threading.Thread(target=job, args=("a", 0.5))
    first.start()
    while not events:
        time.sleep(0.01)
    second = threading.Thread(target=job, args=("b", 0.0))
    second.start()
    first.join()
    second.join()
    assert events == ["a in", "a out", "b in", "b out"]


def test_held_out_em_curves_by_hand():
    records = [{"step": 1}, {"step": 2, "eval/val_em": 0.3}, {"step": 3, "eval/val_em": float("nan")},
               {"step": 4, "eval/val_em": 0.5}, {"step": 6, "eval/val_em": 0.2}, {"step": 7, "eval/em": 0.9}]
    curve = lab.val_em_curve(records)
    assert curve == [[2, 0.3], [4, 0.5], [6, 0.2]]
    assert lab.curve_summary(curve, 0.3) == {"evaluations": 3, "peak_em": 0.5, "peak_step": 4, "last_em": 0.2,
                                             "last_step": 6, "at_least_warm": 2}
    assert lab.curve_summary([[5, 0.4], [10, 0.4]], None)["peak_step"] == 5  # the first step reaching the peak
    assert lab.curve_summary([], 0.3) == {"evaluations": 0}
    runs = [{"method": "grpo", "seed": 0, "val_em_curve": [[2, 0.2], [4, 0.6]]},
            {"method": "grpo", "seed": 1, "val_em_curve": [[2, 0.4], [4, 0.2], [6, 0.1]]},
            {"method": "llds_action", "seed": 0, "val_em_curve": []}]
    (row,) = lab.aggregate_curves(runs, [lab.METHODS["grpo"], lab.METHODS["llds_action"]])  # no curve: left out
    assert [c["step"] for c in row["cells"]] == [2, 4]  # only steps every seed evaluated
    assert row["cells"][0]["mean"] == pytest.approx(0.3) and row["cells"][0]["std"] == pytest.approx(math.sqrt(0.02))
    assert row["cells"][1]["mean"] == pytest.approx(0.4) and row["cells"][1]["n"] == 2
    assert lab.curve_columns([5, 10, 15]) == [5, 10, 15]
    # 18 steps: the first, then every 2nd
    assert lab.curve_columns(list(range(5, 95, 5))) == [5, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert lab.curve_columns(list(range(1, 22)), at_most=5) == [1, 6, 12, 18, 21]  # the first and the last always
    assert lab.curve_columns(list(range(1, 25)), at_most=5) == [1, 6, 12, 18, 24]


# ----------------------------------------------------------------------------------------------------------------
# Quick mode end to end
# ----------------------------------------------------------------------------------------------------------------

_MS = re.compile(r"^([0-9.]+) ± ([0-9.]+)$")


def _table(md: str, heading: str) -> list[list[str]]:
    """Rows (cells) of the first markdown table after ``heading``."""
    part = md.split(heading, 1)[1]
    rows, started = [], False
    for line in part.splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-:") for c in cells):
                rows.append(cells)
        elif started:
            break
    return rows[1:]  # without the header


@pytest.mark.slow
def test_quick_lab_report_is_consistent(tmp_path, tiny_world, monkeypatch):
    out, runs_dir = tmp_path / "report", tmp_path / "runs"
    rc = lab.main(["--quick", "--out", str(out), "--runs-dir", str(runs_dir), "--world-dir", str(tiny_world)])
    assert rc == 0
    md = (out / "README.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    methods = list(lab.METHODS.values())
    assert [(r["method"], r["seed"]) for r in summary["runs"]] == [(m.key, 0) for m in methods]
    assert summary["config_path"] == "configs/lab/quick.yaml"  # no machine's absolute path in a committed report
    assert set(summary["drawdown_summary"]) == set(summary["warning_summary"])
    assert "Collapse alarm: Runs whose reward collapsed" in md
    assert lab.report.QUICK_NOTE in md  # says what quick mode shows and what it does not

    # every PNG the report names exists and is a PNG
    for name in summary["pngs"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert f"({name})" in md
    # every curve, the optional ones when some run logged them (the gradient norm of updates with signal: none of
    # these 3-step runs may have had a non-zero advantage; validation EM: checked below)
    from searchr1_lab.plots import OPTIONAL_CURVES

    assert {f"{stem}.png" for stem in lab.CURVES if stem not in OPTIONAL_CURVES} | {"overview.png", "val_em.png"} \
        <= set(summary["pngs"]) <= {f"{stem}.png" for stem in lab.CURVES} | {"overview.png"}

    # validation EM during training (quick.yaml: trainer.eval_every=2 of 3 steps): the trainer's evaluations at
    # steps 2 and 3, on the validation split (the test split is scored once, at the end)
    em_curve_rows = {r[0]: r for r in _table(md, "## Validation EM during training")}
    for m in methods:
        rec = next(r for r in summary["runs"] if r["method"] == m.key)
        assert [s for s, _ in rec["val_em_curve"]] == [2, 3]
        row = em_curve_rows[m.label]
        assert [float(_MS.match(c).group(1)) for c in row[1:]] == pytest.approx(
            [em for _, em in rec["val_em_curve"]], abs=5e-3 + 1e-9)

    # EM table: one row per method, values in [0, 1] and equal to the per-run evaluator results
    em_rows = {r[0]: r for r in _table(md, "## Test exact match")}
    assert set(em_rows) == {"warm start (untrained)"} | {m.label for m in methods}
    for m in methods:
        results = json.loads((runs_dir / f"{m.key}-seed0" / "eval" / "results.json").read_text())
        syn = results["datasets"]["synthetic"]
        assert syn["n"] == _lab_cfg(lab.QUICK_CONFIG).eval.limit
        row = em_rows[m.label]
        assert row[1] == "0"
        for cell, key in zip(row[2:5], ("em_single_hop", "em_multi_hop", "em")):
            mean, std = (float(x) for x in _MS.match(cell).groups())
            assert 0.0 <= mean <= 1.0 and std == 0.0  # one seed
            assert mean == pytest.approx(syn[key], abs=5e-4 + 1e-9)  # printed with 3 decimals (0.0625 -> "0.062")
        searches = float(_MS.match(row[5]).group(1))
        assert searches == pytest.approx(syn["mean_valid_searches"], abs=5e-3 + 1e-9)  # printed with 2 decimals (0.125 -> "0.12")
        # the sampled policy's EM (--sampled 4 by default): 4 rollouts per test question, stored in lab_run.json
        stored = json.loads((runs_dir / f"{m.key}-seed0" / "lab_run.json").read_text())["eval_sampled"]
        assert stored["samples"] == 4 and stored["n"] == 4 * syn["n"] and stored["questions"] == syn["n"]
        assert stored["temperature"] == _lab_cfg(lab.QUICK_CONFIG).rollout.temperature
        mean, std = (float(x) for x in _MS.match(row[6]).groups())
        assert mean == pytest.approx(stored["em"], abs=5e-4 + 1e-9) and std == 0.0
    warm_sampled = json.loads((runs_dir / "warm_start" / "sampled.json").read_text())
    assert em_rows["warm start (untrained)"][6] == f"{warm_sampled['em']:.3f}" and warm_sampled["samples"] == 4
    assert summary["sampled"] == 4

    # copy or recall (--train-eval 16 by default with --quick): every policy also evaluated greedily on the first
    # training questions (RUN/eval_train); the table holds the provenance of each evaluation's own trajectories
    n_test = _lab_cfg(lab.QUICK_CONFIG).eval.limit
    n_train = 16
    prov_rows = _table(md, "## Copy or recall")
    assert [r[:2] for r in prov_rows] == [
        ["warm start", f"test ({n_test} q)"], *[[m.label, "test"] for m in methods],
        ["warm start", f"train ({n_train} q)"], *[[m.label, "train"] for m in methods]]
    assert summary["train_eval"] == 16
    for m in methods:
        rec = next(r for r in summary["runs"] if r["method"] == m.key)
        train_res = json.loads((runs_dir / f"{m.key}-seed0" / "eval_train" / "results.json").read_text())
        assert train_res["datasets"]["synthetic"]["n"] == n_train == rec["provenance"]["train"]["n"]
        assert rec["provenance"]["train"]["em"] == pytest.approx(train_res["datasets"]["synthetic"]["em"])
        assert rec["provenance"]["test"]["em"] == pytest.approx(rec["eval"]["em"])
        for split in ("test", "train"):
            prov = rec["provenance"][split]
            assert prov["right_without_gold_rate"] <= prov["em"] + 1e-9  # a subset of the right answers
            row = next(r for r in prov_rows if r[:2] == [m.label, split])
            for cell, key in zip(row[2:], ("em", "gold_retrieved_rate", "answer_copied_rate",
                                           "right_without_gold_rate", "answer_in_passages_rate")):
                if cell != "-":  # NaN (no gold passage retrieved) prints as "-"
                    assert float(_MS.match(cell).group(1)) == pytest.approx(prov[key], abs=5e-4 + 1e-9)

    # phase table: one row per run, matching the phases logged in that run's metrics.jsonl
    phase_rows = {r[0]: r for r in _table(md, "## Phases detected by the monitor")}
    assert set(phase_rows) == {f"{m.key}-seed0" for m in methods}
    for m in methods:
        logged = [json.loads(line) for line in (runs_dir / f"{m.key}-seed0" / "metrics.jsonl").read_text().splitlines()]
        assert len(logged) == _lab_cfg(lab.QUICK_CONFIG).trainer.total_steps
        row = phase_rows[f"{m.key}-seed0"]
        for i, phase in enumerate(PHASES):
            steps = [r["step"] for r in logged if r["phase/name"] == phase]
            first, count = (c.strip() for c in row[1 + i].split("/"))
            assert int(count) == len(steps)
            assert first == (str(steps[0]) if steps else "-")
        assert row[1 + len(PHASES)] == logged[-1]["phase/name"]
        # the collapse alarm: the trainer logs it every step; the report's column is the summary's first alarm step
        assert all(r["phase/drawdown_alarm"] in (0.0, 1.0) for r in logged)
        drawdown = next(r for r in summary["runs"] if r["method"] == m.key)["phases"]["drawdown_steps"]
        assert row[5 + len(PHASES)] == (str(drawdown[0]) if drawdown else "none")

    assert "Experiments tried" not in md  # the report holds what the runs measured, no notes file
    assert "LLDS-MA (action gate, adaptive MA)" in md

    # --report-only rebuilds the same tables from the finished runs without training
    out2 = tmp_path / "report2"
    assert lab.main(["--quick", "--report-only", "--out", str(out2), "--runs-dir", str(runs_dir), "--world-dir",
                     str(tiny_world)]) == 0
    md2 = (out2 / "README.md").read_text()
    for heading in ("## Test exact match", "## Phases detected by the monitor", "## Copy or recall"):
        assert _table(md2, heading) == _table(md, heading)
    # ... also when the world the config names is not built (a recipe edit renames the world dir): the report then
    # reads the world the runs recorded, and says so
    from searchr1_lab import running

    monkeypatch.setattr(running, "resolve_world_dir", lambda cfg, world_dir: tmp_path / "world-not-built")
    assert running.trained_world_dir(runs_dir) == tiny_world
    out3 = tmp_path / "report-trained-world"
    assert lab.main(["--quick", "--report-only", "--out", str(out3), "--runs-dir", str(runs_dir)]) == 0
    md3 = (out3 / "README.md").read_text()
    for heading in ("## Test exact match", "## Copy or recall"):
        assert _table(md3, heading) == _table(md, heading)
    monkeypatch.undo()
    # another sample count: the finished runs are scored again from their last checkpoint (the final policy), which
    # reproduces the in-memory score when the count is the same (one sampling seed for every policy)
    first = {m.key: json.loads((runs_dir / f"{m.key}-seed0" / "lab_run.json").read_text())["eval_sampled"]
             for m in methods}
    assert lab.main(["--quick", "--report-only", "--sampled", "2", "--out", str(out2), "--runs-dir", str(runs_dir),
                     "--world-dir", str(tiny_world)]) == 0
    for m in methods:
        again = json.loads((runs_dir / f"{m.key}-seed0" / "lab_run.json").read_text())["eval_sampled"]
        assert again["samples"] == 2 and again["n"] == 2 * first[m.key]["questions"]
    assert lab.main(["--quick", "--report-only", "--sampled", "4", "--out", str(out2), "--runs-dir", str(runs_dir),
                     "--world-dir", str(tiny_world)]) == 0
    for m in methods:
        again = json.loads((runs_dir / f"{m.key}-seed0" / "lab_run.json").read_text())["eval_sampled"]
        assert again["em"] == first[m.key]["em"] and again["samples"] == 4
    assert lab.main(["--quick", "--report-only", "--sampled", "-1", "--out", str(out2), "--runs-dir", str(runs_dir),
                     "--world-dir", str(tiny_world)]) == 2
    # --extend-from: the finished 3-step runs, copied and trained on to 4 steps; the source is left as it was
    steps = _lab_cfg(lab.QUICK_CONFIG).trainer.total_steps
    longer = tmp_path / "runs-longer"
    with pytest.raises(ConfigError, match="only trainer.total_steps may differ"):
        lab.run_lab(config_path=lab.QUICK_CONFIG, overrides=[f"trainer.total_steps={steps + 1}", "trainer.lr=0.5"],
                    seeds=[0], methods=methods[:1], out_dir=tmp_path / "report-bad", runs_dir=longer,
                    world_dir=str(tiny_world), extend_from=runs_dir)
    before = {m.key: (runs_dir / f"{m.key}-seed0" / "metrics.jsonl").read_text() for m in methods[:2]}
    assert lab.main(["--quick", "--methods", ",".join(m.key for m in methods[:2]), "--sampled", "0", "--out", str(tmp_path / "report4"),
                     "--runs-dir", str(longer), "--extend-from", str(runs_dir), "--world-dir", str(tiny_world),
                     f"trainer.total_steps={steps + 1}"]) == 0
    for m in methods[:2]:
        src_rec = json.loads((runs_dir / f"{m.key}-seed0" / "lab_run.json").read_text())
        new_rec = json.loads((longer / f"{m.key}-seed0" / "lab_run.json").read_text())
        assert src_rec["steps"] == steps and new_rec["steps"] == steps + 1 and new_rec["train_s"] > src_rec["train_s"]
        assert (runs_dir / f"{m.key}-seed0" / "metrics.jsonl").read_text() == before[m.key]  # source untouched
        logged = (longer / f"{m.key}-seed0" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in logged] == list(range(1, steps + 2))
        assert logged[:steps] == before[m.key].splitlines()  # the first steps are the source's, not retrained
        # the longer run's train-split evaluation is its own final policy's, written after the source's (a copy of
        # the source's would keep its modification time)
        assert (longer / f"{m.key}-seed0" / "eval_train" / "results.json").stat().st_mtime > \
            (runs_dir / f"{m.key}-seed0" / "eval_train" / "results.json").stat().st_mtime
    # ... and refuses runs trained with other settings
    with pytest.raises(ConfigError, match="trainer.lr"):
        lab.run_lab(config_path=lab.QUICK_CONFIG, overrides=["trainer.lr=0.5"], seeds=[0], methods=methods,
                    out_dir=tmp_path / "report3", runs_dir=runs_dir, world_dir=str(tiny_world), report_only=True)


def test_repo_relative_keeps_machine_paths_out_of_reports(tmp_path) -> None:
    """Paths inside the repository are written relative to it (a committed report must not name the machine that
    wrote it: the world dir the lab resolves is absolute); paths outside it are kept as given."""
    from searchr1_lab.running import repo_relative

    assert repo_relative(lab.REPO_ROOT / ".cache" / "world-large") == ".cache/world-large"
    assert repo_relative(tmp_path / "world") == str(tmp_path / "world")


def test_lab_grad_norm_panel_is_log_scaled_and_the_others_linear():
    """One gradient-norm spike (695 before clipping, measured on an LLDS-MA run of the lab) must not flatten the
    other runs: the gradient-norm panels (all updates; updates with signal) are drawn on a log axis, every other panel
    on a linear one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from searchr1_lab.plots import LOG_SCALE_CURVES, _panel

    recs = [{"step": s, "actor/grad_norm": g, "reward/em_mean": 0.1 * s} for s, g in ((1, 0.8), (2, 695.0), (3, 1.2))]
    methods = [lab.METHODS["grpo"]]
    fig, (ax_gn, ax_rw) = plt.subplots(1, 2)
    _panel(ax_gn, {("grpo", 0): recs}, methods, "grad_norm", {}, fontsize=8)
    _panel(ax_rw, {("grpo", 0): recs}, methods, "reward", {}, fontsize=8)
    assert LOG_SCALE_CURVES == ("grad_norm", "grad_norm_signal")
    assert ax_gn.get_yscale() == "log" and ax_rw.get_yscale() == "linear"
    assert list(ax_gn.lines[0].get_ydata()) == [0.8, 695.0, 1.2]
    plt.close(fig)


def test_the_lab_runs_and_reports_any_method_by_name(tmp_path, tiny_world):
    """Arms beyond the LLDS comparison train and are reported by name: here DAPO (its dynamic sampling draws more
    prompts from the lab's prompt stream) and NTHR (its hidden-state pass before the updates)."""
    out = tmp_path / "report"
    assert lab.main(["--quick", "--methods", "dapo,nthr", "--sampled", "0", "--out", str(out),
                     "--runs-dir", str(tmp_path / "runs"), "--world-dir", str(tiny_world)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["method"] for r in summary["runs"]] == ["dapo", "nthr"]
    md = (out / "README.md").read_text()
    assert "dapo-seed0" in md and "nthr-seed0" in md
