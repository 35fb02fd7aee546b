"""Survival of runs to a collapse: the Kaplan-Meier curve, the log-rank test, the restricted mean survival time and a
bootstrap interval of its difference (pure: times and events in, numbers out).

A run is one observation ``(time, event)``: ``event = 1`` when it collapsed at step ``time``, ``event = 0`` when it
was still alive when observation stopped at ``time`` (censored: it ran to the horizon without collapsing). Times are
steps (any non-negative numbers work); every curve starts at survival 1 at time 0.

The curve is ``scipy.stats.ecdf`` of the censored runs, the test ``scipy.stats.logrank``, the resampling
``scipy.stats.bootstrap``. The RMST integrates a Kaplan-Meier curve computed here for many weightings of the same
runs at once (:func:`_km_factors`): each bootstrap replicate is the runs weighted by how often it drew them, and 2,000
replicates of two groups are one array operation, where ``scipy.stats.ecdf`` (one unweighted curve, about 0.4 ms a
call) would take 4,000 calls a comparison. Its curve is SciPy's, bit for bit (the tests check).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from searchr1_lab.stats.bootstrap import BOOT_SEED, LEVEL, N_BOOT, resampled_interval


def _observations(times: Sequence[float], events: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``[n]`` times and ``[n]`` events (0/1) as arrays; ValueError on unequal lengths or an event not 0/1."""
    if len(times) != len(events):
        raise ValueError(f"{len(times)} times but {len(events)} events")
    t = np.asarray(times, dtype=float).reshape(-1)
    e = np.asarray(events, dtype=float).reshape(-1)
    if not np.isin(e, (0.0, 1.0)).all():
        raise ValueError(f"events must be 0 (censored) or 1 (collapsed), got {list(events)}")
    return t, e


def _km_factors(times: np.ndarray, events: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier survival after each distinct time, for ``B`` weightings of the same ``n`` observations.

    ``times``, ``events``: ``[n]``; ``weights``: ``[B, n]``, how many times each observation counts (1 for the curve
    itself, bootstrap draw counts for a replicate). With ``u_j`` the distinct times (``[J]``), the weighted deaths
    ``d_j = sum_i w_i e_i [t_i = u_j]`` and number at risk ``n_j = sum_i w_i [t_i >= u_j]`` (a run censored at
    ``u_j`` is still at risk at ``u_j``), ``S(u_j) = prod_{k <= j} (n_k - d_k) / n_k`` (a factor 1 where
    ``n_k = 0``), each factor as ``scipy.stats.ecdf`` forms it. Returns ``u`` ``[J]`` and ``S`` ``[B, J]``.
    """
    u = np.unique(times)  # [J]
    at = times[:, None] == u[None, :]  # [n, J]
    deaths = weights @ (at * events[:, None])  # [B, J]
    at_risk = weights @ (times[:, None] >= u[None, :]).astype(float)  # [B, J]; whole counts: exact in any order
    factor = np.where(at_risk > 0, (at_risk - deaths) / np.where(at_risk > 0, at_risk, 1.0), 1.0)
    return u, np.cumprod(factor, axis=1)


def _censored(t: np.ndarray, e: np.ndarray) -> stats.CensoredData:
    """The runs as SciPy's right-censored data: collapsed at ``t`` where ``e = 1``, alive at ``t`` where ``e = 0``."""
    return stats.CensoredData(uncensored=t[e > 0], right=t[e == 0])


def kaplan_meier(times: Sequence[float], events: Sequence[int]) -> list[tuple[float, float]]:
    """The Kaplan-Meier estimate of the survival curve (``scipy.stats.ecdf`` of the censored runs):
    ``[(0, 1.0), (t_1, S(t_1)), ...]``, one step per distinct event time ``t_j`` (in order), where the curve drops.

    ``S(t) = prod_{t_j <= t} (1 - d_j / n_j)``: ``d_j`` runs collapsed at ``t_j``, ``n_j`` runs at risk at ``t_j``
    (time ``>= t_j``: a run censored at ``t_j`` counts as at risk at ``t_j``). Censored runs never make the curve
    drop. The curve is right-continuous: ``S`` holds its value from ``t_j`` until the next step.
    """
    t, e = _observations(times, events)
    curve = [(0.0, 1.0)]
    drops = np.unique(t[e > 0])  # [J]
    if len(drops) == 0:
        return curve
    survival = stats.ecdf(_censored(t, e)).sf.evaluate(drops)  # [J]
    return curve + [(float(u), float(v)) for u, v in zip(drops, survival)]


def _rmst_rows(u: np.ndarray, surv: np.ndarray, horizon: float) -> np.ndarray:
    """``[B]``: ``integral_0^horizon S(t) dt`` of the step curves ``S`` ``[B, J]`` (value 1 before ``u[0]``, ``S[:, j]``
    on ``[u_j, u_{j+1})``).

    Each area is the correctly rounded sum (``math.fsum``) of its rectangles, not a matrix product: a BLAS kernel
    sums in an order of its own, which changes the last bit from one CPU to another (16.4 read 16.400000000000002
    with AVX-512), and a committed report must regenerate byte for byte on any of them."""
    knots = np.concatenate(([0.0], np.minimum(u, horizon), [horizon]))  # [J + 2]
    widths = np.diff(knots)  # [J + 1], >= 0: the times are sorted and >= 0
    levels = np.concatenate((np.ones((surv.shape[0], 1)), surv), axis=1)  # [B, J + 1]
    return np.array([math.fsum(row) for row in levels * widths])


def rmst(times: Sequence[float], events: Sequence[int], horizon: float) -> float:
    """The restricted mean survival time up to ``horizon``: the area under the Kaplan-Meier curve,
    ``RMST = integral_0^horizon S(t) dt = sum_j S(t_j) * (min(t_{j+1}, horizon) - t_j)`` over the curve's steps
    below ``horizon`` (``t_0 = 0``, ``S(t_0) = 1``), in the unit of the times (steps). NaN without runs."""
    t, e = _observations(times, events)
    if len(t) == 0:
        return float("nan")
    u, surv = _km_factors(t, e, np.ones((1, len(t))))
    return float(_rmst_rows(u, surv, float(horizon))[0])


def _logrank_sums(ta: np.ndarray, ea: np.ndarray, tb: np.ndarray, eb: np.ndarray) -> tuple[float, float]:
    """``(E_a, V)`` summed over the pooled distinct event times (see :func:`logrank`)."""
    expected_a = variance = 0.0
    for t in np.unique(np.concatenate((ta[ea > 0], tb[eb > 0]))):
        n_a, n_b = float((ta >= t).sum()), float((tb >= t).sum())
        d = float(((ta == t) & (ea > 0)).sum() + ((tb == t) & (eb > 0)).sum())
        n = n_a + n_b
        expected_a += d * n_a / n
        if n > 1:
            variance += d * (n_a / n) * (n_b / n) * (n - d) / (n - 1)
    return expected_a, variance


def logrank(times_a: Sequence[float], events_a: Sequence[int], times_b: Sequence[float],
            events_b: Sequence[int]) -> dict[str, Any]:
    """The log-rank test of two groups of runs (equal hazards against a difference), normal approximation
    (``scipy.stats.logrank``).

    At each distinct event time ``t`` of the pooled runs: ``n_a``, ``n_b`` runs at risk (time ``>= t``), ``n = n_a +
    n_b``, ``d`` runs collapsed at ``t`` (both groups). Expected collapses of group a ``E_a = sum_t d n_a / n``; its
    variance ``V = sum_t d (n_a / n)(n_b / n)(n - d) / (n - 1)``; ``E_b = O_a + O_b - E_a`` (recorded beside the
    test, which SciPy does not return). The statistic ``z = (E_a - O_a) / sqrt(V) = (O_b - E_b) / sqrt(V)`` (SciPy's
    statistic with the sign turned): ``z > 0`` when group b collapses more than expected, i.e. group a survives
    longer. ``p_two_sided = P(|Z| >= |z|)``; ``p_one_sided = P(Z >= z)`` (the alternative: a survives longer than
    b, SciPy's ``alternative="less"``: group a's failure rate is the lower).

    Degenerate (no collapse at all, or no run at risk in one group at every collapse: ``V = 0``): ``z = 0``, both
    p-values 1 and ``degenerate`` says why (otherwise None).
    """
    ta, ea = _observations(times_a, events_a)
    tb, eb = _observations(times_b, events_b)
    observed_a, observed_b = float(ea.sum()), float(eb.sum())
    expected_a, variance = _logrank_sums(ta, ea, tb, eb)
    out = {"observed_a": observed_a, "expected_a": expected_a, "observed_b": observed_b,
           "expected_b": observed_a + observed_b - expected_a, "variance": variance, "n_a": len(ta), "n_b": len(tb)}
    if observed_a + observed_b == 0 or variance <= 0:
        why = "no run collapsed" if observed_a + observed_b == 0 else "no run of one group at risk at any collapse"
        return {**out, "z": 0.0, "p_two_sided": 1.0, "p_one_sided": 1.0, "degenerate": why}
    a, b = _censored(ta, ea), _censored(tb, eb)
    two_sided = stats.logrank(a, b, alternative="two-sided")
    a_survives_longer = stats.logrank(a, b, alternative="less")  # a's failure rate the lower
    return {**out, "z": -float(two_sided.statistic), "p_two_sided": float(two_sided.pvalue),
            "p_one_sided": float(a_survives_longer.pvalue), "degenerate": None}


def _rmst_of_draws(t: np.ndarray, e: np.ndarray, horizon: float) -> Callable[..., np.ndarray]:
    """``statistic(drawn, axis=-1)``: the RMSTs ``[...]`` of resamples of the runs ``(t, e)`` given as the indices
    ``drawn`` ``[..., m]`` of the runs each drew (each run weighted by how often it was drawn)."""
    def rmst_rows(drawn: np.ndarray, axis: int = -1) -> np.ndarray:
        weights = (drawn[..., :, None] == np.arange(len(t))).sum(axis=-2)  # [..., n]
        u, surv = _km_factors(t, e, weights.reshape(-1, len(t)).astype(float))
        return _rmst_rows(u, surv, horizon).reshape(weights.shape[:-1])
    return rmst_rows


def rmst_difference(times_a: Sequence[float], events_a: Sequence[int], times_b: Sequence[float],
                    events_b: Sequence[int], horizon: float, n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                    level: float = LEVEL) -> dict[str, Any]:
    """``RMST_a - RMST_b`` (:func:`rmst`, both up to ``horizon``, in steps) with its percentile bootstrap interval and
    the BCa interval beside it (:func:`searchr1_lab.stats.bootstrap.resampled_interval`, ``bca``: not registered).

    Each of ``n_boot`` replicates resamples the runs of each group with replacement, within the group (the groups'
    sizes kept), and recomputes the difference; ``low``, ``high`` are the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the replicates. Seeded (``seed``): the same runs give the same interval. All None when a group has
    no run.
    """
    ta, ea = _observations(times_a, events_a)
    tb, eb = _observations(times_b, events_b)
    out = {"rmst_a": None, "rmst_b": None, "estimate": None, "low": None, "high": None, "bca": None, "level": level,
           "n_boot": n_boot, "seed": seed}
    if len(ta) == 0 or len(tb) == 0:
        return out
    rmst_a, rmst_b = _rmst_of_draws(ta, ea, horizon), _rmst_of_draws(tb, eb, horizon)

    def difference(drawn_a: np.ndarray, drawn_b: np.ndarray, axis: int = -1) -> np.ndarray:
        return rmst_a(drawn_a) - rmst_b(drawn_b)

    interval = resampled_interval([np.arange(len(ta)), np.arange(len(tb))], difference, n_boot, seed, level)
    a, b = rmst(times_a, events_a, horizon), rmst(times_b, events_b, horizon)
    return {**out, "rmst_a": a, "rmst_b": b, "estimate": a - b, **interval}
