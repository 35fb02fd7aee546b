"""The survival statistics on hand-made runs: the Kaplan-Meier curve, the RMST, the log-rank test and the bootstrap
interval of a difference of RMSTs, each against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from searchr1_lab.stats.survival import kaplan_meier, logrank, rmst, rmst_difference


def test_kaplan_meier_by_hand():
    # at 2: 5 at risk, 1 dies -> 4/5 = 0.8; at 4: 4 at risk (the run censored at 4 still counts), 1 dies -> 0.8 * 3/4
    # = 0.6; at 6: 2 at risk (6 and 8), 1 dies -> 0.3; the run censored at 8 leaves the curve unchanged
    curve = kaplan_meier([2, 4, 4, 6, 8], [1, 1, 0, 1, 0])
    assert [t for t, _ in curve] == [0, 2, 4, 6]
    assert [s for _, s in curve] == pytest.approx([1.0, 0.8, 0.6, 0.3])
    assert kaplan_meier([5, 5], [0, 0]) == [(0.0, 1.0)]
    assert kaplan_meier([3, 3, 3, 7], [1, 1, 0, 1])[1:] == [(3.0, 0.5), (7.0, 0.0)]  # 2 of 4 die at 3, then 1 of 1


def test_rmst_is_the_area_under_the_curve():
    times, events = [2, 4, 4, 6, 8], [1, 1, 0, 1, 0]
    assert rmst(times, events, 8) == pytest.approx(1.0 * 2 + 0.8 * 2 + 0.6 * 2 + 0.3 * 2)  # 5.4
    assert rmst(times, events, 5) == pytest.approx(1.0 * 2 + 0.8 * 2 + 0.6 * 1)  # 4.2: cut at the horizon
    assert rmst([10, 10], [0, 0], 10) == 10.0
    with pytest.raises(ValueError):
        rmst([1, 2], [1], 5)


def test_rmst_is_the_correctly_rounded_area_on_any_blas_kernel():
    """No censoring: the area is the mean time, 82 / 5 = 16.4, to the last bit (a BLAS dot product gave
    16.400000000000002 with AVX-512 and 16.4 without, so a committed report differed between CPUs)."""
    assert rmst([14, 16, 14, 26, 12], [1] * 5, 75) == 16.4
    assert rmst_difference([14, 16, 14, 26, 12], [1] * 5, [12, 6, 7, 8, 4], [1] * 5, 75)["estimate"] == 16.4 - 7.4


def test_logrank_by_hand():
    # a: collapses at 3, two censored at 6; b: collapses at 1, 2, 3.
    # t=1: n_a=3 n_b=3 n=6 d=1 -> E_a = 3/6 = 0.5, V = 1 (1/2)(1/2)(5/5) = 0.25
    # t=2: n_a=3 n_b=2 n=5 d=1 -> E_a = 3/5 = 0.6, V = (3/5)(2/5)(4/4) = 0.24
    # t=3: n_a=3 n_b=1 n=4 d=2 -> E_a = 2 (3/4) = 1.5, V = 2 (3/4)(1/4)(2/3) = 0.25
    # E_a = 2.6, O_a = 1, E_b = 4 - 2.6 = 1.4, O_b = 3, V = 0.74, z = 1.6 / sqrt(0.74)
    out = logrank([3, 6, 6], [1, 0, 0], [1, 2, 3], [1, 1, 1])
    assert (out["observed_a"], out["observed_b"]) == (1, 3)
    assert out["expected_a"] == pytest.approx(2.6) and out["expected_b"] == pytest.approx(1.4)
    assert out["variance"] == pytest.approx(0.74)
    z = 1.6 / math.sqrt(0.74)
    assert out["z"] == pytest.approx(z)  # 1.8600: a survives longer
    assert out["p_one_sided"] == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))  # 0.0314
    assert out["p_two_sided"] == pytest.approx(math.erfc(z / math.sqrt(2)))  # 0.0629
    assert out["p_one_sided"] == pytest.approx(0.03145, abs=1e-4) and out["degenerate"] is None
    swapped = logrank([1, 2, 3], [1, 1, 1], [3, 6, 6], [1, 0, 0])
    assert swapped["z"] == pytest.approx(-z)
    assert swapped["p_one_sided"] == pytest.approx(1 - out["p_one_sided"])


def test_logrank_without_any_collapse_is_degenerate():
    out = logrank([75, 75], [0, 0], [75, 75, 75], [0, 0, 0])
    assert (out["z"], out["p_one_sided"], out["p_two_sided"]) == (0.0, 1.0, 1.0)
    assert out["degenerate"] == "no run collapsed"
    assert logrank([], [], [3, 4], [1, 1])["degenerate"] is not None


def test_rmst_difference_bootstrap():
    a = ([3, 6, 6], [1, 0, 0])  # RMST to 8: 3 + (2/3) 5 = 6.333
    b = ([1, 2, 3], [1, 1, 1])  # RMST to 8: 1 + 2/3 + 1/3 = 2
    out = rmst_difference(*a, *b, horizon=8)
    assert out["estimate"] == pytest.approx(6 + 1 / 3 - 2)
    assert out["low"] < out["estimate"] < out["high"]
    assert rmst_difference(*a, *b, horizon=8) == out  # seeded: the same interval
    assert rmst_difference(*a, *b, horizon=8, seed=1) != out
    # every replicate of identical runs is the same: the interval is the point
    same = rmst_difference([10, 10, 10], [0, 0, 0], [4, 4], [1, 1], horizon=10, n_boot=200)
    assert (same["estimate"], same["low"], same["high"]) == pytest.approx((6.0, 6.0, 6.0))
    assert rmst_difference([], [], [4], [1], horizon=10)["estimate"] is None


def test_the_weighted_curve_behind_the_rmst_is_scipys_curve_bit_for_bit():
    """The RMST's Kaplan-Meier (many weightings at once, for the bootstrap) gives SciPy's curve exactly, on runs with
    tied times and censoring; integer weights are the runs repeated."""
    from searchr1_lab.stats.survival import _km_factors

    rng = np.random.default_rng(3)
    for _ in range(20):
        t = rng.integers(1, 12, 9).astype(float)
        e = (rng.random(9) < 0.6).astype(float)
        u, surv = _km_factors(t, e, np.ones((1, 9)))
        steps = dict(kaplan_meier(t, e)[1:])
        assert [surv[0, list(u).index(x)] for x in steps] == list(steps.values())
        w = rng.integers(0, 3, 9)
        repeated = _km_factors(np.repeat(t, w), np.repeat(e, w), np.ones((1, int(w.sum()))))
        weighted = _km_factors(t, e, w[None, :].astype(float))
        kept = np.isin(u, repeated[0])
        assert np.array_equal(weighted[1][0, kept], repeated[1][0])


def test_rmst_difference_draws_the_registered_resamples():
    """The interval is the percentiles of the replicates drawn as registered: ``default_rng(seed)`` draws each
    replicate's runs of a (``integers(0, n_a, (n_boot, n_a))``), then those of b, and recomputes both RMSTs."""
    a, b = ([3, 6, 6, 9, 12], [1, 1, 0, 1, 0]), ([1, 2, 3, 5, 8], [1, 1, 1, 1, 1])
    out = rmst_difference(*a, *b, horizon=10, n_boot=300, seed=4)
    rng = np.random.default_rng(4)
    draws_a, draws_b = rng.integers(0, 5, (300, 5)), rng.integers(0, 5, (300, 5))
    reps = [rmst([a[0][i] for i in da], [a[1][i] for i in da], 10)
            - rmst([b[0][i] for i in db], [b[1][i] for i in db], 10) for da, db in zip(draws_a, draws_b)]
    assert (out["low"], out["high"]) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])), abs=1e-12)
    assert out["bca"]["low"] < out["estimate"] < out["bca"]["high"]  # 5 runs a group: BCa beside it


def test_rmst_difference_reports_bca_only_up_to_ten_runs_a_group():
    eleven = rmst_difference(list(range(1, 12)), [1] * 11, [2, 4, 6], [1, 1, 1], horizon=20, n_boot=200)
    assert eleven["bca"] is None and eleven["low"] < eleven["estimate"] < eleven["high"]
    ten = rmst_difference(list(range(1, 11)), [1] * 10, [2, 4, 6], [1, 1, 1], horizon=20, n_boot=200)
    assert set(ten["bca"]) == {"low", "high"}
