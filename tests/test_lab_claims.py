"""The comparison's claims from compact results: selection on validation, bootstrap intervals, the detector's
sensitivity and specificity, the README block; the baselines and slices; the grid driver's bookkeeping."""

from __future__ import annotations

import json

import pytest

from searchr1_lld.config import ConfigError
from searchr1_lab import baselines, compact, driver, grid
from searchr1_lab.comparison import claims
from searchr1_lab.comparison.report import write_outputs
from searchr1_lab.methods import ARMS, METHODS, Method

IDS = [f"q{i}" for i in range(10)]
QUESTIONS = [{"id": i, "hops": 1, "family": "f", "subject": f"s{k // 2}", "train_answer": k < 4}
             for k, i in enumerate(IDS)]  # 6 not guessable; 5 subjects of 2 questions each


def _run(method: str, lr: float, seed: int, val_em: float, n_right: int, rewards=None) -> dict:
    rewards = rewards or [0.1, 0.2, 0.3, 0.3, 0.3, 0.3]
    records = [{"step": i + 1, "reward/em_mean": r} for i, r in enumerate(rewards)]
    records[-1]["eval/val_em"] = val_em
    correct = {i: int(k < n_right) for k, i in enumerate(IDS)}
    lab_run = {"steps": len(rewards), "eval": {"em": n_right / len(IDS)}, "train_s": 10.0, "eval_s": 1.0}
    return compact.run_record(METHODS[method], seed, lr, lab_run, records, correct, "h")


def _write(tmp_path, runs, design, with_baselines=True):
    for r in runs:
        compact.write_gz_json(tmp_path / compact.compact_name(r["method"], r["lr"], r["seed"]), r)
    (tmp_path / claims.DESIGN_FILE).write_text(json.dumps(design))
    if with_baselines:
        split = {"questions": QUESTIONS, "correct": {name: {i: int(i == "q0") for i in IDS}
                                                     for name in baselines.BASELINE_NAMES}}
        compact.write_gz_json(tmp_path / compact.BASELINES_FILE, {"world_config": "w.yaml", "world_hash": "h",
                                                                  "world_counts": {}, "splits": {"val": split,
                                                                                                 "test": split}})


DESIGN = {"config": "c.yaml", "methods": ["grpo", "llds_action"], "lrs": [0.001, 0.002], "seeds": [0, 1]}


def test_selection_uses_validation_only_and_the_test_figures_follow_it(tmp_path):
    runs = []
    for seed in (0, 1):
        # grpo: lr 0.001 best on validation although lr 0.002 scores higher on test
        runs += [_run("grpo", 0.001, seed, 0.5, 3), _run("grpo", 0.002, seed, 0.4, 9),
                 _run("llds_action", 0.001, seed, 0.3, 10), _run("llds_action", 0.002, seed, 0.3, 8)]
    _write(tmp_path, runs, DESIGN)
    s = write_outputs(tmp_path, tmp_path / "out")
    assert s["complete"] and s["runs_finished"] == 8
    assert s["selection"]["chosen"]["grpo"]["lr"] == 0.001  # validation, not test
    assert s["selection"]["chosen"]["llds_action"]["lr"] == 0.001  # a tie: the lower rate
    ci = s["test_em_ci"]["grpo"]
    assert ci["all"]["mean"] == pytest.approx(0.3) and ci["per_seed"] == {"0": 0.3, "1": 0.3}
    assert ci["not_guessable"]["mean"] == 0.0  # the three right answers are guessable questions
    llds = s["test_em_ci"]["llds_action"]["all"]
    assert (llds["mean"], llds["lo"], llds["hi"]) == (1.0, 1.0, 1.0)  # every question right on every seed
    diff = s["difference"]
    assert (diff["of"], diff["minus"]) == ("llds_action", "grpo")
    assert diff["all"]["mean"] == pytest.approx(0.7) and diff["all"]["lo"] <= 0.7 <= diff["all"]["hi"]
    assert s["baselines"]["majority"] == {"all": 0.1, "not_guessable": 0.0}
    assert s["stable_lrs"] == {"grpo": [0.001, 0.002], "llds_action": [0.001, 0.002]}
    block = claims.readme_block(s)
    assert "0.001 (0.500)" in block and "pending" not in block
    assert ("LLDS (action gate) scores higher on test than GRPO at matched tuning, and both are stable at the same "
            "learning rates (0.001, 0.002)") in block
    s["difference"]["all"]["lo"], s["stable_lrs"]["grpo"] = -0.1, [0.001]
    assert claims.reading(s) == ("Reading: at matched tuning this design detects no test-EM difference between LLDS "
                                 "(action gate) and GRPO; stable learning rates: LLDS (action gate) 0.001, 0.002, GRPO "
                                 "0.001.")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["runs_finished"] == 8
    report = (tmp_path / "out" / "README.md").read_text()
    assert "## Every run" in report and "](curves.png)" in report
    assert (tmp_path / "out" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unfinished_grid_claims_no_test_figure_and_the_readme_block_round_trips(tmp_path):
    _write(tmp_path, [_run("grpo", 0.001, 0, 0.5, 3)], DESIGN, with_baselines=False)
    s = claims.build_summary(tmp_path)
    assert not s["complete"] and s["runs_planned"] == 8
    block = claims.readme_block(s)
    assert "1 of 8 runs finished" in block and "pending" in block and "test EM [" not in block
    text = f"intro\n{claims.README_BEGIN}\nold\n{claims.README_END}\ntail\n"
    new = claims.replace_readme_block(text, block)
    assert claims.readme_block_of(new) == block and new.startswith("intro\n") and new.endswith("tail\n")
    with pytest.raises(ValueError):
        claims.replace_readme_block("no markers", block)


def test_a_reward_collapse_makes_a_learning_rate_unstable(tmp_path):
    crash = [0.1, 0.3, 0.5, 0.5, 0.5, 0.05, 0.0, 0.0, 0.0, 0.0]  # two-step mean <= 0.3 x peak from step 7 on
    _write(tmp_path, [_run("grpo", 0.001, 0, 0.5, 3), _run("grpo", 0.002, 0, 0.1, 0, rewards=crash)],
           {**DESIGN, "methods": ["grpo"], "seeds": [0]})
    s = claims.build_summary(tmp_path)
    assert [r["reward_collapse_step"] for r in s["runs"]] == [None, 7]
    assert s["runs"][1]["verdict"] == "collapse"
    assert s["stable_lrs"]["grpo"] == [0.001]
    assert s["selection"]["grid"]["grpo"][1]["reward_collapsed"] == 1


def test_detector_sensitivity_specificity_and_lead_times_by_hand():
    def run(collapse, **alarms):
        return {"reward_collapse_step": collapse, "alarms": {a: alarms.get(a) for a in claims.ALARMS}}

    runs = [run(30, early_warning=10, collapse_alarm=30),  # warned 20 ahead; collapse alarm at the collapse: late
            run(40, early_warning=45, steady_decay=20),  # early warning after the collapse
            run(None, early_warning=5),  # a false alarm
            run(None), run(None, steady_decay=12)]
    d = claims.detector_claims(runs)
    assert (d["collapsed_runs"], d["runs_without_collapse"]) == (2, 3)
    assert d["early_warning"] == {"sensitivity": 0.5, "warned": 1, "specificity": 2 / 3, "false_alarms": 1,
                                  "lead_steps": [20]}
    assert d["steady_decay"]["lead_steps"] == [20] and d["steady_decay"]["specificity"] == 2 / 3
    assert d["collapse_alarm"]["sensitivity"] == 0.0 and d["collapse_alarm"]["specificity"] == 1.0
    assert claims.detector_claims([run(None)])["early_warning"]["sensitivity"] is None


def test_majority_baseline_and_slices_by_hand():
    train = [{"golden_answers": [a], "metadata": {"family": f}} for f, a in
             (("river", "Sel River"), ("river", "Sel River"), ("river", "Dor River"), ("year", "1801"))]
    rows = [{"id": "a", "golden_answers": ["Sel River", "Sel"], "metadata": {"family": "river"}},
            {"id": "b", "golden_answers": ["Kam River"], "metadata": {"family": "river"}},
            {"id": "c", "golden_answers": ["1900"], "metadata": {"family": "occupation"}}]
    assert baselines.majority_answers(train) == {"river": "Sel River", "year": "1801"}
    assert baselines.majority_correct(rows, train) == {"a": 1, "b": 0, "c": 0}
    questions = [{"id": "a", "train_answer": True}, {"id": "b", "train_answer": False},
                 {"id": "c", "train_answer": False}]
    assert baselines.slice_em({"a": 1, "b": 1, "c": 0}, questions) == {"all": 2 / 3, "not_guessable": 0.5}
    assert baselines.NoRetrieval().search(["x", "y"], topk=3) == [[], []]


def test_compact_files_are_byte_stable_and_the_grid_skips_finished_tasks(tmp_path):
    rec = _run("grpo", 0.001, 0, 0.5, 3)
    compact.write_gz_json(tmp_path / "a.json.gz", rec)
    compact.write_gz_json(tmp_path / "b.json.gz", rec)
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    assert compact.read_gz_json(tmp_path / "a.json.gz") == rec
    assert compact.compact_name("grpo", 5e-4, 2) == "grpo-lr0.0005-seed2.json.gz"
    tasks = grid.lab_tasks("c.yaml", [1e-3], [0, 1], ["grpo"], tmp_path / "runs", tmp_path / "compact")
    assert [t.name for t in tasks] == ["baselines", "grpo-lr0.001-seed0", "grpo-lr0.001-seed1"]
    for t in tasks:
        t.done.parent.mkdir(parents=True, exist_ok=True)
        t.done.write_text("x")
    assert driver.run_tasks(tasks, jobs=2, log_dir=tmp_path / "logs", poll_s=0) == []  # nothing left to run
    grid.write_design(tmp_path / "compact", DESIGN)
    with pytest.raises(ConfigError, match="another design"):
        grid.write_design(tmp_path / "compact", {**DESIGN, "seeds": [0]})
    with pytest.raises(ConfigError):
        grid.parse_lrs("1e-3,0.001")
    demo = grid.demo_tasks([1e-3, 2e-3], tmp_path / "demo")
    assert [t.name for t in demo] == ["demo-select-lr0.001", "demo-select-lr0.002", "demo"]
    assert demo[-1].after == ("demo-select-lr0.001", "demo-select-lr0.002")
    assert [t.name for t in driver.interleave(tasks, demo)] == [
        "baselines", "demo-select-lr0.001", "grpo-lr0.001-seed0", "demo-select-lr0.002", "grpo-lr0.001-seed1", "demo"]


def test_run_tasks_runs_dependencies_first_and_reports_failures(tmp_path, capsys):
    import sys

    def task(name, after=(), fail=False):
        code = "import sys; sys.exit(1)" if fail else f"open({str(tmp_path / name)!r}, 'w').write('x')"
        return driver.Task(name, [sys.executable, "-c", code], tmp_path / name, after)

    tasks = [task("b", after=("a",)), task("a"), task("c", fail=True), task("d", after=("c",))]
    failed = driver.run_tasks(tasks, jobs=2, log_dir=tmp_path / "logs", poll_s=0.05)
    assert sorted(failed) == ["c", "d"] and (tmp_path / "a").is_file() and (tmp_path / "b").is_file()
    out = capsys.readouterr().out
    assert "c: FAILED (1); " in out and "2 of 4 tasks done" in out and " left" in out  # a time left once one is done


def test_each_worker_runs_the_threads_it_is_given(tmp_path, monkeypatch):
    """Every worker sees its thread count in OMP/MKL/OpenBLAS_NUM_THREADS: given, or the cores shared out."""
    import sys

    monkeypatch.setattr(driver, "usable_cores", lambda: 2)
    assert driver.threads_per_job(2) == 1 and driver.threads_per_job(1) == 2 and driver.threads_per_job(3) == 1
    assert driver.threads_per_job(2, threads=3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    code = ("import os, sys; open(sys.argv[1], 'w').write(','.join(os.environ[k] for k in "
            "('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')))")
    tasks = [driver.Task(n, [sys.executable, "-c", code, str(tmp_path / n)], tmp_path / n, ()) for n in ("a", "b")]
    assert driver.run_tasks(tasks, jobs=2, log_dir=tmp_path / "logs", poll_s=0.05) == []
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text() == "1,1,1"
    (tmp_path / "a").unlink()
    assert driver.run_tasks(tasks[:1], jobs=1, log_dir=tmp_path / "logs", poll_s=0.05) == []
    assert (tmp_path / "a").read_text() == "2,2,2"


@pytest.mark.slow
def test_grid_tasks_end_to_end_on_the_test_world(tmp_path, tiny_world):
    """The baselines and one run of the quick lab on the test world, their compact results, and the report."""
    from searchr1_lab.methods import QUICK_CONFIG

    runs_root, compact_dir = tmp_path / "runs", tmp_path / "compact"
    config = tmp_path / "quick-all.yaml"  # the quick lab, every test question (baselines and runs on the same ones)
    config.write_text(f"_base_: {QUICK_CONFIG}\neval:\n  limit: 0\n")
    base = grid.run_baselines(str(config), runs_root, compact_dir, str(tiny_world))
    path = grid.run_task(str(config), 1e-3, ARMS["grpo"], 0, runs_root, compact_dir, str(tiny_world))
    assert path == compact_dir / "grpo-lr0.001-seed0.json.gz"
    rec, b = compact.read_gz_json(path), compact.read_gz_json(base)
    test_ids = {q["id"] for q in b["splits"]["test"]["questions"]}
    assert set(rec["test"]["correct"]) == test_ids
    assert rec["test"]["em"] == pytest.approx(sum(rec["test"]["correct"].values()) / len(test_ids))
    assert [r["step"] for r in rec["records"] if "eval/val_em" in r] == [2, 3]  # the curve is validation
    assert set(b["splits"]["val"]["questions"][0]) == {"id", "hops", "family", "subject", "train_answer"}
    assert not {q["id"] for q in b["splits"]["val"]["questions"]} & test_ids
    assert grid.run_task(str(config), 1e-3, ARMS["grpo"], 0, runs_root, compact_dir, str(tiny_world)) == path
    # an arm that is no method preset (a registration's control: a preset plus its overrides) trains and reports too
    control = Method("grpo_kl", "GRPO, KL 0.01", (*ARMS["grpo"].overrides, "algorithm.kl_coef=0.01"))
    kl = compact.read_gz_json(grid.run_task(str(config), 1e-3, control, 0, runs_root, compact_dir, str(tiny_world)))
    assert (kl["method"], kl["overrides"][-1]) == ("grpo_kl", "algorithm.kl_coef=0.01")
    assert dict(kl["settings"])["algorithm.kl_coef"] == 0.01 and (compact_dir / "grpo_kl-lr0.001-seed0.json.gz").is_file()
    (compact_dir / "grpo_kl-lr0.001-seed0.json.gz").unlink()  # the comparison below is of its design's arms only
    grid.write_design(compact_dir, {"config": "quick", "methods": ["grpo"], "lrs": [1e-3], "seeds": [0]})
    s = write_outputs(compact_dir, tmp_path / "out")
    assert s["complete"] and s["selection"]["chosen"]["grpo"]["lr"] == 1e-3
    assert s["runs"][0]["test_em"] == rec["test"]["em"]
    assert set(s["baselines"]) == set(baselines.BASELINE_NAMES)


def test_the_driver_estimates_the_time_left_from_the_tasks_finished():
    """Pending tasks at the mean duration, running ones for what is left of it, over the job slots."""
    assert driver.time_left([], pending=3, running_elapsed=[], jobs=2) is None
    # mean 100 s: 3 pending (300 s) + one running for 40 s (60 s left) + one past the mean (0) over 2 slots
    assert driver.time_left([50.0, 150.0], pending=3, running_elapsed=[40.0, 130.0], jobs=2) == 180.0
    assert driver._progress(12, 52, None) == "12 of 52 tasks done"
    assert driver._progress(12, 52, 180.0) == "12 of 52 tasks done, about 3 min left"
    assert driver._progress(12, 52, 4 * 3600.0) == "12 of 52 tasks done, about 4.0 h left"


def test_a_result_that_an_earlier_commit_already_took_is_left_without_retrying(tmp_path, capsys, monkeypatch):
    """Two tasks that end together: the first one's commit of the report directory holds both results, so the
    second finds nothing new, says so and returns at once (no retries, no failure)."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@t")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.json").write_text("a")
    (runs / "b.json").write_text("b")
    monkeypatch.setattr(driver.time, "sleep", lambda s: pytest.fail("a commit with nothing new must not be retried"))
    driver.commit([runs], "result of a", tmp_path)
    driver.commit([runs / "b.json", runs], "result of b", tmp_path)
    log = subprocess.run(["git", "log", "--format=%s"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert log.split("\n")[:-1] == ["result of a"]
    out = capsys.readouterr().out
    assert "nothing new to commit for 'result of b'" in out and "could not commit" not in out
    (runs / "b.json").write_text("b, rerun")
    driver.commit([runs / "b.json"], "result of b", tmp_path)
    log = subprocess.run(["git", "log", "--format=%s"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert log.split("\n")[:-1] == ["result of b", "result of a"]
