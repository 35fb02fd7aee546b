"""How far runs moved before they collapsed (the step-size study's exploratory endpoint), by hand."""

from __future__ import annotations

import json
import math

import pytest

from searchr1_lab.cli import main as lab_main
from searchr1_lab.compact import read_runs
from searchr1_lab.stepsize import report
from searchr1_lab.stepsize.movement import compared_pairs, movement, movement_sensitivity, movement_study
from test_stepsize_report import registration, write_grid

RECORDS = [{"step": 0, "eval/val_sub_em": 0.4},
           {"step": 1, "lld/step_kl": 0.04, "probe/initial_logp_per_token": -0.1, "probe/logp_per_token": -0.1},
           {"step": 2, "lld/step_kl": 0.09, "probe/logp_per_token": -0.3},
           {"step": 3, "lld/step_kl": -0.01, "probe/logp_per_token": -0.6},  # float noise below 0 counts as 0
           {"step": 4, "lld/step_kl": 0.16}]  # no probe at step 4: its last value before stands


def test_movement_by_hand():
    assert movement(RECORDS, 2, "kl") == pytest.approx(0.04 + 0.09)
    assert movement(RECORDS, 4, "kl") == pytest.approx(0.04 + 0.09 + 0.0 + 0.16)
    assert movement(RECORDS, 2, "sqrt_kl") == pytest.approx(0.2 + 0.3)
    assert movement(RECORDS, 4, "sqrt_kl") == pytest.approx(0.2 + 0.3 + 0.0 + 0.4)
    assert movement(RECORDS, 2, "probe_drop") == pytest.approx(0.2)
    assert movement(RECORDS, 4, "probe_drop") == pytest.approx(0.5)
    assert math.isnan(movement(RECORDS[:1], 3, "kl")) and math.isnan(movement(RECORDS[:1], 3, "probe_drop"))
    # many small steps make a longer path than one large step of the same summed KL
    small = [{"step": s, "lld/step_kl": 0.01} for s in range(1, 5)]
    large = [{"step": 1, "lld/step_kl": 0.04}]
    assert movement(small, 4, "kl") == pytest.approx(movement(large, 4, "kl"))
    assert movement(small, 4, "sqrt_kl") == pytest.approx(2 * movement(large, 4, "sqrt_kl"))


def test_each_registered_comparison_is_read_once_with_the_movement_to_collapse(tmp_path):
    write_grid(tmp_path)
    reg = registration(tmp_path)
    runs, _ = read_runs(tmp_path / "runs")
    # H2's baseline is H1's pair: read once, under H1
    assert [(p["hypothesis"], p["control"], p["control_lr"]) for p in compared_pairs(runs, reg)] == [
        ("H1", "grpo", 0.002), ("H2", "grpo_lr_matched", 0.0015), ("H2", "grpo_kl_matched", 0.002)]
    study = movement_study(runs, reg, measures=("kl",))
    h1 = study[0]["measures"]["kl"]
    # GRPO collapses at step 4 with step KL 0.20/0.21/0.22 (seeds 0-2); LLDS never does: censored at step 12 with
    # 0.10/0.11/0.12 a step, a lower bound on its movement
    assert h1["control"]["values"] == pytest.approx([0.8, 0.84, 0.88])
    assert h1["treatment"]["values"] == pytest.approx([1.2, 1.32, 1.44])
    assert (h1["treatment"]["censored"], h1["control"]["censored"]) == (3, 0)
    assert (h1["mean_treatment"], h1["mean_control"]) == pytest.approx((1.32, 0.84))
    diff = h1["difference"]
    assert diff["estimate"] == pytest.approx(0.48) and 0 < diff["low"] <= 0.48 <= diff["high"]
    rows = movement_sensitivity(runs, reg, "kl")
    assert [(r["ratio"], r["persist"]) for r in rows[0]["labels"]] == [(0.3, 1), (0.3, 2), (0.5, 1), (0.5, 2)]
    # under a one-evaluation label LLDS "collapses" at its dip (step 4): 0.4/0.44/0.48, now below GRPO's
    assert rows[0]["labels"][0]["estimate"] == pytest.approx(0.44 - 0.84)


def test_the_report_shows_the_movement_apart_as_not_registered(tmp_path):
    path = write_grid(tmp_path)
    assert lab_main(["stepsize-report", "--registration", str(path)]) == 0
    out = tmp_path / "report"
    s = json.loads((out / "summary.json").read_text())
    assert len(s["exploratory_movement"]["primary"]) == 3
    assert set(s["exploratory_movement"]["sensitivity"]) == {"kl", "sqrt_kl", "probe_drop"}
    text = (out / "README.md").read_text()
    section = text.index("## How far the runs moved before they collapsed (exploratory, not registered)")
    window = text.index("## Step size over the registered window")
    assert text.index("## The label's sensitivity (registered)") < section < window
    assert "| H1: llds_action (0.002) vs grpo (0.002) | summed step KL | 1.32 | 0.84 | +0.48 [" in text
    cells = {(c["arm"], c["lr"]): c for c in s["exploratory_movement"]["cells"]}
    assert cells[("grpo", 0.002)]["kl"] == pytest.approx({"mean": 0.84, "min": 0.8, "max": 0.88})
    assert (cells[("llds_action", 0.002)]["runs"], cells[("llds_action", 0.002)]["censored"]) == (3, 3)
    assert "| llds_action | 0.002 | 3 (3) | 1.32 (1.20-1.44) |" in text
    assert (out / "movement.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "moved" not in report.readme_block(s, json.loads(path.read_text()))
