"""``grid --fresh DIR``: a committed study's grid reruns every task into DIR and writes the study's report there,
leaving the committed results, docs/ and README.md as they are."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from conftest import REPO_ROOT
from searchr1_lld.config import ConfigError
from searchr1_lab import fresh, grid
from searchr1_lab.comparison.claims import DESIGN_FILE
from searchr1_lab.registered import registration as stepsize

COMPARISON = REPO_ROOT / "docs" / "lab" / "runs"
PREREG = REPO_ROOT / "docs" / "lab" / "prereg" / "runs"
STEPSIZE_REGISTRATION = REPO_ROOT / "docs" / "lab" / "stepsize" / "registration.json"


def _args(fresh_dir, commit=False, demo=False, registration=None) -> argparse.Namespace:
    return argparse.Namespace(fresh=str(fresh_dir) if fresh_dir else None, commit=commit, demo=demo,
                              registration=str(registration) if registration else None)


def test_without_fresh_the_grid_is_what_it_was():
    assert fresh.prepare(_args(None), COMPARISON) is None


def test_a_rerun_trains_and_writes_into_its_own_directory(tmp_path):
    rerun = fresh.prepare(_args(tmp_path / "rerun"), COMPARISON)
    assert (rerun.runs_root, rerun.compact_dir, rerun.report_dir) == (
        tmp_path / "rerun" / "train", tmp_path / "rerun" / "runs", tmp_path / "rerun" / "report")
    assert json.loads((tmp_path / "rerun" / fresh.MARKER).read_text()) == {"reruns": "docs/lab/runs"}
    assert rerun.report_argv() == ["report", "--runs", str(rerun.compact_dir), "--out", str(rerun.report_dir)]
    assert rerun.redirect(None) is None
    reg = {"registration": {"runs_dir": "docs/x/runs", "train_dir": "runs/x", "config": "c.yaml"}, "seeds": [0]}
    assert rerun.redirect(reg) == {"registration": {"runs_dir": str(rerun.compact_dir),
                                                    "train_dir": str(rerun.runs_root), "config": "c.yaml"},
                                   "seeds": [0]}
    assert reg["registration"]["runs_dir"] == "docs/x/runs"  # the registration itself is left as it is
    assert fresh.prepare(_args(tmp_path / "rerun"), COMPARISON) == rerun  # the same command resumes it


def test_a_rerun_writes_the_report_its_study_has(tmp_path):
    prereg = fresh.prepare(_args(tmp_path / "a"), PREREG)
    assert prereg.report_argv()[:3] == ["prereg-report", "--prereg", str(REPO_ROOT / "docs/lab/preregistration.json")]
    stepsize = fresh.prepare(_args(tmp_path / "b", registration=STEPSIZE_REGISTRATION),
                             REPO_ROOT / "docs" / "lab" / "stepsize" / "runs")
    assert stepsize.report_argv() == ["stepsize-report", "--registration", str(STEPSIZE_REGISTRATION), "--runs",
                                      str(tmp_path / "b" / "runs"), "--out", str(tmp_path / "b" / "report")]


@pytest.mark.parametrize("args, where, words", [
    (dict(commit=True), "x", "without --commit"),
    (dict(demo=True), "x", "--demo"),
    ({}, "docs/lab/runs/rerun", "overlaps the committed results"),
    ({}, "docs/lab", "overlaps the committed results"),
])
def test_a_rerun_refuses_what_would_touch_the_committed_study(tmp_path, args, where, words):
    target = tmp_path / where if where == "x" else REPO_ROOT / where
    with pytest.raises(ConfigError, match=words):
        fresh.prepare(_args(target, **args), COMPARISON)
    assert not (REPO_ROOT / "docs" / "lab" / "runs" / "rerun").exists()


def test_one_directory_holds_the_rerun_of_one_study(tmp_path):
    fresh.prepare(_args(tmp_path / "rerun"), COMPARISON)
    with pytest.raises(ConfigError, match="holds a rerun of docs/lab/runs"):
        fresh.prepare(_args(tmp_path / "rerun"), PREREG)


def test_the_report_of_a_rerun_is_the_committed_report_when_the_results_are_the_same(tmp_path):
    """The rerun's report is the study's own: from a copy of the committed results it is the committed summary,
    but for the command that wrote it."""
    rerun = fresh.prepare(_args(tmp_path / "rerun"), COMPARISON)
    shutil.copytree(COMPARISON, rerun.compact_dir)
    assert rerun.finish(["a task"]) == [] and not rerun.report_dir.exists()  # no report of an unfinished rerun
    assert rerun.finish([]) == []
    ours = json.loads((rerun.report_dir / "summary.json").read_text())
    committed = json.loads((REPO_ROOT / "docs" / "lab" / "summary.json").read_text())
    assert ours.pop("command") != committed.pop("command")
    assert ours == committed
    (rerun.compact_dir / "baselines.json.gz").write_bytes(b"not gzip")  # a report that cannot be written fails
    assert rerun.finish([]) == ["report"]


def _planned(monkeypatch, argv: list[str]) -> dict:
    """What ``grid`` with ``argv`` hands to run_tasks (nothing runs) and whether it wrote the rerun's report."""
    seen = {"finished": False}

    def run_tasks(tasks, jobs, log_dir, **kw):
        seen.update(tasks=tasks, log_dir=log_dir, **kw)
        return []

    def finish(self, failed):
        seen["finished"] = True
        return []

    monkeypatch.setattr(grid, "run_tasks", run_tasks)
    monkeypatch.setattr(fresh.Rerun, "finish", finish)
    assert grid.main(["grid", *argv]) == 0
    rebuilt = []  # what a finished task of the grid would rebuild
    monkeypatch.setattr(grid, "rebuild_report", lambda compact_dir, **kw: rebuilt.append(compact_dir) or [])
    for task in seen["tasks"]:
        seen["on_done"](task)
    seen["reports_rebuilt"] = rebuilt
    return seen


def test_the_grid_reruns_a_committed_comparison_into_the_fresh_directory(tmp_path, monkeypatch):
    committed_design = (COMPARISON / DESIGN_FILE).read_text()
    seen = _planned(monkeypatch, [
        "--config", "configs/lab/compare.yaml", "--lrs", "5e-4,1e-3,2e-3", "--seeds", "0,1,2", "--methods",
        "grpo,llds_action", "--runs-dir", "runs/compare", "--compact", "docs/lab/runs", "--jobs", "2",
        "--fresh", str(tmp_path / "rerun")])
    runs, train = tmp_path / "rerun" / "runs", tmp_path / "rerun" / "train"
    assert len(seen["tasks"]) == 19 and not any(t.done.exists() for t in seen["tasks"])  # every task runs again
    assert all(t.done.parent == runs for t in seen["tasks"])
    for t in seen["tasks"]:
        assert t.argv[t.argv.index("--runs-dir") + 1] == str(train)
        assert t.argv[t.argv.index("--compact") + 1] == str(runs)
    assert seen["reports_rebuilt"] == [] and seen["log_dir"] == train / "logs"  # no report into docs/ on the way
    assert seen["finished"] and (runs / DESIGN_FILE).is_file()
    assert (COMPARISON / DESIGN_FILE).read_text() == committed_design


def test_the_grid_reruns_a_registered_study_into_the_fresh_directory(tmp_path, monkeypatch):
    seen = _planned(monkeypatch, ["--registration", str(STEPSIZE_REGISTRATION), "--jobs", "2",
                                  "--fresh", str(tmp_path / "rerun")])
    runs, train = tmp_path / "rerun" / "runs", tmp_path / "rerun" / "train"
    reg = stepsize.load_registration(STEPSIZE_REGISTRATION)
    assert len(seen["tasks"]) == 1 + len(list(stepsize.cells(reg)))  # the baselines and every registered run
    assert all(t.done.parent == runs and not t.done.exists() for t in seen["tasks"])
    for t in seen["tasks"]:
        assert t.argv[t.argv.index("--runs-dir") + 1] == str(train)
        assert t.argv[t.argv.index("--compact") + 1] == str(runs)
    assert seen["reports_rebuilt"] == [] and seen["finished"]
    assert json.loads((runs / DESIGN_FILE).read_text())["registration"] == "docs/lab/stepsize/registration.json"


def test_the_grid_refuses_to_commit_a_rerun(tmp_path, capsys):
    assert grid.main(["grid", "--registration", str(STEPSIZE_REGISTRATION), "--commit",
                      "--fresh", str(tmp_path / "rerun")]) == 2
    assert "without --commit" in capsys.readouterr().err
