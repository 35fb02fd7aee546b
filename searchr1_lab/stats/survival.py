"""Survival of runs to a collapse: the Kaplan-Meier curve, the log-rank test, the restricted mean survival time and a
bootstrap interval of its difference (pure: times and events in, numbers out; plain Python and numpy).

A run is one observation ``(time, event)``: ``event = 1`` when it collapsed at step ``time``, ``event = 0`` when it
was still alive when observation stopped at ``time`` (censored: it ran to the horizon without collapsing). Times are
steps (any non-negative numbers work); every curve starts at survival 1 at time 0.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from searchr1_lab.stats.bootstrap import BOOT_SEED, LEVEL, N_BOOT


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
    ``u_j`` is still at risk at ``u_j``), ``S(u_j) = prod_{k <= j} (1 - d_k / n_k)`` (a factor 1 where ``n_k = 0``).
    Returns ``u`` ``[J]``, ``S`` ``[B, J]`` and the deaths ``d`` ``[B, J]``.
    """
    u = np.unique(times)  # [J]
    at = times[:, None] == u[None, :]  # [n, J]
    deaths = weights @ (at * events[:, None])  # [B, J]
    at_risk = weights @ (times[:, None] >= u[None, :]).astype(float)  # [B, J]; whole counts: exact in any order
    factor = np.where(at_risk > 0, 1.0 - deaths / np.where(at_risk > 0, at_risk, 1.0), 1.0)
    return u, np.cumprod(factor, axis=1), deaths


def kaplan_meier(times: Sequence[float], events: Sequence[int]) -> list[tuple[float, float]]:
    """The Kaplan-Meier estimate of the survival curve: ``[(0, 1.0), (t_1, S(t_1)), ...]``, one step per distinct
    event time ``t_j`` (in order), where the curve drops.

    ``S(t) = prod_{t_j <= t} (1 - d_j / n_j)``: ``d_j`` runs collapsed at ``t_j``, ``n_j`` runs at risk at ``t_j``
    (time ``>= t_j``: a run censored at ``t_j`` counts as at risk at ``t_j``). Censored runs never make the curve
    drop. The curve is right-continuous: ``S`` holds its value from ``t_j`` until the next step.
    """
    t, e = _observations(times, events)
    curve = [(0.0, 1.0)]
    if len(t) == 0:
        return curve
    u, surv, deaths = _km_factors(t, e, np.ones((1, len(t))))
    return curve + [(float(u[j]), float(surv[0, j])) for j in range(len(u)) if deaths[0, j] > 0]


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
    u, surv, _ = _km_factors(t, e, np.ones((1, len(t))))
    return float(_rmst_rows(u, surv, float(horizon))[0])


def _normal_upper(z: float) -> float:
    """``P(Z >= z)`` for a standard normal ``Z``: ``erfc(z / sqrt 2) / 2``."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


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
    """The log-rank test of two groups of runs (equal hazards against a difference), normal approximation.

    At each distinct event time ``t`` of the pooled runs: ``n_a``, ``n_b`` runs at risk (time ``>= t``), ``n = n_a +
    n_b``, ``d`` runs collapsed at ``t`` (both groups). Expected collapses of group a ``E_a = sum_t d n_a / n``; its
    variance ``V = sum_t d (n_a / n)(n_b / n)(n - d) / (n - 1)``; ``E_b = O_a + O_b - E_a``. The statistic
    ``z = (E_a - O_a) / sqrt(V) = (O_b - E_b) / sqrt(V)``: ``z > 0`` when group b collapses more than expected, i.e.
    group a survives longer. ``p_two_sided = erfc(|z| / sqrt 2)``; ``p_one_sided = P(Z >= z) = erfc(z / sqrt 2) / 2``
    (the alternative: a survives longer than b).

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
    z = (expected_a - observed_a) / math.sqrt(variance)
    return {**out, "z": z, "p_two_sided": math.erfc(abs(z) / math.sqrt(2.0)), "p_one_sided": _normal_upper(z),
            "degenerate": None}


def _bootstrap_rmst(t: np.ndarray, e: np.ndarray, horizon: float, rng: np.random.Generator,
                    n_boot: int) -> np.ndarray:
    """``[n_boot]`` RMSTs of the group's runs resampled with replacement (one multinomial draw per replicate)."""
    n = len(t)
    drawn = rng.integers(0, n, (n_boot, n)) + n * np.arange(n_boot)[:, None]  # [n_boot, n]
    weights = np.bincount(drawn.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float)
    u, surv, _ = _km_factors(t, e, weights)
    return _rmst_rows(u, surv, horizon)


def rmst_difference(times_a: Sequence[float], events_a: Sequence[int], times_b: Sequence[float],
                    events_b: Sequence[int], horizon: float, n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                    level: float = LEVEL) -> dict[str, Any]:
    """``RMST_a - RMST_b`` (:func:`rmst`, both up to ``horizon``, in steps) with its percentile bootstrap interval.

    Each of ``n_boot`` replicates resamples the runs of each group with replacement, within the group (the groups'
    sizes kept), and recomputes the difference; ``low``, ``high`` are the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the replicates. Seeded (``seed``): the same runs give the same interval. All None when a group has
    no run.
    """
    ta, ea = _observations(times_a, events_a)
    tb, eb = _observations(times_b, events_b)
    out = {"rmst_a": None, "rmst_b": None, "estimate": None, "low": None, "high": None, "level": level,
           "n_boot": n_boot, "seed": seed}
    if len(ta) == 0 or len(tb) == 0:
        return out
    rng = np.random.default_rng(seed)
    reps = _bootstrap_rmst(ta, ea, horizon, rng, n_boot) - _bootstrap_rmst(tb, eb, horizon, rng, n_boot)
    low, high = np.percentile(reps, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    a, b = rmst(times_a, events_a, horizon), rmst(times_b, events_b, horizon)
    return {**out, "rmst_a": a, "rmst_b": b, "estimate": a - b, "low": float(low), "high": float(high)}
