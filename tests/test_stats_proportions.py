"""Wilson's interval of a share and Newcombe's of a difference of two shares, against values worked out by hand."""

import pytest

from searchr1_lab.stats.proportions import newcombe_difference, wilson


def test_wilson_interval_by_hand():
    # 8 of 10: p = 0.8, z = 1.96: centre (0.8 + 0.19208) / 1.38415 = 0.71681, half 0.22041 -> [0.4902, 0.9433]
    w = wilson(8, 10)
    assert w["value"] == 0.8
    assert w["lo"] == pytest.approx(0.4902, abs=1e-4) and w["hi"] == pytest.approx(0.9433, abs=1e-4)
    zero = wilson(0, 5)  # no successes: the interval still reaches above 0
    assert zero["lo"] == 0.0 and zero["hi"] == pytest.approx(0.4345, abs=1e-4)
    assert wilson(0, 0)["value"] is None


def test_newcombe_difference_brackets_the_difference():
    d = newcombe_difference(5, 5, 0, 5)
    assert d["value"] == 1.0 and 0 < d["lo"] < 1.0 and d["hi"] == pytest.approx(1.0)
    same = newcombe_difference(2, 5, 2, 5)
    assert same["value"] == 0 and same["lo"] < 0 < same["hi"]
