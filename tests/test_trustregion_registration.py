"""The trust-region study's committed registration: valid, on the registered world, its control's target file the
one it names; it precedes every run of its grid; its README block and report are what the committed runs compute."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO_ROOT, registered_run_violations, stale_report_parts
from searchr1_lab.registered import registration as stepsize
from searchr1_lab.studies import current_path

TRUSTREGION_FILE = "docs/lab/trustregion/registration.json"


@pytest.fixture(scope="module")
def reg():
    return stepsize.load_registration(REPO_ROOT / TRUSTREGION_FILE)


def test_the_registration_is_valid_on_the_registered_world(reg):
    from searchr1_lab.methods import read_lab_config
    from searchr1_lld.learner.step_size import read_curve_file
    from searchr1_lld.world import load_world_config
    from searchr1_lld.world.build import world_config_hash

    block = reg["registration"]
    values, world_file, _ = read_lab_config(block["config"], [])
    assert world_file == reg["world"]["config"]
    assert world_config_hash(load_world_config(REPO_ROOT / world_file)) == reg["world"]["hash"]
    for path in block["analysis_code"]:  # registered before the experiments moved: each file where it lives now
        assert (REPO_ROOT / current_path(path)).is_file(), path
    assert len(stepsize.cells(reg)) == 25
    control = dict(item.split("=", 1) for item in reg["arms"]["grpo_trust_region"]["overrides"])
    targets = read_curve_file(REPO_ROOT / control["trainer.step_size.target_file"], "target_file",
                              values["trainer"]["total_steps"])
    assert len(targets) == reg["label"]["horizon"]
    # the step-size window starts after the warm-up: 10 % of 75 steps x 8 updates = 60 updates, steps 1-8
    from searchr1_lab.stepsize.readings import warmup_steps

    assert reg["step_size"]["first"] == warmup_steps(values["trainer"]["warmup_ratio"],
                                                     values["trainer"]["total_steps"]) + 1


def test_the_registration_precedes_every_run_of_its_grid():
    assert registered_run_violations(TRUSTREGION_FILE) == []


def test_the_readme_block_and_the_report_are_what_the_committed_runs_compute(reg):
    from searchr1_lab.stepsize.report import REPORT

    assert stale_report_parts(REPORT, reg) == []


def test_git_keeps_the_studys_results(reg):
    block = reg["registration"]
    paths = [f"{block['runs_dir']}/grpo-lr0.002-seed10.json.gz", f"{block['report_dir']}/summary.json",
             reg["pilot"]["file"]]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert ignored == "", f"git ignores {ignored.split()}"
