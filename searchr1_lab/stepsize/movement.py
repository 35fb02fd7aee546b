"""How far a run's policy moved before it collapsed (exploratory, not registered; pure: records in, numbers out).

The registered hypotheses ask whether a method survives longer. This asks why: a method that only takes smaller
steps should collapse after as much movement as GRPO does, only later; a method that changes where the cliff is should
move further before it falls. How far a policy has moved by step ``t`` can be read three ways (:data:`MEASURES`):

- ``kl``: the sum over its updates ``1..t`` of the per-step KL between the policy before and after the update
  (``lld/step_kl``, on the step's own samples); for steps in random directions it grows like the squared
  displacement;
- ``sqrt_kl``: the sum of its square roots (for small steps proportional to each step's length in the Fisher
  metric: a path length, which counts many small steps more than a KL sum does);
- ``probe_drop``: the fall of the fixed probe set's likelihood from its value before training to the last value at
  or before ``t`` (``probe/initial_logp_per_token - probe/logp_per_token``, nats/token): a displacement, not a sum.

The movement to collapse runs to the run's collapse step under a label (:func:`.analysis.collapse_time`), or to the
horizon when it did not collapse (then a lower bound: ``censored`` counts those). Each registered comparison (the
``control`` and ``controls`` hypotheses, each pair once) is re-read with this endpoint: the treatment's mean movement
minus the control's, with an unpaired bootstrap interval over runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stats.bootstrap import BOOT_SEED, N_BOOT, bootstrap_mean
from searchr1_lld.instruments.alarms import probe_drop
from searchr1_lab.stepsize.analysis import (Run, cell_runs, control_lr, hypothesis_kind, hypothesis_beats,
                                            hypothesis_mechanism, labels, resolve_lr)

STEP_KL = "lld/step_kl"
Records = Sequence[Mapping[str, Any]]


def summed_step_kl(step_of: Callable[[float], float]) -> Callable[[Records, int], float]:
    """A movement that sums ``step_of(lld/step_kl)`` over the steps ``1..until`` (negative float noise counts as 0);
    NaN when none is logged there."""
    def measure(records: Records, until: int) -> float:
        vals = [step_of(max(float(r[STEP_KL]), 0.0)) for r in records
                if 1 <= int(r["step"]) <= until and finite(r.get(STEP_KL))]
        return math.fsum(vals) if vals else math.nan
    return measure


def probe_drop_by(records: Records, until: int) -> float:
    """The probe set's likelihood drop by step ``until`` (the ``probe_drop`` alarm's score on the records of steps
    ``<= until``)."""
    ordered = sorted((r for r in records if int(r["step"]) <= until), key=lambda r: int(r["step"]))
    return probe_drop(ordered)


# how far a run has moved by a step: records, step -> movement
MEASURES: dict[str, Callable[[Records, int], float]] = {
    "kl": summed_step_kl(float), "sqrt_kl": summed_step_kl(math.sqrt), "probe_drop": probe_drop_by}


def movement(records: Records, until: int, measure: str = "kl") -> float:
    """How far the run had moved by step ``until``, by ``MEASURES[measure]``."""
    return MEASURES[measure](records, until)


def cell_movement(runs: Sequence[Run], arm: str, lr: float, label: Mapping[str, Any],
                  measure: str = "kl") -> dict[str, Any]:
    """One cell's runs (seed order): each run's movement to its collapse step (to the horizon when censored), how many
    were censored, and the mean, min and max of the finite movements (None without any)."""
    mine = cell_runs(runs, arm, lr)
    ends = labels(mine, label)
    values = [movement(r["records"], t, measure) for r, (t, _) in zip(mine, ends)]
    found = [v for v in values if finite(v)]
    return {"arm": arm, "lr": lr, "seeds": [r["seed"] for r in mine], "values": values,
            "censored": sum(1 for _, e in ends if not e),
            "mean": math.fsum(found) / len(found) if found else None, "min": min(found, default=None),
            "max": max(found, default=None)}


def cells_movement(runs: Sequence[Run], label: Mapping[str, Any],
                   measures: Sequence[str] = tuple(MEASURES)) -> list[dict[str, Any]]:
    """Per arm and rate present in ``runs``: its runs' count, how many were censored, and per measure the mean, min
    and max of their movements to collapse."""
    out = []
    for arm, lr in sorted({(r["method"], float(r["lr"])) for r in runs}):
        cells = {m: cell_movement(runs, arm, lr, label, m) for m in measures}
        first = next(iter(cells.values()))
        out.append({"arm": arm, "lr": lr, "runs": len(first["values"]), "censored": first["censored"],
                    **{m: {k: cell[k] for k in ("mean", "min", "max")} for m, cell in cells.items()}})
    return out


def compared_pairs(runs: Sequence[Run], registration: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each (treatment at lr, control at its rate) pair the registered comparison hypotheses test, once, in the
    registration's order, with the first hypothesis that tests it."""
    pairs: dict[tuple[str, float, str, float], str] = {}
    for name, spec in registration["hypotheses"].items():
        kind = hypothesis_kind(name, spec)
        if kind not in (hypothesis_beats, hypothesis_mechanism):
            continue
        lr = resolve_lr(registration, spec["lr"])
        controls = [spec["control"]] if kind is hypothesis_beats else [spec.get("baseline", "grpo"),
                                                                       *spec["controls"]]
        for control in controls:
            pairs.setdefault((spec["treatment"], lr, control, control_lr(registration, runs, control, lr)), name)
    return [{"hypothesis": h, "treatment": t, "lr": lr, "control": c, "control_lr": c_lr}
            for (t, lr, c, c_lr), h in pairs.items()]


def movement_study(runs: Sequence[Run], registration: Mapping[str, Any], label: Mapping[str, Any] | None = None,
                   measures: Sequence[str] = tuple(MEASURES), n_boot: int = N_BOOT,
                   seed: int = BOOT_SEED) -> list[dict[str, Any]]:
    """Per compared pair (:func:`compared_pairs`) and measure: both cells' movements to collapse under ``label``
    (default: the registered primary label), their means, and ``difference`` (treatment minus control) with its
    bootstrap interval (:func:`searchr1_lab.stats.bootstrap.bootstrap_mean`)."""
    label = label or registration["label"]
    out = []
    for pair in compared_pairs(runs, registration):
        by_measure = {}
        for measure in measures:
            a = cell_movement(runs, pair["treatment"], pair["lr"], label, measure)
            b = cell_movement(runs, pair["control"], pair["control_lr"], label, measure)
            xa, xb = ([v for v in cell["values"] if finite(v)] for cell in (a, b))
            by_measure[measure] = {"treatment": a, "control": b, "mean_treatment": a["mean"],
                                   "mean_control": b["mean"], "difference": bootstrap_mean(xa, n_boot, seed, other=xb)}
        out.append({**pair, "measures": by_measure})
    return out


def movement_sensitivity(runs: Sequence[Run], registration: Mapping[str, Any], measure: str = "kl",
                         n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> list[dict[str, Any]]:
    """Per compared pair: its movement difference (``measure``) under every label of the registered sensitivity
    grid (``ratio`` x ``persist``, the registered horizon), as ``{ratio, persist, estimate, low, high}`` rows."""
    horizon = registration["label"]["horizon"]
    rows: list[dict[str, Any]] = []
    for ratio in registration["sensitivity"]["ratio"]:
        for persist in registration["sensitivity"]["persist"]:
            label = {"ratio": ratio, "persist": persist, "horizon": horizon}
            study = movement_study(runs, registration, label, measures=(measure,), n_boot=n_boot, seed=seed)
            for i, res in enumerate(study):
                if i == len(rows):
                    rows.append({k: res[k] for k in ("hypothesis", "treatment", "lr", "control", "control_lr")}
                                | {"labels": []})
                rows[i]["labels"].append({"ratio": ratio, "persist": persist,
                                          **res["measures"][measure]["difference"]})
    return rows
