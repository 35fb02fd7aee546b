"""Registered comparisons on a logged endpoint other than survival: a run's value of a key after a named step, read
against the same key at the run's own step 0 (the warm start every run begins from), compared between two arms by
Welch's difference, Holm-adjusted within a registered family, with an equivalence reading, and a positive verdict
only where the two arms took matched steps (pure: run records and numbers in, numbers out; the hypothesis itself is
composed in :mod:`.analysis`, kind ``endpoint``).

The registration::

    "endpoints": {"em_mid": {"key": "eval/val_em", "step": 75},    # the whole validation split after step 75
                  "em_end": {"key": "eval/val_em", "step": 150}},
    "hypotheses": {"E1": {"endpoint": "em_end", "treatment": "llds_action", "control": "grpo", "lr": "constant",
                          "family": "em_end", "equivalence_margin": 0.05, "match_tolerance": 0.25}, ...}

- A run's gain ``g = v(step) - v(0)``: ``v(0)`` is the warm start scored by the same code on the same machine as the
  endpoint (figures depend on the CPU), which on one machine is the warm start's own score (the baselines file's).
  A run without both values (unfinished) counts in no cell.
- Per arm: the mean gain with Student's 95 % interval (the arm against the warm start).
- The difference ``mean g_treatment - mean g_control`` (the warm start cancels when every run starts from it):
  Welch's ``1 - alpha`` interval and two-sided p, and the ``1 - 2 alpha`` interval (90 % at ``alpha`` 0.05), which
  inside ``+-equivalence_margin`` shows the two within the margin (the two one-sided tests at ``alpha``).
- Holm within a ``family`` (the hypotheses naming it; default the hypothesis alone) over the two-sided Welch p
  (a member without one counts as p = 1): ``p_holm``. The difference lies "above 0" when ``p_holm < alpha`` and the
  estimate is positive. Holm tests the j-th smallest of the m p-values at ``alpha / (m - j + 1)`` and only while
  every smaller one was rejected, so a member's Holm-adjusted interval is Welch's at level
  ``1 - alpha min(1 / (m - j + 1), p / p_holm)``: the level Holm tests it at (``p_holm = (m - j + 1) p``), wider when
  a member ranked before it sets ``p_holm``. A Welch interval at ``1 - a`` excludes 0 exactly when ``p < a``, so
  this one lies above 0 exactly when the difference is "above 0" (m = 2: 97.5 % for the smaller p, 95 % for the
  other unless the first was not rejected).
- Step size: the two arms' mean per-step KL (``lld/step_kl``) from the registered window's first step to the
  endpoint's step, matched within a factor ``1 + match_tolerance`` (:func:`.analysis.step_size_match`).
- The verdict (:func:`endpoint_verdict`): ``adds something`` (above 0 and matched), ``no added value`` (the
  ``1 - 2 alpha`` interval inside the margin), ``inconclusive`` otherwise, with its reason.
"""

from __future__ import annotations

from typing import Any, Mapping, MutableMapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stats.smallsample import equivalent, holm, mean_interval, welch_difference

Records = Sequence[Mapping[str, Any]]
ADDS, NO_ADDED_VALUE, INCONCLUSIVE = "adds something", "no added value", "inconclusive"


def value_at(records: Records, key: str, step: int) -> float | None:
    """The finite value of ``key`` the run logged at ``step``, or None."""
    vals = [float(r[key]) for r in records if int(r["step"]) == step and finite(r.get(key))]
    return vals[0] if vals else None


def endpoint_gain(records: Records, key: str, step: int) -> float | None:
    """``v(step) - v(0)`` of ``key``: the gain over the run's own step-0 value (the warm start); None when either
    value is missing."""
    start, end = value_at(records, key, 0), value_at(records, key, step)
    return None if start is None or end is None else end - start


def arm_gains(runs: Sequence[Mapping[str, Any]], endpoint: Mapping[str, Any]) -> list[float]:
    """``[n]``: :func:`endpoint_gain` of each run (in the given order) that has one."""
    gains = [endpoint_gain(r["records"], endpoint["key"], int(endpoint["step"])) for r in runs]
    return [g for g in gains if g is not None]


def endpoint_difference(gains_a: Sequence[float], gains_b: Sequence[float], margin: float,
                        alpha: float) -> dict[str, Any]:
    """Arm a against arm b on their gains: each arm's ``gains`` and mean with Student's ``1 - alpha`` interval
    (``a``, ``b``), Welch's difference ``a - b`` at ``1 - alpha`` (``welch``) and at ``1 - 2 alpha`` (``welch90``),
    and whether the latter lies inside ``+-margin`` (``equivalent``)."""
    welch90 = welch_difference(gains_a, gains_b, 1 - 2 * alpha)
    return {"a": {"gains": list(gains_a), **mean_interval(gains_a, 1 - alpha)},
            "b": {"gains": list(gains_b), **mean_interval(gains_b, 1 - alpha)},
            "welch": welch_difference(gains_a, gains_b, 1 - alpha), "welch90": welch90,
            "equivalent": equivalent(welch90["low"], welch90["high"], margin)}


def endpoint_verdict(above_zero: bool, matched: bool, within_margin: bool) -> str:
    """``adds something`` when the Holm-adjusted difference lies above 0 and the arms' step sizes matched; else
    ``no added value`` when the difference is shown inside the equivalence margin; else ``inconclusive``."""
    if above_zero and matched:
        return ADDS
    return NO_ADDED_VALUE if within_margin else INCONCLUSIVE


def inconclusive_reason(res: Mapping[str, Any], alpha: float) -> str | None:
    """Why an endpoint hypothesis is inconclusive (None when it is not), its Holm adjustment in (``p_holm``)."""
    if res["verdict"] != INCONCLUSIVE:
        return None
    if res["welch"]["estimate"] is None or res["welch"]["low"] is None:
        return "too few finished runs for an interval"
    if res["above_zero"]:
        return "step KL not matched"
    if res["p_holm"] < alpha:
        return "below 0 after Holm's adjustment: the control gained more, which no registered verdict names"
    return "neither above 0 after Holm's adjustment nor inside the margin"


def holm_level(p: float, p_holm: float, step_factor: int, alpha: float) -> float:
    """The level of a member's Holm-adjusted interval: ``1 - alpha min(1 / step_factor, p / p_holm)``, where
    ``step_factor = m - j + 1`` for the j-th smallest of m p-values (``1 - alpha / step_factor`` when ``p_holm`` is
    0). Its Welch interval excludes 0 exactly when ``p_holm < alpha`` (module docstring)."""
    share = 1 / step_factor if p_holm == 0 else min(1 / step_factor, p / p_holm)
    return 1 - alpha * share


def adjust_endpoint_families(results: MutableMapping[str, Any], alpha: float) -> None:
    """Holm within each family of the endpoint hypotheses in ``results`` (those with an ``endpoint``): on each,
    ``p_holm``, ``holm_level`` (:func:`holm_level`), ``welch_holm`` (Welch's interval at that level), ``family_size``,
    ``above_zero``, the ``verdict`` (:func:`endpoint_verdict`) and its ``reason``."""
    families: dict[str, list[str]] = {}
    for name, res in results.items():
        if "endpoint" in res:
            families.setdefault(res["family"], []).append(name)
    for members in families.values():
        p = {n: results[n]["welch"]["p_two_sided"] for n in members}
        p = {n: 1.0 if v is None else float(v) for n, v in p.items()}
        adjusted = holm(p)
        for j, name in enumerate(sorted(p, key=p.get)):  # Holm's order (ascending p, ties as listed)
            res = results[name]
            level = holm_level(p[name], adjusted[name], len(members) - j, alpha)
            holm_interval = welch_difference(res["a"]["gains"], res["b"]["gains"], level)
            estimate = res["welch"]["estimate"]
            above = adjusted[name] < alpha and estimate is not None and estimate > 0
            res.update({"p_holm": adjusted[name], "holm_level": level, "welch_holm": holm_interval,
                        "family_size": len(members), "above_zero": above,
                        "verdict": endpoint_verdict(above, res["step_size"]["matched"], res["equivalent"])})
            res["reason"] = inconclusive_reason(res, alpha)
