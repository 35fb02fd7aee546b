"""What a study's report says beside its registered verdict (pure: compact runs and the registration in, numbers out):
the step size each cell took after the learning-rate warm-up, each cell's held-out utility, the survival comparisons
at small-sample strength (Welch, the exact permutation test, Holm over the confirmatory family), and the comparisons
nobody registered, labelled as such.

- Step size after the warm-up: a run's mean ``lld/step_kl`` over steps ``first..last`` (:func:`.analysis.step_size`);
  per cell over three stretches: the registered window, from the end of the warm-up to the run's own collapse (to
  the horizon when censored), and from the end of the warm-up over a fixed number of steps before most collapses.
- Utility: :func:`.analysis.cell_utility` (peak gain of the held-out EM over step 0, the area under the gain curve
  per step) and the whole validation split at the end.
- The warm-up's last step: the scheduler warms the rate up over ``warmup_ratio`` of all optimiser steps, ``updates``
  per rollout step, so rollout steps ``1..ceil(warmup_ratio * total_steps)`` hold warm-up updates
  (:func:`warmup_steps`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stepsize.analysis import (Run, cell_runs, cell_utility, collapse_time, compare_arms, family,
                                            final_value, run_name, step_size)


def warmup_steps(warmup_ratio: float, total_steps: int) -> int:
    """The rollout steps that hold warm-up updates: the optimiser warms up over ``int(warmup_ratio x total updates)``
    updates (learner/optim.lr_factor), ``total updates = updates per step x total_steps``, so they end within rollout
    step ``ceil(warmup_ratio x total_steps)`` (steps 1-8 for 10 % of 75 steps of 8 updates: 60 updates, 7.5 steps)."""
    return math.ceil(warmup_ratio * total_steps)


def mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if finite(v)]
    return sum(vals) / len(vals) if vals else None


def cell_step_sizes(runs: Sequence[Run], label: Mapping[str, Any], window: tuple[int, int], after: int,
                    fixed: int) -> dict[str, Any]:
    """One cell's mean step size over its runs: ``registered`` (the registered ``window``), ``to_collapse`` (steps
    ``after + 1`` to each run's collapse, or the horizon), ``fixed`` (steps ``after + 1 .. after + fixed``)."""
    to_collapse = []
    for r in runs:
        end, _ = collapse_time(r["records"], ratio=label["ratio"], persist=label["persist"],
                               horizon=label["horizon"], name=run_name(r))
        to_collapse.append(step_size(r["records"], after + 1, end) if end > after else float("nan"))
    return {"registered": mean([step_size(r["records"], *window) for r in runs]),
            "to_collapse": mean(to_collapse),
            "fixed": mean([step_size(r["records"], after + 1, after + fixed) for r in runs]),
            "window": list(window), "after": after, "fixed_steps": fixed}


def cells_of(registration: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Every (arm, learning rate) the registration runs, in its order."""
    return [(arm, float(lr)) for arm, spec in registration["arms"].items() for lr in spec["lrs"]]


def cell_table(runs: Sequence[Run], registration: Mapping[str, Any], after: int, fixed: int = 8) -> list[dict]:
    """Per registered cell: its runs, step sizes (:func:`cell_step_sizes`) and utility (:func:`.analysis.cell_utility`,
    with the step-0 and final whole-validation EM)."""
    label = registration["label"]
    window = (int(registration["step_size"]["first"]), int(registration["step_size"]["last"]))
    out = []
    for arm, lr in cells_of(registration):
        mine = cell_runs(runs, arm, lr)
        if not mine:
            continue
        out.append({"arm": arm, "lr": lr, "runs": len(mine),
                    "step_size": cell_step_sizes(mine, label, window, after, fixed),
                    "utility": cell_utility(mine, label["horizon"]),
                    "val_em_start": mean([_step0(r, "eval/val_em") for r in mine]),
                    "val_em_end": mean([final_value(r["records"], "eval/val_em") for r in mine])})
    return out


def _step0(run: Run, key: str) -> float:
    vals = [float(r[key]) for r in run["records"] if int(r["step"]) == 0 and finite(r.get(key))]
    return vals[0] if vals else float("nan")


def small_sample_rows(hypotheses: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per member of the confirmatory :func:`.analysis.family`: the comparison's name, the RMST difference
    by the bootstrap, Welch's 95 % interval, the exact permutation test's one-sided p, and the log-rank p raw and
    Holm-adjusted."""
    rows = []
    for name, res in family(hypotheses).items():
        comp = res["comparison"]
        rows.append({"name": name, "treatment": res["treatment"], "control": res["control"], "lr": res["lr"],
                     "control_lr": res["control_lr"], "bootstrap": comp["rmst_difference"], "welch": comp["welch"],
                     "permutation": comp["permutation"], "p": comp["logrank"]["p_one_sided"],
                     "p_holm": comp.get("p_holm")})
    return rows


def unregistered_comparisons(runs: Sequence[Run], registration: Mapping[str, Any],
                             pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Exploratory comparisons (``(treatment, control)`` arms at the rate they share), each the survival comparison
    with its small-sample statistics; a pair without a shared rate or without runs is left out."""
    out = []
    label, cells = registration["label"], cells_of(registration)
    for treatment, control in pairs:
        control_rates = [lr for arm, lr in cells if arm == control]
        shared = [lr for arm, lr in cells if arm == treatment and any(math.isclose(lr, c) for c in control_rates)]
        for lr in shared:
            if cell_runs(runs, treatment, lr) and cell_runs(runs, control, lr):
                out.append({"treatment": treatment, "control": control, "lr": lr,
                            "comparison": compare_arms(runs, treatment, control, lr, label)})
    return out
