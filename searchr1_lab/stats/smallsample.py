"""Intervals and tests that hold with a handful of runs per arm (n = 5-10): Student's t, Welch's difference of means,
the exact permutation test, Holm's adjustment, equivalence by an interval, and the per-run restricted survival time
(pure: numbers in, numbers out; numpy and the standard library, no scipy).

- Student's t with ``nu`` degrees of freedom (any ``nu > 0``, not only integers): the upper tail
  ``P(T >= t) = I_x(nu / 2, 1 / 2) / 2`` for ``t >= 0``, ``x = nu / (nu + t^2)``, where ``I_x(a, b)`` is the
  regularised incomplete beta function, evaluated by its continued fraction (modified Lentz); the quantile solves
  ``P(T >= t) = q`` by Newton steps kept inside a bisection bracket. Above ``NORMAL_DF`` degrees of freedom (and at
  ``nu = inf``) it is the standard normal (the difference is below the rounding of the beta function's prefactor).
- Welch: ``d = mean(a) - mean(b)``, ``se^2 = s_a^2 / n_a + s_b^2 / n_b`` (sample variances, ddof 1), the
  Welch-Satterthwaite ``df = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))``, the interval
  ``d -+ t_{(1 + level) / 2, df} se`` and ``t = d / se`` against Student's t with ``df``.
- The exact permutation test: every one of the ``C(n_a + n_b, n_a)`` ways of relabelling the pooled values as ``n_a``
  of group a and ``n_b`` of group b is equally likely when the groups do not differ; the p-value is the share of
  relabellings whose difference of means is at least as extreme as the observed one. No distribution is assumed.
- Holm: the step-down Bonferroni adjustment of a family of p-values (controls the family-wise error rate).
- Equivalence (TOST): two one-sided tests at ``alpha`` against a margin both reject exactly when the ``1 - 2 alpha``
  interval of the difference lies inside ``[-margin, +margin]``.
- Restricted survival time: ``min(t_i, horizon)`` per run, whose mean is the Kaplan-Meier restricted mean survival
  time when no run is censored before the horizon, so the tests above on it test the RMST difference.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

MAX_RELABELLINGS = 2_000_000  # the exact permutation test refuses more relabellings than this
TIE = 1e-12  # relative tolerance under which two differences of means count as tied
_CF_EPS = 1e-15  # the continued fraction stops when a step changes it by less than this (relative)
_CF_TINY = 1e-300  # Lentz's guard against a zero denominator
_CF_MAX_TERMS = 100_000
NORMAL_DF = 1e7  # above this many degrees of freedom Student's t is taken as the normal (they differ by < 1e-7)
_NORMAL = NormalDist()


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function, by the modified Lentz method:

    ``I_x(a, b) = x^a (1 - x)^b / (a B(a, b)) * 1 / (1 + d_1 / (1 + d_2 / (1 + ...)))`` with
    ``d_{2m + 1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))`` (``m >= 0``) and
    ``d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))`` (``m >= 1``).
    Returns the fraction ``1 / (1 + d_1 / (1 + ...))``; it converges fast for ``x < (a + 1) / (a + b + 2)``.
    Lentz: ``f = C_j D_j f``, ``D_j = 1 / (1 + d_j D_{j-1})``, ``C_j = 1 + d_j / C_{j-1}`` (each guarded from 0).
    """
    def guard(v: float) -> float:
        return v if abs(v) > _CF_TINY else _CF_TINY

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    f = d
    for m in range(1, _CF_MAX_TERMS):
        for term in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / guard(1.0 + term * d)
            c = guard(1.0 + term / c)
            f *= c * d
        if abs(c * d - 1.0) < _CF_EPS:
            return f
    raise ArithmeticError(f"the incomplete beta fraction did not converge (a={a}, b={b}, x={x})")


def _incomplete_beta(a: float, b: float, x: float, one_minus_x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b) = B(x; a, b) / B(a, b)``, ``0 <= x <= 1``.

    ``one_minus_x`` is ``1 - x`` computed by the caller without cancellation. Evaluated by :func:`_beta_fraction`
    where it converges fast (``x < (a + 1) / (a + b + 2)``), else by the symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)``.
    """
    if x <= 0.0:
        return 0.0
    if one_minus_x <= 0.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log(one_minus_x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, one_minus_x) / b


def _check_df(df: float) -> float:
    df = float(df)
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    return df


def _upper_tail(t: float, df: float) -> float:
    """``P(T >= t)`` for ``t >= 0``: ``I_x(df / 2, 1 / 2) / 2``, ``x = df / (df + t^2)``; the normal's above
    ``NORMAL_DF``."""
    if df > NORMAL_DF:
        return _NORMAL.cdf(-t)
    if math.isinf(t):
        return 0.0
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def _density(t: float, df: float) -> float:
    """Student's t density ``Gamma((df + 1) / 2) / (sqrt(df pi) Gamma(df / 2)) (1 + t^2 / df)^(-(df + 1) / 2)``."""
    if df > NORMAL_DF:
        return _NORMAL.pdf(t)
    return math.exp(math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
                    - (df + 1.0) / 2.0 * math.log1p(t * t / df))


def student_t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom (above ``NORMAL_DF``, ``math.inf`` included:
    the standard normal).

    ``P(T <= t) = 1 - I_x(df / 2, 1 / 2) / 2`` for ``t >= 0`` and ``I_x(df / 2, 1 / 2) / 2`` for ``t < 0``, with
    ``x = df / (df + t^2)`` and ``I_x`` the regularised incomplete beta function (continued fraction, Lentz).
    """
    df, t = _check_df(df), float(t)
    if math.isnan(t):
        return float("nan")
    return _upper_tail(-t, df) if t < 0 else 1.0 - _upper_tail(t, df)


def student_t_quantile(p: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = p`` (``0 < p < 1``) for Student's t with ``df > 0`` degrees of freedom.

    By symmetry ``t = sign(p - 1/2) t_q`` where ``t_q >= 0`` solves ``P(T >= t_q) = q = min(p, 1 - p)``. The root is
    bracketed (``[0, 2^k]``, doubled until ``P(T >= 2^k) <= q``), then refined by Newton steps
    ``t <- t + (P(T >= t) - q) / f(t)`` (``f`` the density), each step that leaves the bracket replaced by bisection,
    until a step moves ``t`` by less than ``1e-13 max(1, t)``.
    """
    df, p = _check_df(df), float(p)
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if p == 0.5:
        return 0.0
    q = min(p, 1.0 - p)
    lo, hi = 0.0, 1.0
    while _upper_tail(hi, df) > q:
        lo, hi = hi, 2.0 * hi
    t = min(max(_NORMAL.inv_cdf(1.0 - q), lo), hi)
    for _ in range(200):
        tail = _upper_tail(t, df)
        lo, hi = (t, hi) if tail > q else (lo, t)
        density = _density(t, df)
        step = t + (tail - q) / density if density > 0 else math.nan
        new = step if lo < step < hi else 0.5 * (lo + hi)
        if abs(new - t) <= 1e-13 * max(1.0, t):
            t = new
            break
        t = new
    return t if p > 0.5 else -t


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
    """Welch's difference of means ``mean(a) - mean(b)`` with its two-sided interval at ``level`` and its p-values.

    ``a`` ``[n_a]``, ``b`` ``[n_b]``: finite values (one per run). With sample variances ``s^2`` (ddof 1),
    ``se^2 = s_a^2 / n_a + s_b^2 / n_b``, ``df = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))``
    (Welch-Satterthwaite, not an integer in general), ``t = estimate / se``:
    ``low, high = estimate -+ t_{(1 + level) / 2, df} se``; ``p_two_sided = 2 P(T >= |t|)``;
    ``p_one_sided = P(T >= t)`` (the alternative: mean of a > mean of b).

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
    va, vb = float(x.var(ddof=1)) / len(x), float(y.var(ddof=1)) / len(y)
    if va + vb == 0.0:
        return {**out, "estimate": estimate, **_zero_variance(estimate)}
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    half = student_t_quantile((1.0 + level) / 2.0, df) * se
    t = estimate / se
    return {**out, "estimate": estimate, "low": estimate - half, "high": estimate + half, "df": df,
            "p_one_sided": student_t_cdf(-t, df), "p_two_sided": min(1.0, 2.0 * _upper_tail(abs(t), df))}


def _subset_sums(values: np.ndarray, k: int) -> np.ndarray:
    """``[C(n, k)]``: the sum of every ``k``-subset of the ``n`` values (one entry per subset, by position).

    Built element by element: the ``j``-subsets of the first ``i + 1`` values are those of the first ``i`` plus
    the ``(j - 1)``-subsets of the first ``i`` with value ``i`` added; sizes that can no longer reach ``k`` are
    dropped.
    """
    n = len(values)
    sums: dict[int, np.ndarray] = {0: np.zeros(1)}
    for i, v in enumerate(values):
        grown: dict[int, np.ndarray] = {}
        for j in range(max(0, k - (n - i - 1)), min(k, i + 1) + 1):  # after value i, n - i - 1 values are left
            parts = [sums[j]] if j in sums else []
            if j - 1 in sums:
                parts.append(sums[j - 1] + v)
            grown[j] = np.concatenate(parts)
        sums = grown
    return sums[k]


def permutation_test(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The exact permutation test of ``mean(a) - mean(b)``: every relabelling of the pooled values, none sampled.

    ``a`` ``[n_a]``, ``b`` ``[n_b]`` (finite, each group non-empty). Pooled ``z`` (``[n_a + n_b]``, total ``S``), a
    relabelling picks ``n_a`` of them as group a; its difference is ``D = s / n_a - (S - s) / n_b`` with ``s`` the
    picked values' sum. Over all ``relabellings = C(n_a + n_b, n_a)`` of them (the observed one included):
    ``p_one_sided = #{D >= D_obs - tol} / relabellings`` (the alternative: mean of a > mean of b) and
    ``p_two_sided = #{|D| >= |D_obs| - tol} / relabellings``, where ``tol = TIE * max(1, max |z|)`` lets ties that
    differ only by rounding count as ties. The smallest attainable p is ``1 / relabellings``. ValueError on an
    empty group or beyond ``MAX_RELABELLINGS`` relabellings.
    """
    x, y = _sample(a, "a"), _sample(b, "b")
    if len(x) == 0 or len(y) == 0:
        raise ValueError(f"each group needs a value (n_a={len(x)}, n_b={len(y)})")
    count = math.comb(len(x) + len(y), len(x))
    if count > MAX_RELABELLINGS:
        raise ValueError(f"{count} relabellings (n_a={len(x)}, n_b={len(y)}) is more than the exact test enumerates "
                         f"({MAX_RELABELLINGS})")
    z = np.concatenate((x, y))
    total = float(z.sum())
    picked = _subset_sums(z, len(x))  # [count]
    diffs = picked / len(x) - (total - picked) / len(y)
    observed = float(x.mean() - y.mean())
    tol = TIE * max(1.0, float(np.abs(z).max()))
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
