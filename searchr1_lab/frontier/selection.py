"""Each method's dose chosen on validation, and the chosen settings scored once on test (pure).

A method (the registration's ``frontier.methods``: a name -> its arms) has one cell per arm and learning rate, its
doses. Its chosen cell is the one with the largest mean gain area (the held-out gain per step over the whole run: it
rewards learning and lasting at once), ties broken by the mean utility and then the RMST (:func:`choose`). Test:
the chosen cell's runs' final policies, already scored on the test split when each run ended and read only here, once
the grid is complete; the mean EM over runs x questions with the bootstrap that resamples subjects
(:func:`searchr1_lab.stats.bootstrap.clustered_bootstrap`), and each method's rank on test beside its rank on validation;
beside them the baselines' test EM (:func:`baseline_test_scores`: the warm start every run began from, scored when
the grid built its world), the line a final policy is read against.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from searchr1_lab.baselines import BASELINE_NAMES, subjects
from searchr1_lab.stats.bootstrap import clustered_bootstrap
from searchr1_lab.stepsize.analysis import cell_runs


def selection_key(cell: Mapping[str, Any]) -> tuple[float, float, float]:
    """What :func:`choose` maximises: (mean gain area, mean utility, RMST); a missing value ranks last."""
    def value(x: Any) -> float:
        return float(x) if x is not None and not math.isnan(float(x)) else -math.inf

    return value(cell["gain_area"]["mean"]), value(cell["utility"]["mean"]), value(cell["rmst"])


def choose(cells: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The cell of ``cells`` (one method's doses, each with runs) with the largest :func:`selection_key`; the first
    such in the registered order on a tie; None when no cell has a run."""
    scored = [c for c in cells if c["runs"]]
    if not scored:
        return None
    best = max(selection_key(c) for c in scored)
    return next(c for c in scored if selection_key(c) == best)


def method_cells(cells: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[Mapping[str, Any]]:
    """The cells of a method's arms, in the registered order of the arms."""
    return [c for arm in arms for c in cells if c["arm"] == arm]


def ranks(values: Mapping[str, float | None]) -> dict[str, int | None]:
    """Rank (1 = best, largest value) of each name; equal values share the better rank; None without a value."""
    present = {k: v for k, v in values.items() if v is not None}
    return {k: (1 + sum(w > present[k] for w in present.values()) if k in present else None) for k in values}


def test_scores(chosen: Mapping[str, Mapping[str, Any]], runs: Sequence[Mapping[str, Any]],
                base: Mapping[str, Any]) -> dict[str, Any]:
    """Per method, its chosen cell's test EM (:func:`clustered_bootstrap` over the cell's runs and every test
    question, clustered by subject), and each method's rank on test beside its rank on validation (the selection
    key's first value, the mean gain area)."""
    questions = base["splits"]["test"]["questions"]
    ids, clusters = [q["id"] for q in questions], subjects(questions)
    out: dict[str, Any] = {}
    for method, cell in chosen.items():
        mine = cell_runs(runs, cell["arm"], cell["lr"])
        out[method] = {"arm": cell["arm"], "lr": cell["lr"],
                       "test_em": clustered_bootstrap([r["test"]["correct"] for r in mine], ids, clusters)}
    val = ranks({m: selection_key(c)[0] if math.isfinite(selection_key(c)[0]) else None for m, c in chosen.items()})
    test = ranks({m: out[m]["test_em"]["mean"] for m in out})
    for m in out:
        out[m]["rank_validation"], out[m]["rank_test"] = val[m], test[m]
    return out


def baseline_test_scores(base: Mapping[str, Any]) -> dict[str, Any]:
    """Each baseline's test EM (``base``: the grid's baselines file; :data:`searchr1_lab.baselines.BASELINE_NAMES`,
    the warm start among them) with the same subject-resampling interval as :func:`test_scores`."""
    test = base["splits"]["test"]
    ids, clusters = [q["id"] for q in test["questions"]], subjects(test["questions"])
    return {name: clustered_bootstrap([test["correct"][name]], ids, clusters) for name in BASELINE_NAMES}
