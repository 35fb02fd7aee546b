"""The step-size study's registration and the grid it drives: the file's checks, its cells, the arms it makes, the
refusal of a draft, and (once registered) that it precedes every run of its grid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1_lld.config import ConfigError
from searchr1_lab import driver, grid
from conftest import registered_run_violations, stale_report_parts
from searchr1_lab.methods import ARMS, REPO_ROOT
from searchr1_lab.registered import registration as stepsize
from searchr1_lab.studies import current_path


def draft(tmp_path: Path, **changes) -> dict:
    reg = {"registration": {"status": "draft", "config": "configs/lab/stepsize.yaml",
                            "runs_dir": str(tmp_path / "compact"), "train_dir": str(tmp_path / "train"),
                            "report_dir": str(tmp_path / "report")},
           "seeds": [0, 1],
           "arms": {"grpo": {"method": "grpo", "lrs": [2e-3, 1e-3]},
                    "grpo_kl": {"method": "grpo", "label": "GRPO, KL 0.05", "overrides": ["algorithm.kl_coef=0.05"],
                                "lrs": [2e-3]},
                    "llds_action": {"method": "llds_action", "lrs": [2e-3]}}}
    reg.update(changes)
    return reg


def write(tmp_path: Path, reg: dict) -> Path:
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(reg))
    return path


def test_cells_are_seed_by_seed_and_arms_carry_their_overrides(tmp_path):
    reg = draft(tmp_path)
    stepsize.validate(reg)
    assert stepsize.cells(reg) == [("grpo", 2e-3, 0), ("grpo", 1e-3, 0), ("grpo_kl", 2e-3, 0), ("llds_action", 2e-3, 0),
                                   ("grpo", 2e-3, 1), ("grpo", 1e-3, 1), ("grpo_kl", 2e-3, 1), ("llds_action", 2e-3, 1)]
    arm = stepsize.arm_method("grpo_kl", reg["arms"]["grpo_kl"])
    assert arm.key == "grpo_kl" and arm.label == "GRPO, KL 0.05"
    assert arm.overrides == ("algorithm.method=grpo", "algorithm.kl_coef=0.05")
    assert stepsize.arm_method("llds_action", reg["arms"]["llds_action"]) == ARMS["llds_action"]


@pytest.mark.parametrize("change, message", [
    ({"seeds": [0, 0]}, "distinct"),
    ({"arms": {"x": {"method": "ppo_magic", "lrs": [1e-3]}}}, "not one of"),
    ({"arms": {"x": {"method": "grpo", "lrs": []}}}, "positive learning rates"),
    ({"arms": {"x": {"method": "grpo", "lrs": [-1e-3]}}}, "positive learning rates"),
    ({"arms": {"x": {"method": "grpo", "overrides": ["algorithm.no_such_key=1"], "lrs": [1e-3]}}}, "arm 'x'"),
])
def test_a_bad_registration_is_refused_with_what_is_wrong(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        stepsize.validate(draft(tmp_path, **change))


def test_a_missing_key_is_named(tmp_path):
    reg = draft(tmp_path)
    del reg["registration"]["train_dir"]
    with pytest.raises(ConfigError, match="train_dir"):
        stepsize.validate(reg)


def test_the_grid_of_a_draft_does_not_start(tmp_path, capsys):
    path = write(tmp_path, draft(tmp_path))
    assert grid.main(["grid", "--registration", str(path), "--jobs", "1"]) == 2
    assert "status 'draft'" in capsys.readouterr().err
    assert not (tmp_path / "compact").exists()  # no design written, nothing run


def test_an_exploratory_plan_may_run_and_a_draft_may_not(tmp_path):
    reg = draft(tmp_path)
    with pytest.raises(ConfigError, match="status 'draft'"):
        stepsize.check_registered(reg)
    for status in ("exploratory", "registered"):
        reg["registration"]["status"] = status
        stepsize.check_registered(reg)


def test_registered_tasks_name_each_arm_and_its_compact_file(tmp_path):
    reg = draft(tmp_path)
    path = write(tmp_path, reg)
    tasks = grid.registered_tasks(path, reg)
    assert [t.name for t in tasks] == ["baselines", "grpo-lr0.002-seed0", "grpo-lr0.001-seed0", "grpo_kl-lr0.002-seed0",
                                       "llds_action-lr0.002-seed0", "grpo-lr0.002-seed1", "grpo-lr0.001-seed1",
                                       "grpo_kl-lr0.002-seed1", "llds_action-lr0.002-seed1"]
    kl = tasks[3]
    assert kl.done == tmp_path / "compact" / "grpo_kl-lr0.002-seed0.json.gz"
    argv = kl.argv[kl.argv.index("task") + 1:]
    assert argv[:6] == ["--arm", "grpo_kl", "--lr", "0.002", "--seed", "0"]
    assert argv[6:8] == ["--registration", str(path)]


def test_a_task_takes_its_arm_from_the_registration_or_from_method_and_set(tmp_path):
    reg = draft(tmp_path)
    ns = lambda **kw: grid.argparse.Namespace(**{"arm": None, "method": None, "set": [], **kw})  # noqa: E731
    assert grid.task_method(ns(arm="grpo_kl"), reg).overrides[-1] == "algorithm.kl_coef=0.05"
    with pytest.raises(ConfigError, match="registration fixes"):
        grid.task_method(ns(arm="grpo_kl", set=["algorithm.kl_coef=0.5"]), reg)
    with pytest.raises(ConfigError, match="one of"):
        grid.task_method(ns(arm="nope"), reg)
    pilot = grid.task_method(ns(method="grpo", arm="grpo_kl0.01", set=["algorithm.kl_coef=0.01"]), None)
    assert pilot.key == "grpo_kl0.01" and pilot.overrides == ("algorithm.method=grpo", "algorithm.kl_coef=0.01")
    with pytest.raises(ConfigError, match="needs --arm"):
        grid.task_method(ns(method="grpo", set=["algorithm.kl_coef=0.01"]), None)
    assert grid.task_method(ns(method="llds_ma"), None) == ARMS["llds_ma"]


def test_the_report_of_a_registered_runs_dir_is_the_studys(tmp_path, monkeypatch):
    """A result landing in the study's runs dir rebuilds the study's report (not the comparison's in docs/lab)."""
    reg = draft(tmp_path)
    path = write(tmp_path, reg)
    calls = []
    monkeypatch.setattr(grid.subprocess, "run", lambda argv, **kw: calls.append(argv))
    written = grid.rebuild_report(tmp_path / "compact", prereg_path=tmp_path / "none.json",
                                  readme=tmp_path / "README.md", stepsize_path=path)
    assert calls[0][3:7] == ["stepsize-report", "--registration", str(path), "--out"]
    assert Path(calls[0][7]).resolve() == (REPO_ROOT / reg["registration"]["report_dir"]).resolve()
    assert written[1] == REPO_ROOT / reg["registration"]["report_dir"]


def test_the_command_line_names_both_ways_to_run_a_task():
    out = subprocess.run([sys.executable, "-m", "searchr1_lab", "task", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    assert "--registration" in out and "--arm" in out and "--set KEY=VALUE" in out


# ---------------------------------------------------------------------------------------------------------------
# the committed registration
# ---------------------------------------------------------------------------------------------------------------


def test_the_committed_registration_is_valid_and_its_world_is_the_registered_one():
    from searchr1_lab.methods import read_lab_config
    from searchr1_lld.world import load_world_config
    from searchr1_lld.world.build import world_config_hash

    reg = stepsize.load_registration()
    block = reg["registration"]
    _, world_file, _ = read_lab_config(block["config"], [])
    assert world_file == reg["world"]["config"]
    assert world_config_hash(load_world_config(REPO_ROOT / world_file)) == reg["world"]["hash"]
    for path in block["analysis_code"]:  # registered before the experiments moved: each file where it lives now
        assert (REPO_ROOT / current_path(path)).is_file(), path
    assert len(stepsize.cells(reg)) == 45


def test_the_registration_precedes_every_run_of_its_grid():
    assert registered_run_violations(stepsize.STEPSIZE_FILE) == []


def test_the_results_block_and_the_report_are_what_the_committed_runs_compute():
    from searchr1_lab.stepsize.report import REPORT

    assert stale_report_parts(REPORT, stepsize.load_registration()) == []


def test_git_keeps_the_studys_results():
    """The grid commits each result as it lands: git must not ignore the runs dir, the report or the pilot."""
    reg = stepsize.load_registration()
    block = reg["registration"]
    paths = [f"{block['runs_dir']}/grpo-lr0.002-seed0.json.gz", f"{block['report_dir']}/summary.json",
             f"{reg['pilot']['runs_dir']}/grpo-lr0.002-seed100.json.gz"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert ignored == "", f"git ignores {ignored.split()}"


def test_the_grid_commits_a_result_and_names_why_it_cannot(tmp_path, monkeypatch, capsys):
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, capture_output=True, text=True, check=True)  # noqa: E731
    run("init", "-q")
    run("config", "user.email", "t@t")
    run("config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "kept.json").write_text("{}")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "lost.json").write_text("{}")
    driver.commit([tmp_path / "kept.json"], "lab: result of a", tmp_path)
    assert "lab: result of a" in run("log", "--format=%s").stdout
    monkeypatch.setattr(driver.time, "sleep", lambda s: pytest.fail("an ignored path is not retried"))
    driver.commit([tmp_path / "runs" / "lost.json"], "lab: result of b", tmp_path)
    out = capsys.readouterr().out
    assert "could not commit" in out and "ignored" in out and "lab: result of b" not in run("log").stdout


def test_a_registered_study_names_its_report_command(tmp_path):
    """The grid rebuilds a registered study's report with the command its registration names, read as it runs
    today; an unknown command is refused."""
    assert grid.registered_report(draft(tmp_path)) == "stepsize-report"
    for command, report in (("python -m searchr1_lld.lab stepsize-report --readme README.md", "stepsize-report"),
                            ("python -m searchr1_lab frontier-report --readme README.md", "frontier-report")):
        assert grid.registered_report(draft(tmp_path, registration={"analysis_command": command})) == report
    with pytest.raises(ConfigError, match="not one of the lab's registered reports"):
        grid.registered_report(draft(tmp_path, registration={"analysis_command": "python -m searchr1_lab report"}))
    for path in ("docs/lab/stepsize/registration.json", "docs/lab/trustregion/registration.json",
                 "docs/lab/frontier/registration.json"):
        assert grid.registered_report(json.loads((REPO_ROOT / path).read_text())) in grid.REGISTERED_REPORTS
