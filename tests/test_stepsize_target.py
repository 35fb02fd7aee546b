"""The step-size curves from finished runs (the trust-region target, the multipliers of an open-loop replay), and
registrations whose arms run their own seeds."""

from __future__ import annotations

import json

import pytest

from searchr1_lld.config import ConfigError
from searchr1_lab.compact import write_gz_json
from searchr1_lab.registered.registration import cells
from searchr1_lab.cli import main as lab_main
from searchr1_lab.stepsize.target import mean_curve

from test_stepsize_analysis import make_run


def test_mean_curve_by_hand_and_a_step_no_run_logged():
    runs = [make_run("llds_action", 0.002, 0, {0: 0.4}, step_kl=[0.1, 0.3, 0.2]),
            make_run("llds_action", 0.002, 1, {0: 0.4}, step_kl={1: 0.3, 2: float("nan"), 3: 0.4})]
    means, counts = mean_curve(runs, 3)
    assert means == pytest.approx([0.2, 0.3, 0.3]) and counts == [2, 1, 2]
    with pytest.raises(ValueError, match=r"steps \[4\]"):
        mean_curve(runs, 4)


def test_the_command_writes_a_target_file_the_controller_reads(tmp_path):
    from searchr1_lld.learner.step_size import read_curve_file

    for seed, kls in enumerate(([0.1, 0.2], [0.3, 0.4])):
        write_gz_json(tmp_path / f"llds_action-lr0.002-seed{seed}.json.gz",
                      make_run("llds_action", 0.002, seed, {0: 0.4}, step_kl=kls))
    write_gz_json(tmp_path / "grpo-lr0.002-seed0.json.gz", make_run("grpo", 0.002, 0, {0: 0.4}, step_kl=[9, 9]))
    out = tmp_path / "target.json"
    assert lab_main(["step-kl-target", "--runs", str(tmp_path), "--arm", "llds_action", "--lr", "0.002", "--steps",
                     "2", "--out", str(out)]) == 0
    content = json.loads(out.read_text())
    assert content["source"]["seeds"] == [0, 1] and read_curve_file(out, "target_file", 2) == pytest.approx([0.2, 0.3])
    assert lab_main(["step-kl-target", "--runs", str(tmp_path), "--arm", "nll_anchor", "--lr", "0.002", "--steps",
                     "2", "--out", str(out)]) == 2


def test_lr_curve_writes_the_mean_multiplier_per_step_that_a_replay_reads(tmp_path, capsys):
    from searchr1_lld.learner.step_size import read_curve_file

    multipliers = {10: [1.0, 0.5, 0.4, 0.2],
                   11: [1.0, 0.8, 0.6],  # stopped after step 3: not in the mean of step 4
                   12: [1.0, 0.6, float("nan"), 0.3]}  # no value at step 3: not in its mean
    for seed, values in multipliers.items():
        write_gz_json(tmp_path / f"grpo_trust_region-lr0.002-seed{seed}.json.gz",
                      make_run("grpo_trust_region", 0.002, seed, {0: 0.4}, **{"step_size/lr_multiplier": values}))
    for other, lr in (("grpo", 0.002), ("grpo_trust_region", 0.001)):  # another arm, another learning rate
        write_gz_json(tmp_path / f"{other}-lr{lr}-seed10.json.gz",
                      make_run(other, lr, 10, {0: 0.4}, **{"step_size/lr_multiplier": [9.0] * 4}))
    out = tmp_path / "curve.json"
    assert lab_main(["lr-curve", "--runs", str(tmp_path), "--arm", "grpo_trust_region", "--lr", "0.002", "--steps",
                     "4", "--out", str(out)]) == 0
    content = json.loads(out.read_text())
    # step 2: (0.5 + 0.8 + 0.6) / 3 = 0.633333; step 3: (0.4 + 0.6) / 2 = 0.5; step 4: (0.2 + 0.3) / 2 = 0.25
    assert content["lr_multiplier"] == pytest.approx([1.0, 0.633333, 0.5, 0.25], abs=1e-6)
    assert content["runs_per_step"] == [3, 3, 2, 2] and content["source"]["seeds"] == [10, 11, 12]
    assert read_curve_file(out, "multiplier_file", 4) == content["lr_multiplier"]
    assert "from 3 runs (seeds [10, 11, 12]), 2 at the step with fewest" in capsys.readouterr().out
    # a step no run reached: no curve (a replay of it would be a guess)
    assert lab_main(["lr-curve", "--runs", str(tmp_path), "--arm", "grpo_trust_region", "--lr", "0.002", "--steps",
                     "5", "--out", str(out)]) == 2
    assert "no run logged step_size/lr_multiplier at steps [5]" in capsys.readouterr().out


def test_cells_with_an_arm_of_its_own_seeds_run_seed_by_seed():
    reg = {"seeds": [10, 11, 12], "arms": {"a": {"lrs": [0.002]}, "b": {"lrs": [0.002], "seeds": [10, 11]}}}
    assert cells(reg) == [("a", 0.002, 10), ("b", 0.002, 10), ("a", 0.002, 11), ("b", 0.002, 11),
                          ("a", 0.002, 12)]


def test_an_arm_with_repeated_seeds_is_refused(tmp_path):
    from searchr1_lab.registered.registration import validate

    reg = {"registration": {"status": "draft", "config": "configs/lab/stepsize.yaml", "runs_dir": "x",
                            "train_dir": "y"},
           "seeds": [0], "arms": {"grpo": {"method": "grpo", "lrs": [0.002], "seeds": [1, 1]}}}
    with pytest.raises(ConfigError, match="arm 'grpo': seeds must be distinct"):
        validate(reg)
