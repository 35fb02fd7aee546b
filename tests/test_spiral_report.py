"""The death-spiral calibration's report (searchr1_lab/spiral/report.py): its table says what the signature computes
from the run files, on a hand-made plan and run file; and the committed calibration runs all started after the
signature was fixed, from a clean tree."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO_ROOT
from test_spiral_signature import PARAMS, explosion_from, falling_probe, records, rise_then_fall, spike
from searchr1_lab.compact import read_runs, write_gz_json
from searchr1_lab.spiral.report import read_plans, write_report
from searchr1_lab.spiral.signature import SIGNATURE_FILE, run_series, signature


def hand_made_calibration(tmp_path):
    """A plan ``toy`` of two settings (one with two rates) and two finished runs: one with the whole signature, one
    whose explosion is a 5-step spike."""
    plan_dir = tmp_path / "toy"
    plan_dir.mkdir()
    plan = {"registration": {"status": "exploratory", "title": "toy", "config": "configs/lab/spiral.yaml",
                             "runs_dir": str(plan_dir / "runs"), "train_dir": str(tmp_path / "train"),
                             "report_dir": str(tmp_path), "signature": SIGNATURE_FILE},
            "world": {"config": "configs/world/default.yaml", "hash": "8569a5994574"},
            "seeds": [0],
            "arms": {"grpo_a": {"method": "grpo", "lrs": [1e-4, 3e-4]},
                     "grpo_b": {"method": "grpo", "overrides": ["algorithm.kl_coef=0.0"], "lrs": [1e-4]}}}
    (plan_dir / "plan.json").write_text(json.dumps(plan))
    whole = records(rise_then_fall, falling_probe, explosion_from(110, 0.3), explosion_from(110, 1.0))
    spiked = records(rise_then_fall, falling_probe, spike(110, 5, 0.3, 0.1), spike(110, 5, 1.0, 0.01))
    for arm, recs in (("grpo_a", whole), ("grpo_b", spiked)):
        write_gz_json(plan_dir / "runs" / f"{arm}-lr0.0001-seed0.json.gz",
                      {"method": arm, "lr": 1e-4, "seed": 0, "records": recs})
    return plan_dir


def test_the_table_says_what_the_run_files_compute(tmp_path):
    plan_dir = hand_made_calibration(tmp_path)
    written = write_report(tmp_path, tmp_path / "out")
    text = (tmp_path / "out" / "README.md").read_text()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(r["setting"], r["lr"]) for r in summary["rows"]] == [("grpo_a", 1e-4), ("grpo_b", 1e-4)]
    assert summary["missing"] == ["toy/grpo_a-lr0.0003-seed0"]
    runs, _ = read_runs(plan_dir / "runs")
    for run, row in zip(runs, summary["rows"]):
        assert row["signature"] == json.loads(json.dumps(signature(run_series(run["records"]), PARAMS).to_dict()))
    # by hand: the whole signature on grpo_a; on grpo_b a learning phase and LLD, a 5-step spike and no explosion
    a_line, b_line = (next(line for line in text.splitlines() if f"`{arm}`" in line) for arm in ("grpo_a", "grpo_b"))
    assert a_line.count("**yes**") == 4
    assert "longest 91 steps from 110 (entropy alone 91, gradient norm alone 91)" in a_line
    assert b_line.count("**yes**") == 2 and b_line.endswith("| no |")
    assert "no: longest 5 steps from 110 (entropy alone 5, gradient norm alone 5)" in b_line
    assert "Runs finished: 2 of 3. (a) on 2, (b) on 2, (c) on 1; the whole signature on 1." in text
    assert "Not run yet: `toy/grpo_a-lr0.0003-seed0`." in text
    assert {p.name for p in written} == {"README.md", "summary.json", "toy-grpo_a-lr0.0001.png",
                                         "toy-grpo_b-lr0.0001.png"}


def test_the_command_writes_the_report_of_the_plans_beside_the_one_it_is_given(tmp_path):
    plan_dir = hand_made_calibration(tmp_path)
    out = subprocess.run([sys.executable, "-m", "searchr1_lab", "spiral-report", "--registration",
                          str(plan_dir / "plan.json"), "--readme", "README.md"], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "README.md").is_file() and (tmp_path / "toy-grpo_b-lr0.0001.png").is_file()


def test_every_committed_calibration_run_started_after_the_signature_was_fixed_from_a_clean_tree():
    """Each run's recorded commit holds signature.json as it is today and its plan as it is today, and its tree was
    clean when it started."""
    signature_file = (REPO_ROOT / SIGNATURE_FILE).read_text()
    for name, plan in read_plans(REPO_ROOT / "docs/lab/spiral/calibration").items():
        plan_file = f"docs/lab/spiral/calibration/{name}/plan.json"
        runs, _ = read_runs(REPO_ROOT / plan["registration"]["runs_dir"])
        for run in runs:
            code = run["code"]
            assert code["commit"] and not code["dirty"], f"{name}: {run['method']} lr {run['lr']}: {code}"
            at = lambda path: subprocess.run(["git", "show", f"{code['commit']}:{path}"], cwd=REPO_ROOT,  # noqa: E731
                                             capture_output=True, text=True).stdout
            assert at(SIGNATURE_FILE) == signature_file, f"{run['method']} lr {run['lr']} ran another signature"
            assert at(plan_file) == (REPO_ROOT / plan_file).read_text(), f"{run['method']} ran another plan"


def test_the_committed_report_is_what_the_committed_runs_compute(tmp_path):
    calibration = REPO_ROOT / "docs/lab/spiral/calibration"
    write_report(calibration, tmp_path)
    for name in ("README.md", "summary.json"):
        assert (tmp_path / name).read_text() == (calibration / name).read_text(), (
            f"{name} is stale: python -m searchr1_lab spiral-report")
