"""A run's held-out utility on hand-made curves: the peak gain and the mean gain per step (trapezoids by hand), for runs
that never learn, that fall, and that rise then collapse; the horizon and the errors."""

from __future__ import annotations

import pytest

from searchr1_lab.stepsize.alarms import HELD_OUT
from searchr1_lab.stepsize.utility import gain_area, peak_gain, run_utility


def _run(curve: dict[int, float], key: str = HELD_OUT) -> list[dict]:
    """Records at every step 0..max with the key only at the steps of ``curve`` (training rows in between)."""
    last = max(curve)
    return [{"step": s, "reward/em_mean": 0.1, **({key: curve[s]} if s in curve else {})} for s in range(last + 1)]


def test_rise_then_collapse_by_hand():
    """v_0 = 0.3; gains 0.1 at 10, 0.2 at 20, -0.2 at 30, -0.3 at 40, held to the horizon 50. Trapezoids:
    [0, 10] (0 + 0.1) / 2 * 10 = 0.5; [10, 20] (0.1 + 0.2) / 2 * 10 = 1.5; [20, 30] (0.2 - 0.2) / 2 * 10 = 0;
    [30, 40] (-0.2 - 0.3) / 2 * 10 = -2.5; flat [40, 50] -0.3 * 10 = -3. Area -3.5, per step -3.5 / 50 = -0.07."""
    records = _run({0: 0.3, 10: 0.4, 20: 0.5, 30: 0.1, 40: 0.0})
    assert peak_gain(records) == pytest.approx(0.2)
    assert gain_area(records, horizon=50) == pytest.approx(-0.07)
    out = run_utility(records, 50)
    assert out == {"v0": 0.3, "peak_gain": pytest.approx(0.2), "peak_step": 20, "gain_area": pytest.approx(-0.07)}


def test_a_rising_run_by_hand():
    """v_0 = 0.2, gains 0.1 at 5 and 0.3 at 15 (the last evaluation is the horizon, no flat tail):
    (0 + 0.1) / 2 * 5 + (0.1 + 0.3) / 2 * 10 = 0.25 + 2 = 2.25; per step 2.25 / 15 = 0.15."""
    records = _run({0: 0.2, 5: 0.3, 15: 0.5})
    assert gain_area(records, horizon=15) == pytest.approx(0.15)
    assert run_utility(records, 15)["peak_step"] == 15


@pytest.mark.parametrize("length", [5, 50, 500])
def test_a_run_that_never_learns_scores_no_gain_whatever_its_length(length):
    flat = _run({s: 0.25 for s in range(0, length + 1, 5)})
    assert peak_gain(flat) == 0.0 and gain_area(flat, horizon=length) == 0.0
    falling = _run({s: 0.25 - 0.2 * s / length for s in range(0, length + 1, 5)})
    assert peak_gain(falling) < 0 and gain_area(falling, horizon=length) < 0
    # a straight fall to -0.2 at the horizon: the mean gain is half of it, however long the run
    assert gain_area(falling, horizon=length) == pytest.approx(-0.1)
    assert run_utility(falling, length)["peak_step"] == 5


def test_only_falls_gives_a_negative_peak():
    records = _run({0: 0.4, 10: 0.35, 20: 0.1})
    assert peak_gain(records) == pytest.approx(-0.05)
    assert run_utility(records, 20)["peak_step"] == 10


def test_the_horizon_bounds_what_is_read():
    """Evaluations after the horizon are not read: the peak at 40 is beyond a horizon of 30; up to 30 the gains are
    0.1 at 10 and 0 at 20, the last held flat to 30: (0.5 + 0.5 + 0) / 30."""
    records = _run({0: 0.3, 10: 0.4, 20: 0.3, 40: 0.9})
    assert peak_gain(records) == pytest.approx(0.6)
    assert peak_gain(records, horizon=30) == pytest.approx(0.1)
    assert gain_area(records, horizon=30) == pytest.approx(1.0 / 30)
    out = run_utility(records, 30)
    assert (out["peak_step"], out["peak_gain"]) == (10, pytest.approx(0.1))


def test_no_later_evaluation_and_errors():
    only_start = _run({0: 0.3, 4: float("nan")})  # a non-finite value is not an evaluation
    assert peak_gain(only_start) is None and gain_area(only_start, horizon=10) is None
    assert run_utility(only_start, 10) == {"v0": 0.3, "peak_gain": None, "peak_step": None, "gain_area": None}
    no_start = [{"step": 0}, {"step": 10, HELD_OUT: 0.2}]
    with pytest.raises(ValueError, match="eval/val_sub_em"):
        peak_gain(no_start)
    with pytest.raises(ValueError, match="eval/val_sub_em"):
        run_utility(no_start, 10)
    with pytest.raises(ValueError, match="horizon"):
        gain_area(_run({0: 0.3, 10: 0.4}), horizon=0)


def test_another_key():
    records = _run({0: 1.0, 10: 3.0}, key="eval/other")
    assert peak_gain(records, key="eval/other") == pytest.approx(2.0)
    # (0 + 2) / 2 * 10 = 10 to step 10, then 2 held flat for 10 steps: 20; (10 + 20) / 20 = 1.5
    assert gain_area(records, "eval/other", horizon=20) == pytest.approx(1.5)
