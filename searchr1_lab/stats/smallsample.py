"""Intervals and tests that hold with a handful of runs per arm (n = 5-10): Student's interval of a mean, Welch's
difference of means and the exact permutation test (all computed by ``scipy.stats``), Holm's adjustment, equivalence
by an interval, and the per-run restricted survival time (pure: numbers in, numbers out).

- Welch (``scipy.stats.ttest_ind(equal_var=False)`` and its ``confidence_interval``): ``d = mean(a) - mean(b)``,
  ``se^2 = s_a^2 / n_a + s_b^2 / n_b`` (sample variances, ddof 1), the Welch-Satterthwaite
  ``df = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))``, the interval
  ``d -+ t_{(1 + level) / 2, df} se`` and ``t = d / se`` against Student's t with ``df``.
- The exact permutation test (``scipy.stats.permutation_test`` over every relabelling): each of the
  ``C(n_a + n_b, n_a)`` ways of relabelling the pooled values as ``n_a`` of group a and ``n_b`` of group b is equally
  likely when the groups do not differ; the p-value is the share of relabellings whose difference of means is at
  least as extreme as the observed one, counted here from SciPy's null distribution as the registered analyses
  define it (two-sided: ``|D| >= |d|``, where SciPy's own two-sided p doubles the smaller tail). No distribution is
  assumed.
- Holm: the step-down Bonferroni adjustment of a family of p-values (controls the family-wise error rate).
- Equivalence (TOST): two one-sided tests at ``alpha`` against a margin both reject exactly when the ``1 - 2 alpha``
  interval of the difference lies inside ``[-margin, +margin]``.
- Restricted survival time: ``min(t_i, horizon)`` per run, whose mean is the Kaplan-Meier restricted mean survival
  time when no run is censored before the horizon, so the tests above on it test the RMST difference.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from searchr1_lab.stats.bootstrap import mean_difference

MAX_RELABELLINGS = 2_000_000  # the exact permutation test refuses more relabellings than this
TIE = 1e-12  # relative tolerance under which two differences of means count as tied


def _sample(values: Sequence[float], name: str) -> np.ndarray:
    x = np.asarray(values, dtype=float).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError(f"group {name} has a value that is not finite: {list(values)}")
    return x


def _zero_variance(estimate: float) -> dict[str, Any]:
    """Both groups constant: no spread to weigh the difference against; the sign of the difference decides."""
    p_one = 0.0 if estimate > 0 else 1.0
    p_two = 1.0 if estimate == 0 else 0.0
    return {"low": estimate, "high": estimate, "df": None, "p_one_sided": p_one, "p_two_sided": p_two,
            "degenerate": "both groups have zero variance"}


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Welch's difference of means ``mean(a) - mean(b)`` with its two-sided interval at ``level`` and its p-values
    (``scipy.stats.ttest_ind(a, b, equal_var=False)``).

    ``a`` ``[n_a]``, ``b`` ``[n_b]``: finite values (one per run). ``low, high = estimate -+ t_{(1 + level) / 2, df}
    se`` (the test's ``confidence_interval(level)``); ``df`` the Welch-Satterthwaite degrees of freedom (not an
    integer in general); ``p_two_sided = 2 P(T >= |t|)``; ``p_one_sided = P(T >= t)`` (the alternative: mean of a >
    mean of b), ``t = estimate / se``.

    Degenerate, with ``degenerate`` saying why (otherwise None): both variances 0 (``se = 0``): the interval is
    ``[estimate, estimate]``, ``df`` None, and the p-values follow the sign of the estimate (above 0: both 0; equal
    to 0: both 1; below 0: one-sided 1, two-sided 0). A group with fewer than 2 values (no variance to estimate):
    every number None except ``level``, ``n_a``, ``n_b``.
    """
    x, y = _sample(a, "a"), _sample(b, "b")
    out: dict[str, Any] = {"estimate": None, "low": None, "high": None, "level": level, "df": None,
                           "p_one_sided": None, "p_two_sided": None, "n_a": len(x), "n_b": len(y),
                           "degenerate": None}
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if len(x) < 2 or len(y) < 2:
        return {**out, "degenerate": f"a group has fewer than 2 values (n_a={len(x)}, n_b={len(y)})"}
    estimate = float(x.mean() - y.mean())
    if x.var(ddof=1) + y.var(ddof=1) == 0.0:
        return {**out, "estimate": estimate, **_zero_variance(estimate)}
    with warnings.catch_warnings():  # one constant group (every run censored at the horizon) is a valid case
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        test = stats.ttest_ind(x, y, equal_var=False)
    interval = test.confidence_interval(level)
    return {**out, "estimate": estimate, "low": float(interval.low), "high": float(interval.high),
            "df": float(test.df), "p_one_sided": float(stats.t.sf(test.statistic, test.df)),
            "p_two_sided": float(test.pvalue)}


def mean_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """The mean of ``values`` ``[n]`` with Student's two-sided interval at ``level``
    (``scipy.stats.ttest_1samp(values, 0).confidence_interval(level)``): ``mean -+ t_{(1 + level) / 2, n - 1} s /
    sqrt(n)``, ``s`` the sample standard deviation (ddof 1). ``low`` and ``high`` are None with fewer than 2 values
    (no spread to estimate), equal to the mean when every value is the same; ``estimate`` None without values."""
    x = _sample(values, "values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    out: dict[str, Any] = {"estimate": float(x.mean()) if len(x) else None, "low": None, "high": None,
                           "level": level, "n": len(x)}
    if len(x) < 2:
        return out
    if x.var(ddof=1) == 0.0:
        return {**out, "low": out["estimate"], "high": out["estimate"]}
    interval = stats.ttest_1samp(x, 0.0).confidence_interval(level)
    return {**out, "low": float(interval.low), "high": float(interval.high)}


def permutation_test(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The exact permutation test of ``mean(a) - mean(b)``: every relabelling of the pooled values, none sampled
    (``scipy.stats.permutation_test``, ``n_resamples=inf``).

    ``a`` ``[n_a]``, ``b`` ``[n_b]`` (finite, at least 2 values a group, as SciPy asks). Pooled ``z``
    (``[n_a + n_b]``), a relabelling picks ``n_a`` of them as group a; ``D`` is its difference of means. Over all
    ``relabellings = C(n_a + n_b, n_a)`` of them (SciPy's exact null distribution, the observed one included):
    ``p_one_sided = #{D >= D_obs - tol} / relabellings`` (the alternative: mean of a > mean of b) and
    ``p_two_sided = #{|D| >= |D_obs| - tol} / relabellings``, where ``tol = TIE * max(1, max |z|)`` lets ties that
    differ only by rounding count as ties. The smallest attainable p is ``1 / relabellings``. ValueError on a group
    of fewer than 2 values or beyond ``MAX_RELABELLINGS`` relabellings.
    """
    x, y = _sample(a, "a"), _sample(b, "b")
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"each group needs 2 values (n_a={len(x)}, n_b={len(y)})")
    count = math.comb(len(x) + len(y), len(x))
    if count > MAX_RELABELLINGS:
        raise ValueError(f"{count} relabellings (n_a={len(x)}, n_b={len(y)}) is more than the exact test enumerates "
                         f"({MAX_RELABELLINGS})")
    diffs = stats.permutation_test((x, y), mean_difference, permutation_type="independent", vectorized=True,
                                   n_resamples=np.inf).null_distribution  # [count]
    observed = float(x.mean() - y.mean())
    tol = TIE * max(1.0, float(np.abs(np.concatenate((x, y))).max()))
    return {"estimate": observed, "p_one_sided": float((diffs >= observed - tol).sum()) / count,
            "p_two_sided": float((np.abs(diffs) >= abs(observed) - tol).sum()) / count, "relabellings": count,
            "n_a": len(x), "n_b": len(y)}


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values of a family of ``m`` tests, by name.

    Sorted ascending ``p_(1) <= ... <= p_(m)``: ``adjusted_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))`` (step-down;
    the running maximum keeps the adjusted values in the order of the raw ones). Rejecting every test whose
    adjusted p is below ``alpha`` holds the family-wise error rate at ``alpha``. ValueError on a p outside [0, 1].
    """
    bad = {k: p for k, p in p_values.items() if not 0.0 <= float(p) <= 1.0}
    if bad:
        raise ValueError(f"p-values must lie in [0, 1], got {bad}")
    order = sorted(p_values, key=lambda k: float(p_values[k]))
    m, running, out = len(order), 0.0, {}
    for j, name in enumerate(order):
        running = max(running, min(1.0, (m - j) * float(p_values[name])))
        out[name] = running
    return {name: out[name] for name in p_values}


def equivalent(low: float | None, high: float | None, margin: float) -> bool:
    """Whether the interval ``[low, high]`` lies inside ``[-margin, +margin]``: ``-margin <= low`` and
    ``high <= margin``.

    Given the ``1 - 2 alpha`` interval of a difference (e.g. :func:`welch_difference` at ``level = 1 - 2 alpha``,
    0.90 for ``alpha = 0.05``) this is the two one-sided tests (TOST) of equivalence at level ``alpha``: the
    difference is shown to be within the margin. False when either end is None (a degenerate interval shows
    nothing). ValueError unless ``margin > 0``.
    """
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    if low is None or high is None:
        return False
    return -margin <= low and high <= margin


def restricted_times(times: Sequence[float], events: Sequence[int], horizon: float) -> list[float]:
    """``[n]``: each run's restricted survival time ``min(t_i, horizon)`` (steps).

    When no run is censored before the horizon (every ``event = 0`` run has ``t_i >= horizon``, as in these studies,
    where a run that never collapses is censored at the horizon), the Kaplan-Meier curve up to the horizon is the
    empirical survival curve ``S(t) = #{t_i > t} / n``, so
    ``mean_i min(t_i, horizon) = integral_0^horizon S(t) dt`` is the Kaplan-Meier restricted mean survival time
    (:func:`searchr1_lab.stats.survival.rmst`); :func:`welch_difference` and :func:`permutation_test` on
    these times then test the difference of RMSTs. ValueError on unequal lengths, an event not 0/1, or a run
    censored before the horizon (``event = 0`` and ``t_i < horizon``), where that equality fails.
    """
    if len(times) != len(events):
        raise ValueError(f"{len(times)} times but {len(events)} events")
    if any(e not in (0, 1) for e in events):
        raise ValueError(f"events must be 0 (censored) or 1 (collapsed), got {list(events)}")
    early = [(float(t), int(e)) for t, e in zip(times, events) if e == 0 and float(t) < horizon]
    if early:
        raise ValueError(f"runs censored before the horizon {horizon}: {early}; their restricted times do not "
                         f"average to the Kaplan-Meier RMST")
    return [min(float(t), float(horizon)) for t in times]
