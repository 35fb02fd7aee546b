"""Sweep: grid parsing and expansion, validation before launch, launch commands, running a grid here through the
driver (one worker per run, resumable), collecting finished runs."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from searchr1_lab import driver, sweep
from searchr1_lld.config import ConfigError, load_config

from conftest import world_args

ABLATION_BASE = Path(__file__).resolve().parents[1] / "configs" / "ablations" / "base.yaml"
TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def test_parse_grid():
    assert sweep.parse_grid("algorithm.llds.lam=0,0.1  algorithm.llds.gate=none,action") == [
        ("algorithm.llds.lam", ["0", "0.1"]), ("algorithm.llds.gate", ["none", "action"])]
    for bad in ("", "a.b", "a.b=", "a.b=1,,2", "a.b=1,1", "a=1 a=2"):
        with pytest.raises(ConfigError):
            sweep.parse_grid(bad)


def test_expand_grid_is_the_cartesian_product_in_order():
    runs = sweep.expand_grid(sweep.parse_grid("algorithm.llds.lam=0,0.1,0.5 algorithm.llds.gate=none,action"), "tiny")
    assert len(runs) == 6
    assert runs[0].overrides == ["algorithm.llds.lam=0", "algorithm.llds.gate=none"]
    assert runs[1].overrides == ["algorithm.llds.lam=0", "algorithm.llds.gate=action"]  # last key fastest
    assert runs[5].name == "tiny-lam=0.5_gate=action"
    assert len({r.name for r in runs}) == 6
    # same leaf under two sections -> full keys in the names keep them distinct
    runs = sweep.expand_grid(sweep.parse_grid("rollout.topk=1,3 eval.topk=1,3"), "x")
    assert len({r.name for r in runs}) == 4 and "rollout.topk=1" in runs[0].name


def test_plan_validates_every_run_and_handles_yaml_words():
    runs = sweep.plan(ABLATION_BASE, "algorithm.llds.ma=off,fixed,adaptive algorithm.llds.lam=0,0.2")
    assert len(runs) == 6
    cfgs = [load_config(ABLATION_BASE, r.overrides) for r in runs]
    assert [c.algorithm.llds.ma for c in cfgs[::2]] == ["off", "fixed", "adaptive"]  # 'off' stays a string
    assert [c.algorithm.llds.lam for c in cfgs[:2]] == [0.0, 0.2]
    assert runs[0].name == "ablation-qwen2.5-3b-base_nq-hotpotqa-ma=off_lam=0"
    with pytest.raises(ConfigError, match="lam=-1.*algorithm.llds.lam"):
        sweep.plan(ABLATION_BASE, "algorithm.llds.lam=0.1,-1")
    with pytest.raises(ConfigError, match="gate"):
        sweep.plan(ABLATION_BASE, "algorithm.llds.gate=action,sometimes")


def test_print_launch(capsys):
    assert sweep.main(["expand", "--base", str(ABLATION_BASE), "--grid", "algorithm.llds.gate=none,response",
                       "--print-launch", "--accelerate-config", "configs/accelerate/zero3.yaml"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    argv = shlex.split(lines[1])
    assert argv[:6] == ["accelerate", "launch", "--config_file", "configs/accelerate/zero3.yaml", "train.py", "--config"]
    assert argv[7:] == ["algorithm.llds.gate=response",
                        "trainer.run_name=ablation-qwen2.5-3b-base_nq-hotpotqa-gate=response"]
    assert sweep.main(["expand", "--base", str(ABLATION_BASE), "--grid", "algorithm.llds.nope=1"]) == 2
    # --jobs and --threads without --local would be ignored: refused
    assert sweep.main(["expand", "--base", str(ABLATION_BASE), "--grid", "algorithm.llds.gate=response",
                       "--print-launch", "--jobs", "2"]) == 2
    assert sweep.main(["expand", "--base", str(ABLATION_BASE), "--grid", "algorithm.llds.gate=response",
                       "--local", "--jobs", "0"]) == 2  # refused before anything runs


def _fake_run(root: Path, name: str, ems: list[float], phases: list[str], final_em: float | None, lam: float):
    run = root / name
    (run / "eval").mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step, (em, ph) in enumerate(zip(ems, phases), start=1):
            f.write(json.dumps({"step": step, "reward/em_mean": em, "phase/name": ph}) + "\n")
    (run / "config.yaml").write_text(f"algorithm:\n  llds:\n    enabled: true\n    lam: {lam}\n    gate: action\n"
                                     f"    ma: 'off'\n")
    if final_em is not None:
        (run / "eval" / "results.json").write_text(json.dumps({"datasets": {}, "average_em": final_em}))
    return run


def test_collect_table_and_figure(tmp_path):
    grpo = _fake_run(tmp_path, "grpo", [0.1, 0.3, 0.4, 0.05], ["healthy", "early_stagnation", "steady_decay",
                                                               "accelerated_collapse"], 0.02, 0.0)
    llds = _fake_run(tmp_path, "llds", [0.1, 0.3, 0.45, 0.5], ["healthy"] * 4, 0.41, 0.2)
    running = _fake_run(tmp_path, "running", [0.1, 0.2], ["healthy", "accelerated_collapse"], None, 0.1)
    trained = _fake_run(tmp_path, "trained", [0.1, 0.2], ["healthy", "healthy"], None, 0.1)
    (trained / "eval.json").write_text(json.dumps({"em_before": 0.1, "em_after": 0.3, "n": 20}))
    rows = sweep.collect([grpo, llds, running, trained], tmp_path / "out")
    by = {r["run"]: r for r in rows}
    assert by["trained"]["final_em"] == 0.3  # the trainer's own eval.json when eval.py has not run
    assert by["grpo"]["collapse_step"] == 4 and by["llds"]["collapse_step"] == "none"
    assert by["running"]["collapse_step"] == 2
    assert (by["grpo"]["final_em"], by["llds"]["final_em"], by["running"]["final_em"]) == (0.02, 0.41, None)
    assert by["grpo"]["peak_train_em"] == 0.4 and by["grpo"]["final_train_em"] == 0.05
    assert by["llds"]["lam"] == 0.2 and by["llds"]["steps"] == 4
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "| grpo | 0.000 | action | off | 4 | 0.020 | 0.050 | 0.400 | 4 |" in md
    assert "| running | 0.100 | action | off | 2 | - |" in md
    assert (tmp_path / "out" / "sweep.csv").read_text().splitlines()[0].startswith("run,lam,gate,ma,steps,final_em")
    png = (tmp_path / "out" / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        sweep.collect([tmp_path / "out"], tmp_path / "out2")


@pytest.mark.slow
def test_local_sweep_trains_each_run_in_a_worker_and_collects(tiny_world, tmp_path, capsys):
    """Two 1-step runs on the tiny world, two worker processes at a time (``sweep task``, which trains with
    searchr1_lld.learner.trainer.train), then the table and figure; the same command again skips both runs."""
    small = ["trainer.total_steps=1", "trainer.train_batch_size=2", "trainer.ppo_mini_batch_size=1", "rollout.n=2",
             "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "rollout.max_obs_length=60",
             "trainer.micro_batch_token_budget=400", "logging.progress_bar=false", "logging.plot_every=0",
             "trainer.probe_every=1", "trainer.probe_size=2", "trainer.eval_limit=2", "trainer.save_every=0",
             "trainer.resume=never", f"trainer.output_dir={tmp_path / 'runs'}", *world_args(tiny_world)]
    out = tmp_path / "sweep"
    argv = ["expand", "--base", str(TINY), "--grid", "algorithm.llds.lam=0,0.2", "--local", "--jobs", "2",
            "--out", str(out), "--set", *small]
    assert sweep.main(argv) == 0
    runs = json.loads((out / "sweep.json").read_text())
    assert [r["run"] for r in runs] == ["tiny-lam=0", "tiny-lam=0.2"]
    assert [r["lam"] for r in runs] == [0.0, 0.2]  # read back from each run's saved config
    for r in runs:
        assert Path(r["run_dir"]).parent == tmp_path / "runs" and r["steps"] == 1
        assert r["final_em"] is not None and r["collapse_step"] in ("none", 1)
        log = (out / "logs" / f"{r['run']}.log").read_text()  # each run's worker: its training, then its marker
        assert log.strip().endswith(str(Path(r["run_dir"]) / sweep.SWEEP_MARKER))
    printed = capsys.readouterr().out
    assert "2 to run, 2 at a time with 1 thread(s) each" in printed and "tiny-lam=0.2" in printed
    assert (out / "sweep.png").is_file()
    markers = {r["run"]: (Path(r["run_dir"]) / sweep.SWEEP_MARKER).stat().st_mtime_ns for r in runs}
    assert sweep.main(argv) == 0  # a rerun: nothing trains again, the table is collected again
    assert "2 of 2 tasks done earlier; 0 to run" in capsys.readouterr().out
    assert {r["run"]: (Path(r["run_dir"]) / sweep.SWEEP_MARKER).stat().st_mtime_ns for r in runs} == markers


FAKE_RUN = ("import json, pathlib, sys; run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True); "
            "(run / 'metrics.jsonl').write_text(json.dumps({'step': 1, 'reward/em_mean': 0.5}) + '\\n'); "
            "(run / 'sweep_run.json').write_text(json.dumps({'name': run.name, 'overrides': []}))")


def test_a_local_sweep_skips_finished_runs_and_names_a_failed_one(tmp_path, monkeypatch, capsys):
    """``--local`` through the driver with stand-in workers: a run whose marker exists is not run again, a failing
    run is named and the others still run and are collected, and the command exits 1."""
    real_tasks = sweep.sweep_tasks

    def stand_in_tasks(*args):
        tasks = real_tasks(*args)
        for t in tasks:
            code = "import sys; print('no luck'); sys.exit(3)" if t.name.endswith("lam=0.1") else FAKE_RUN
            t.argv = [sys.executable, "-c", code, str(t.done.parent)]
        return tasks

    monkeypatch.setattr(sweep, "sweep_tasks", stand_in_tasks)
    monkeypatch.setattr(sweep, "LOCAL_POLL_S", 0.05)
    runs, out = tmp_path / "runs", tmp_path / "sweep"
    finished = _fake_run(runs, "tiny-lam=0", [0.9], ["healthy"], None, 0.0)  # finished by an earlier sweep
    (finished / sweep.SWEEP_MARKER).write_text(json.dumps({"name": "tiny-lam=0", "overrides": []}))
    argv = ["expand", "--base", str(TINY), "--grid", "algorithm.llds.lam=0,0.1,0.2", "--local", "--out", str(out),
            "--set", f"trainer.output_dir={runs}"]
    assert sweep.main(argv) == 1
    captured = capsys.readouterr()
    assert "1 of 3 tasks done earlier; 2 to run" in captured.out
    assert "failed: tiny-lam=0.1" in captured.err and "no luck" in (out / "logs" / "tiny-lam=0.1.log").read_text()
    rows = json.loads((out / "sweep.json").read_text())
    assert [(r["run"], r["final_train_em"]) for r in rows] == [("tiny-lam=0", 0.9), ("tiny-lam=0.2", 0.5)]


def test_each_run_is_a_sweep_task_done_when_its_marker_exists(tmp_path, capsys):
    """The worker command of each run (``sweep task`` with the grid, the run's name and the shared overrides), and
    its done file: the marker in the run's own directory."""
    shared = [f"trainer.output_dir={tmp_path / 'runs'}", "trainer.total_steps=3"]
    runs = sweep.plan(TINY, "algorithm.llds.lam=0,0.2", shared)
    tasks = sweep.sweep_tasks(TINY, "algorithm.llds.lam=0,0.2", runs, shared)
    assert [t.name for t in tasks] == ["tiny-lam=0", "tiny-lam=0.2"]
    assert tasks[1].done == tmp_path / "runs" / "tiny-lam=0.2" / "sweep_run.json"
    assert tasks[1].argv[1:] == ["-m", "searchr1_lab.sweep", "task", "--base", str(TINY), "--grid",
                                 "algorithm.llds.lam=0,0.2", "--run", "tiny-lam=0.2", "--set", *shared]
    assert sweep.main(["task", "--base", str(TINY), "--grid", "algorithm.llds.lam=0,0.2", "--run", "tiny-lam=0.5"]) == 2
    assert "no run 'tiny-lam=0.5'" in capsys.readouterr().err


def test_the_driver_runs_what_is_not_done_in_order_and_goes_on_past_a_failure(tmp_path):
    """One job at a time, in the tasks' order, after what each waits for; a task already done is skipped, a
    failed one (and what waits on it) is named, the rest still run; ``on_done`` sees each task that finished."""
    order = tmp_path / "order.txt"

    def task(name, after=(), fail=False):
        code = ("import sys; sys.exit(1)" if fail else
                f"open({str(order)!r}, 'a').write({name!r} + ' '); open({str(tmp_path / name)!r}, 'w').write('x')")
        return driver.Task(name, [sys.executable, "-c", code], tmp_path / name, after)

    (tmp_path / "done_before").write_text("x")
    tasks = [task("b", after=("a",)), task("done_before", fail=True), task("a"), task("c", fail=True),
             task("d", after=("c",)), task("e")]
    finished = []
    failed = driver.run_tasks(tasks, jobs=1, log_dir=tmp_path / "logs", on_done=lambda t: finished.append(t.name),
                              poll_s=0.01)
    assert failed == ["c", "d"]
    assert order.read_text().split() == finished == ["a", "b", "e"]  # b waited for a; "done_before" never ran
    assert sorted(p.stem for p in (tmp_path / "logs").iterdir()) == ["a", "b", "c", "e"]


def test_a_one_step_run_shows_in_the_sweep_figure(tmp_path, monkeypatch):
    """A run of one step has one point on its reward curve: it is drawn (a marker), not an invisible line."""
    import matplotlib.figure

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    rows = sweep.collect([_fake_run(tmp_path, "one", [0.3], ["healthy"], None, 0.2)], tmp_path / "out")
    assert [tuple(point) for point in rows[0]["train_em_curve"]] == [(1, 0.3)]
    (line,) = drawn[0].axes[1].lines
    assert line.get_marker() not in (None, "", "None") and line.get_markersize() > 0
