"""How firmly each cell on the frontier holds its place (pure: the cells and their runs' endpoints in, numbers out).

A cell F is on the Pareto frontier over (RMST, mean utility) because every other cell at least as good as F on one
axis (a *challenger*) is worse on the other. F's *lead* over a challenger is that difference on the other axis, F's
value minus the challenger's: mean utility when the challenger lasted at least as long (its RMST at least F's), RMST
when it learned at least as much. Each lead is read with the Welch 95 % interval of the difference of the two cells'
per-run values (utility; the restricted survival time ``min(t, horizon)``, whose mean is the RMST when no run is
censored before the horizon). F's place is *resolved* when every lead's interval lies above 0; otherwise the frontier
would lose or keep F on a difference its seeds cannot tell from none.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchr1_lab.stepsize.analysis import same_lr
from searchr1_lab.stats.smallsample import restricted_times, welch_difference

LEVEL = 0.95


def cell_values(points: Sequence[Mapping[str, Any]], cell: Mapping[str, Any], horizon: float) -> dict[str, list[float]]:
    """A cell's per-run values on the frontier's axes, from its runs' endpoints (``points``: one per run, with
    ``arm``, ``lr``, ``utility``, ``time``, ``event``): ``{"rmst": restricted survival times, "utility": utilities}``
    (a run without a utility left out of that list)."""
    mine = [p for p in points if p["arm"] == cell["arm"] and same_lr(p["lr"], cell["lr"])]
    return {"rmst": restricted_times([p["time"] for p in mine], [p["event"] for p in mine], horizon),
            "utility": [p["utility"] for p in mine if p["utility"] is not None]}


def _axes(cell: Mapping[str, Any]) -> dict[str, float]:
    return {"rmst": cell["rmst"], "utility": cell["utility"]["mean"]}


def frontier_margins(cells: Sequence[Mapping[str, Any]], points: Sequence[Mapping[str, Any]],
                     horizon: float) -> list[dict[str, Any]]:
    """Per cell on the frontier (``on_frontier``; cells with ``name``, ``arm``, ``lr``, ``runs``, ``rmst``,
    ``utility.mean``), in the cells' order: ``{"cell", "leads", "resolved"}``. ``leads``: one per challenger (module
    docstring), by axis, closest first, each ``{"challenger", "axis"`` (the axis F leads on) ``, "lead"``
    (:func:`welch_difference` of F's per-run values minus the challenger's on that axis) ``}``; ``resolved`` when
    every lead's interval lies above 0 (a cell without challengers is resolved)."""
    scored = [c for c in cells if c["runs"] and c["rmst"] is not None and c["utility"]["mean"] is not None]
    values = {c["name"]: cell_values(points, c, horizon) for c in scored}
    out = []
    for f in (c for c in scored if c["on_frontier"]):
        leads = []
        for c in scored:
            if c["name"] == f["name"]:
                continue
            for other, axis in (("rmst", "utility"), ("utility", "rmst")):
                if _axes(c)[other] >= _axes(f)[other]:
                    leads.append({"challenger": c["name"], "axis": axis,
                                  "lead": welch_difference(values[f["name"]][axis], values[c["name"]][axis], LEVEL)})
        leads.sort(key=lambda d: (d["axis"], d["lead"]["estimate"] if d["lead"]["estimate"] is not None else 0.0))
        out.append({"cell": f["name"], "leads": leads,
                    "resolved": all(d["lead"]["low"] is not None and d["lead"]["low"] > 0 for d in leads)})
    return out
