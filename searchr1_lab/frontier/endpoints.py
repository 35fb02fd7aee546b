"""A frontier run's registered endpoints and a cell's summary of them (pure: compact runs in, numbers out).

Per run, with the study's collapse label ``{"ratio", "persist", "horizon"}`` (:func:`searchr1_lab.stepsize.analysis.
collapse_time`, on the held-out EM ``eval/val_sub_em`` against the run's own step-0 value):

- ``utility``: the peak gain of the held-out EM over step 0 up to the horizon (:func:`~searchr1_lab.stepsize.utility.
  peak_gain`), floored at 0: a run that never rises above its start learned nothing, whatever it survived;
- ``gain_area``: the mean gain per step over the run (:func:`~searchr1_lab.stepsize.utility.gain_area`; negative for a
  run that spent more of its steps below its start than above);
- ``time`` / ``event``: the collapse step (1) or the horizon (0, censored);
- ``final_val_em``: the last whole-validation EM (``eval/val_em``) at or before the horizon.

Per cell (arm at one learning rate): the mean, minimum and maximum of each over its runs (the seeds' spread), the
runs that collapsed, and the RMST to the horizon (:func:`~searchr1_lab.stats.survival.rmst`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stepsize.analysis import collapse_time, run_name
from searchr1_lab.stats.survival import rmst
from searchr1_lab.stepsize.utility import run_utility

WHOLE_VAL = "eval/val_em"
Run = Mapping[str, Any]


def final_value(records: Sequence[Mapping[str, Any]], key: str, horizon: int) -> float | None:
    """The value of ``key`` at the last step ``<= horizon`` that has a finite one (None when none does)."""
    points = sorted((int(r["step"]), float(r[key])) for r in records
                    if int(r["step"]) <= horizon and finite(r.get(key)))
    return points[-1][1] if points else None


def run_endpoints(run: Run, label: Mapping[str, Any]) -> dict[str, Any]:
    """One run's endpoints (module docstring); ``utility`` and ``gain_area`` are None when nothing was evaluated
    after step 0."""
    horizon = int(label["horizon"])
    time, event = collapse_time(run["records"], ratio=label["ratio"], persist=label["persist"], horizon=horizon,
                                name=run_name(run))
    u = run_utility(run["records"], horizon)
    return {"arm": run["method"], "lr": run["lr"], "seed": run["seed"], "time": time, "event": event,
            "utility": None if u["peak_gain"] is None else max(0.0, u["peak_gain"]), "peak_gain": u["peak_gain"],
            "peak_step": u["peak_step"], "gain_area": u["gain_area"], "v0": u["v0"],
            "final_val_em": final_value(run["records"], WHOLE_VAL, horizon)}


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """``{"mean", "min", "max"}`` of the values that exist (all None when none do)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}


def cell_endpoints(points: Sequence[Mapping[str, Any]], horizon: int) -> dict[str, Any]:
    """A cell's summary of its runs' endpoints (:func:`run_endpoints`, one cell): ``runs``, ``collapsed`` (``"k/n"``),
    ``rmst`` (None without runs), and the spread (:func:`spread`) of utility, gain area, collapse time and final
    validation EM."""
    times, events = [p["time"] for p in points], [p["event"] for p in points]
    return {"runs": len(points), "collapsed": f"{sum(events)}/{len(points)}",
            "rmst": rmst(times, events, horizon) if points else None,
            **{key: spread([p[key] for p in points]) for key in ("utility", "gain_area", "time", "final_val_em")}}
