"""What every registered study's report shares: its summary.json records floats to a stated precision."""

import json
import math

from searchr1_lab.registered.report import SUMMARY_DIGITS, rounded, summary_json


def test_summary_floats_are_rounded_to_the_stated_significant_digits():
    """The last bits a BLAS kernel or a library version changes are gone; ints, None, text and non-finite values
    stay."""
    assert SUMMARY_DIGITS == 10
    assert rounded({"rmst": 16.400000000000002, "estimate": [8.800000000000004, (0.1 + 0.2, 3)], "runs": 5,
                    "name": "grpo", "low": None, "inf": math.inf}) == {
        "rmst": 16.4, "estimate": [8.8, [0.3, 3]], "runs": 5, "name": "grpo", "low": None, "inf": math.inf}
    assert rounded(2 / 3) == 0.6666666667 and rounded(-1234567.891234) == -1234567.891
    assert rounded(1e-7 / 3) == 3.333333333e-08 and rounded(True) is True


def test_summary_json_is_the_rounded_summary_with_sorted_keys():
    text = summary_json({"b": 28.666666666666664, "a": {"d": 1, "c": 0.30000000000000004}})
    assert text == '{\n "a": {\n  "c": 0.3,\n  "d": 1\n },\n "b": 28.66666667\n}\n'
    assert json.loads(text)["b"] == 28.66666667
