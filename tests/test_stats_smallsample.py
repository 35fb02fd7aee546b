"""The small-sample statistics on values checked by hand: Welch's interval and p against the t tables and closed
forms and computed by hand, an exact permutation p counted by hand (two-sided as registered, not SciPy's), Holm's
adjustment, equivalence, and the per-run restricted times against the Kaplan-Meier RMST."""

from __future__ import annotations

import math
import statistics

import pytest

from searchr1_lab.stats.smallsample import (MAX_RELABELLINGS, equivalent, holm, permutation_test,
                                            restricted_times, welch_difference)
from searchr1_lab.stats.survival import rmst


@pytest.mark.parametrize("n, table", [(2, 4.302653), (3, 2.776445), (10, 2.100922), (16, 2.042272)])
def test_welch_interval_uses_the_t_quantile_of_the_tables(n, table):
    """Two groups of n with equal variances: df = 2 (n - 1), and the 95 % interval is d -+ t_{0.975, df} se (the
    tables' t for df 2, 4, 18 and 30)."""
    a = [float(i * i) for i in range(n)]
    b = [v - 1.0 for v in a]
    out = welch_difference(a, b)
    se = math.sqrt(2 * statistics.variance(a) / n)
    assert out["df"] == pytest.approx(2 * (n - 1), rel=1e-12)
    assert (out["low"], out["high"]) == (pytest.approx(1 - table * se, abs=1e-5 * se),
                                         pytest.approx(1 + table * se, abs=1e-5 * se))


def test_welch_p_matches_the_t_closed_forms():
    """df = 1 is the Cauchy distribution and df = 2 has a closed form too. a = [0, 2] (var 2) against a constant
    b = [0, 0, 0]: d = 1, se = 1, df = n_a - 1 = 1, t = 1: P(T >= 1) = 1/2 - atan(1) / pi = 1/4. a = [1, 3], b = [0, 2]:
    d = 1, se^2 = 2/2 + 2/2, df = 2, t = 1 / sqrt 2: P(T >= t) = 1/2 - t / (2 sqrt(2 + t^2))."""
    cauchy = welch_difference([0, 2], [0, 0, 0])
    assert cauchy["df"] == pytest.approx(1.0) and cauchy["p_one_sided"] == pytest.approx(0.25, abs=1e-13)
    assert cauchy["p_two_sided"] == pytest.approx(0.5, abs=1e-13)
    two = welch_difference([1, 3], [0, 2])
    t = 1 / math.sqrt(2)
    assert two["df"] == pytest.approx(2.0)
    assert two["p_one_sided"] == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


def test_welch_by_hand():
    """a = [1, 2, 3], b = [0, 1, 2]: both means differ by 1, both sample variances are 1, so se^2 = 1/3 + 1/3 = 2/3
    and df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = 4. The interval is 1 -+ t_{0.975, 4} sqrt(2/3) =
    1 -+ 2.776445 * 0.816497 = [-1.266957, 3.266957]. t = 1 / sqrt(2/3) = 1.224745; for df = 4,
    P(T <= t) = 1/2 + 3/8 t / sqrt(u) (1 - t^2 / (12 u)), u = 1 + t^2 / 4 = 1.375: 0.856068."""
    out = welch_difference([1, 2, 3], [0, 1, 2])
    se = math.sqrt(2 / 3)
    assert out["estimate"] == pytest.approx(1.0) and out["df"] == pytest.approx(4.0)
    assert out["low"] == pytest.approx(1 - 2.776445 * se, abs=1e-5)
    assert out["high"] == pytest.approx(1 + 2.776445 * se, abs=1e-5)
    t, u = 1 / se, 1.375
    cdf = 0.5 + 3 / 8 * t / math.sqrt(u) * (1 - t * t / (12 * u))
    assert cdf == pytest.approx(0.856068, abs=1e-6)
    assert out["p_one_sided"] == pytest.approx(1 - cdf, abs=1e-12)
    assert out["p_two_sided"] == pytest.approx(2 * (1 - cdf), abs=1e-12)
    assert (out["n_a"], out["n_b"], out["level"], out["degenerate"]) == (3, 3, 0.95, None)
    flipped = welch_difference([0, 1, 2], [1, 2, 3])
    assert flipped["p_one_sided"] == pytest.approx(cdf) and flipped["p_two_sided"] == pytest.approx(out["p_two_sided"])


def test_welch_unequal_variances_use_the_satterthwaite_df():
    """a = [2, 4, 6] (var 4), b = [1, 2, 3, 4, 5] (var 2.5): se^2 = 4/3 + 1/2 = 11/6,
    df = (11/6)^2 / ((4/3)^2 / 2 + (1/2)^2 / 4) = 3.361111 / 0.951389 = 3.532847."""
    out = welch_difference([2, 4, 6], [1, 2, 3, 4, 5], level=0.9)
    assert out["estimate"] == pytest.approx(1.0)
    assert out["df"] == pytest.approx((11 / 6) ** 2 / ((4 / 3) ** 2 / 2 + 0.5 ** 2 / 4), rel=1e-12)
    assert out["df"] == pytest.approx(3.532847, abs=1e-6)
    quantile = (out["high"] - 1) / math.sqrt(11 / 6)  # the interval is symmetric about the difference, 1
    assert out["low"] == pytest.approx(1 - quantile * math.sqrt(11 / 6))
    assert 2.132 < quantile < 2.353  # between the tables' t_{0.95, 4} and t_{0.95, 3}


def test_welch_degenerate_cases():
    up = welch_difference([2, 2, 2], [1, 1])
    assert (up["estimate"], up["low"], up["high"]) == (1.0, 1.0, 1.0)
    assert (up["p_one_sided"], up["p_two_sided"], up["df"]) == (0.0, 0.0, None) and up["degenerate"]
    down = welch_difference([1, 1], [2, 2, 2])
    assert (down["p_one_sided"], down["p_two_sided"]) == (1.0, 0.0)
    same = welch_difference([3, 3], [3, 3])
    assert (same["estimate"], same["p_one_sided"], same["p_two_sided"]) == (0.0, 1.0, 1.0)
    one_constant = welch_difference([1, 1, 1], [0, 1, 2])  # df = n_b - 1
    assert one_constant["df"] == pytest.approx(2.0) and one_constant["degenerate"] is None
    short = welch_difference([1.0], [0, 1, 2])
    assert short["degenerate"] and "fewer than 2" in short["degenerate"]
    assert all(short[k] is None for k in ("estimate", "low", "high", "df", "p_one_sided", "p_two_sided"))
    assert (short["n_a"], short["n_b"]) == (1, 3)
    with pytest.raises(ValueError, match="not finite"):
        welch_difference([1, float("nan")], [0, 1])


def test_permutation_p_counted_by_hand():
    """a = [3, 4], b = [1, 2]: C(4, 2) = 6 relabellings; the differences of means are 2 ({3, 4}), 1 ({2, 4}),
    0 ({1, 4} and {2, 3}), -1 ({1, 3}), -2 ({1, 2}). Only the observed one reaches 2: one-sided p = 1/6; |D| >= 2
    twice: two-sided p = 2/6."""
    out = permutation_test([3, 4], [1, 2])
    assert out["relabellings"] == 6 and out["estimate"] == 2.0
    assert out["p_one_sided"] == pytest.approx(1 / 6) and out["p_two_sided"] == pytest.approx(2 / 6)
    assert permutation_test([1, 2], [3, 4])["p_one_sided"] == 1.0


def test_permutation_two_sided_p_counts_the_larger_differences_not_twice_the_smaller_tail():
    """a = [10, 11], b = [0, 1, 2]: pooled total 24, so a relabelling whose group a sums to s has D = s / 2 - (24 - s)
    / 3 = 5 s / 6 - 8. The ten pairs sum to 1, 2, 3, 10, 11, 11, 12, 12, 13, 21: D = -7.17, -6.33, -5.5, 0.33, 1.17,
    1.17, 2, 2, 2.83, 9.5. The observed 9.5 is the largest: one-sided p = 1/10, and |D| >= 9.5 once: two-sided
    p = 1/10, as registered (SciPy's two-sided p doubles the smaller tail: 2/10). For a = [0, 1] (D = -7.17),
    |D| >= 7.17 twice: 2/10."""
    out = permutation_test([10, 11], [0, 1, 2])
    assert out["relabellings"] == 10 and out["estimate"] == 9.5
    assert out["p_one_sided"] == pytest.approx(1 / 10) and out["p_two_sided"] == pytest.approx(1 / 10)
    assert permutation_test([0, 1], [2, 10, 11])["p_two_sided"] == pytest.approx(2 / 10)


def test_permutation_counts_ties_within_rounding():
    """a = [0.1, 0.7], b = [0.3, 0.5]: D = s - 0.8 for a relabelling whose group a sums to s. {0.1, 0.7} and
    {0.3, 0.5} both sum to 0.8 (D = 0, but 0.1 + 0.7 rounds to 0.7999999999999999), {0.7, 0.3} and {0.7, 0.5} give
    0.2 and 0.4, {0.1, 0.5} and {0.1, 0.3} give -0.2 and -0.4. D >= 0: four of six; |D| >= 0: all six."""
    out = permutation_test([0.1, 0.7], [0.3, 0.5])
    assert out["p_one_sided"] == pytest.approx(4 / 6) and out["p_two_sided"] == 1.0
    assert permutation_test([0.3, 0.5], [0.1, 0.7])["p_one_sided"] == pytest.approx(4 / 6)


def test_permutation_matches_enumeration_and_refuses_too_many():
    import itertools

    a, b = [5.0, 7.5, 6.1, 9.0, 8.2], [4.0, 6.0, 5.5, 3.9, 7.0, 4.4]
    pooled, observed = a + b, sum(a) / 5 - sum(b) / 6
    diffs = [sum(pooled[i] for i in pick) / 5 - (sum(pooled) - sum(pooled[i] for i in pick)) / 6
             for pick in itertools.combinations(range(11), 5)]
    out = permutation_test(a, b)
    assert out["relabellings"] == math.comb(11, 5) == len(diffs)
    assert out["p_one_sided"] == sum(d >= observed - 1e-9 for d in diffs) / len(diffs)
    assert out["p_two_sided"] == sum(abs(d) >= abs(observed) - 1e-9 for d in diffs) / len(diffs)
    assert math.comb(24, 12) > MAX_RELABELLINGS
    with pytest.raises(ValueError, match="relabellings"):
        permutation_test(list(range(12)), list(range(12)))
    with pytest.raises(ValueError, match="needs 2 values"):
        permutation_test([1.0], [1.0, 2.0])


def test_holm_by_hand():
    """Sorted: a 0.01, c 0.03, b 0.04 (m = 3): a 3 * 0.01 = 0.03; c max(0.03, 2 * 0.03) = 0.06;
    b max(0.06, 1 * 0.04) = 0.06."""
    out = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert list(out) == ["a", "b", "c"]
    assert out == {"a": pytest.approx(0.03), "b": pytest.approx(0.06), "c": pytest.approx(0.06)}
    assert holm({"x": 0.4, "y": 0.5}) == {"x": pytest.approx(0.8), "y": pytest.approx(0.8)}  # 2 * 0.4; max(0.8, 0.5)
    assert holm({"x": 0.7, "y": 0.9}) == {"x": 1.0, "y": 1.0}  # capped at 1
    assert holm({}) == {}
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm({"x": 1.5})


def test_equivalence_is_the_interval_inside_the_margin():
    assert equivalent(-0.02, 0.03, 0.05) and equivalent(-0.05, 0.05, 0.05)
    assert not equivalent(-0.06, 0.01, 0.05) and not equivalent(0.0, 0.051, 0.05)
    assert not equivalent(None, None, 0.05)
    with pytest.raises(ValueError, match="margin"):
        equivalent(-0.1, 0.1, 0.0)


def test_restricted_times_average_to_the_km_rmst():
    """Three collapses (3, 5, 12: the last after the horizon) and two runs censored at or after the horizon 10: the
    restricted times are 3, 5, 10, 10, 10, mean 38 / 5 = 7.6, and so is the area under the Kaplan-Meier curve (1 on
    [0, 3), 4/5 on [3, 5), 3/5 on [5, 10): 3 + 1.6 + 3 = 7.6)."""
    times, events = [3, 10, 5, 12, 15], [1, 0, 1, 1, 0]
    restricted = restricted_times(times, events, 10)
    assert restricted == [3.0, 10.0, 5.0, 10.0, 10.0]
    assert sum(restricted) / 5 == pytest.approx(7.6) == rmst(times, events, 10)
    with pytest.raises(ValueError, match="censored before the horizon"):
        restricted_times([3, 8], [1, 0], 10)
    with pytest.raises(ValueError, match="0 \\(censored\\) or 1"):
        restricted_times([3, 8], [1, 2], 10)
