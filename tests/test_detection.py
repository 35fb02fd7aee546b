"""The pre-registered comparison's held-out collapse label and alarm scoring, on hand-made runs."""

import math

import pytest

from searchr1_lld.instruments.alarms import Alarm
from searchr1_lab.prereg.detection import alarm_outcome, held_out_collapse_step, refuse_collapse_signals, score_alarm


def test_held_out_collapse_needs_the_whole_tail_at_or_below_the_bound():
    warm = 0.5  # bound 0.15
    assert held_out_collapse_step([[5, 0.5], [10, 0.1], [15, 0.12], [20, 0.0]], warm) == 10
    assert held_out_collapse_step([[5, 0.1], [10, 0.4], [15, 0.1], [20, 0.15]], warm) == 15  # recovered once
    assert held_out_collapse_step([[5, 0.5], [10, 0.1], [15, 0.2]], warm) is None  # the last evaluation is above
    assert held_out_collapse_step([[5, 0.5], [10, 0.5], [15, 0.1]], warm) is None  # one evaluation: not persistent
    assert held_out_collapse_step([[5, 0.5], [10, 0.5], [15, 0.1]], warm, persist=1) == 15
    with pytest.raises(ValueError, match="warm start"):
        held_out_collapse_step([[5, 0.0]], 0.0)


def test_an_alarm_reading_a_collapse_signal_is_refused():
    for key in ("eval/val_em", "reward/em_mean"):
        leaky = Alarm("leaky", "drop_below_start", 0.5, {"key": "probe/logp_per_token", "reference_key": key})
        with pytest.raises(ValueError, match="collapse label is computed from"):
            refuse_collapse_signals(leaky)
    fine = Alarm("fine", "drop_below_start", 0.5, {"key": "probe/logp_per_token"})
    assert refuse_collapse_signals(fine) is fine


def _records(probe, grad=None):
    return [{"step": i + 1, "probe/logp_per_token": p, **({"actor/grad_norm": grad[i]} if grad else {})}
            for i, p in enumerate(probe)]


def test_rules_see_only_the_past():
    drop = Alarm("probe_drop", "drop_below_start", 0.5, {"key": "probe/logp_per_token"})
    assert drop.first_step(_records([-1.0, -1.2, -1.6, -1.0])) == 3  # fires at step 3, whatever comes after
    assert drop.first_step(_records([-1.0, -1.2, -1.4])) is None
    assert drop.first_step(_records([math.nan, -1.0, -1.6])) == 3  # NaN values are skipped, the first finite is start
    spike = Alarm("gn", "ratio_over_early", 5.0, {"key": "actor/grad_norm", "early_steps": 2})
    recs = _records([0] * 5, grad=[1.0, 3.0, 9.0, 10.0, 1.0])  # early median 2.0: x5 = 10
    assert spike.first_step(recs) == 4


def test_outcomes():
    assert alarm_outcome(3, 10) == "warned" and alarm_outcome(10, 10) == "late" and alarm_outcome(None, 10) == "missed"
    assert alarm_outcome(3, None) == "false_alarm" and alarm_outcome(None, None) == "quiet"


def test_scoring_within_rate_shows_what_the_rate_hides():
    # at lr 1e-3 every run collapses and every run alarms; at 5e-4 none collapses and every run alarms: overall the
    # alarm looks sensitive, within each rate it separates nothing (specificity 0 where there is anything to tell)
    drop = Alarm("probe_drop", "drop_below_start", 0.5, {"key": "probe/logp_per_token"})
    falling = _records([-1.0, -1.2, -1.8, -2.0, -2.5, -3.0])  # alarm at step 3
    runs = ([{"lr": 1e-3, "records": falling, "collapse_step": 5} for _ in range(3)]
            + [{"lr": 5e-4, "records": falling, "collapse_step": None} for _ in range(2)]
            + [{"lr": 5e-4, "records": _records([-1.0] * 6), "collapse_step": None}])
    s = score_alarm(runs, drop)
    assert s["overall"]["sensitivity"]["value"] == 1.0 and s["overall"]["lead_steps"] == [2, 2, 2]
    assert s["overall"]["specificity"]["k"] == 1 and s["overall"]["specificity"]["n"] == 3
    assert s["by_lr"]["0.001"]["sensitivity"]["k"] == 3 and s["by_lr"]["0.001"]["specificity"]["n"] == 0
    assert s["by_lr"]["0.0005"]["collapsed"] == 0 and s["by_lr"]["0.0005"]["false_alarm"] == 2
    assert s["by_lr"]["0.0005"]["specificity"]["value"] == pytest.approx(1 / 3)
    assert [r["outcome"] for r in s["per_run"]] == ["warned"] * 3 + ["false_alarm"] * 2 + ["quiet"]
