"""What one run was worth on the held-out set: how far its held-out EM rose above where it started, at best and on
average over the run (pure: a run's compact records in, numbers out).

A run's records (:func:`searchr1_lab.compact.read_runs`) are dicts with ``step`` and, at the evaluated steps, the
held-out EM ``eval/val_sub_em`` (:data:`~searchr1_lab.stepsize.alarms.HELD_OUT`). With ``v_0`` the step-0 value
and ``(s_i, v_i)`` the evaluated points with ``0 < s_i <= horizon`` in step order, the gain curve is
``g(s) = v(s) - v_0`` (``g(0) = 0``):

- ``peak_gain = max_i g(s_i)``: the best the run reached, whenever it reached it; negative for a run that only fell;
- ``gain_area = (1 / horizon) integral_0^horizon g(s) ds``: the trapezoid rule over ``(0, 0), (s_1, g_1), ...``, the
  last value held flat from the last evaluation to the horizon; the mean gain per step over the run, in EM units.
  A run that rises and then collapses scores its peak but pays for the steps it spent below its start.

Both are in the unit of the key (EM, a share of questions). A run that never rises above its start has
``peak_gain <= 0`` and ``gain_area <= 0`` however long it ran.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stepsize.alarms import HELD_OUT

Records = Sequence[Mapping[str, Any]]


def _gain_curve(records: Records, key: str, horizon: float | None) -> tuple[float, list[tuple[int, float]]]:
    """``(v_0, [(s_i, g_i)])``: the step-0 value of ``key`` and the gains ``g_i = v_i - v_0`` at the evaluated steps
    ``0 < s_i <= horizon`` (every later step when ``horizon`` is None), in step order. Non-finite values are not
    evaluations. ValueError naming ``key`` when the run has no finite step-0 value."""
    start = [float(r[key]) for r in records if int(r["step"]) == 0 and finite(r.get(key))]
    if not start:
        raise ValueError(f"no step-0 value of {key!r}: the gain has no reference")
    v0 = start[0]
    points = sorted((int(r["step"]), float(r[key]) - v0) for r in records
                    if int(r["step"]) > 0 and (horizon is None or int(r["step"]) <= horizon) and finite(r.get(key)))
    return v0, points


def _peak(points: list[tuple[int, float]]) -> tuple[float, int] | None:
    """``(max_i g_i, s_i)`` of the first step that reaches the maximum; None without points."""
    if not points:
        return None
    best = max(g for _, g in points)
    return best, next(s for s, g in points if g == best)


def peak_gain(records: Records, key: str = HELD_OUT, horizon: float | None = None) -> float | None:
    """``max_i (v_i - v_0)`` over the evaluated steps ``0 < s_i <= horizon`` (every step after 0 when ``horizon`` is
    None): the best gain of ``key`` over its step-0 value ``v_0``. Negative when every evaluation is below the start.
    None when nothing was evaluated after step 0; ValueError (naming ``key``) when there is no step-0 value."""
    _, points = _gain_curve(records, key, horizon)
    peak = _peak(points)
    return None if peak is None else peak[0]


def _trapezoid_mean(points: list[tuple[int, float]], horizon: float) -> float:
    """``(1 / horizon) integral_0^horizon g``: trapezoids between ``(0, 0)`` and the ``points`` ``(s_i, g_i)``
    (steps in ``(0, horizon]``, in order), plus ``g_last * (horizon - s_last)`` for the flat tail."""
    area, prev_s, prev_g = 0.0, 0.0, 0.0
    for s, g in points:
        area += 0.5 * (prev_g + g) * (s - prev_s)
        prev_s, prev_g = float(s), g
    return (area + prev_g * (horizon - prev_s)) / horizon


def gain_area(records: Records, key: str = HELD_OUT, *, horizon: float) -> float | None:
    """The mean gain per step over ``[0, horizon]``: ``(1 / horizon) integral_0^horizon g(s) ds`` with
    ``g(s) = v(s) - v_0``, by the trapezoid rule over ``(0, 0), (s_1, g_1), ..., (s_k, g_k)`` (the evaluated steps
    ``0 < s_i <= horizon``), ``g`` held at ``g_k`` from ``s_k`` to the horizon. In the unit of ``key`` (EM); negative
    when the run spends more of its steps below its start than above. Evaluations after the horizon are not read.
    None when nothing was evaluated in ``(0, horizon]``; ValueError (naming ``key``) without a step-0 value, and
    unless ``horizon > 0``."""
    if not horizon > 0:
        raise ValueError(f"the horizon must be > 0 steps, got {horizon}")
    _, points = _gain_curve(records, key, horizon)
    return _trapezoid_mean(points, float(horizon)) if points else None


def run_utility(records: Records, horizon: float, key: str = HELD_OUT) -> dict[str, Any]:
    """One run's held-out utility up to ``horizon``: ``v0`` (the step-0 value of ``key``), ``peak_gain`` and
    ``peak_step`` (:func:`peak_gain` and the first step reaching it), ``gain_area`` (:func:`gain_area`). The last
    three are None when nothing was evaluated in ``(0, horizon]``; ValueError (naming ``key``) without a step-0
    value."""
    if not horizon > 0:
        raise ValueError(f"the horizon must be > 0 steps, got {horizon}")
    v0, points = _gain_curve(records, key, horizon)
    peak = _peak(points)
    return {"v0": v0, "peak_gain": None if peak is None else peak[0], "peak_step": None if peak is None else peak[1],
            "gain_area": _trapezoid_mean(points, float(horizon)) if points else None}
