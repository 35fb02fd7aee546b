"""Intervals of a share and of a difference of two shares (pure: counts in, numbers out).

- Wilson's score interval of ``k / n``: the ``p`` whose score test at ``z`` does not reject, which stays inside
  [0, 1] and keeps its coverage near the nominal level at small ``n`` and at shares near 0 or 1.
- Newcombe's hybrid score interval of ``k1 / n1 - k2 / n2`` (his method 10), built from the two Wilson intervals.
"""

from __future__ import annotations

import math
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def wilson(successes: int, trials: int, z: float = Z95) -> dict[str, Any]:
    """The share ``successes / trials`` with its Wilson score interval (95 % by default); all None for 0 trials."""
    if trials <= 0:
        return {"value": None, "lo": None, "hi": None, "k": successes, "n": trials}
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return {"value": p, "lo": max(0.0, centre - half), "hi": min(1.0, centre + half), "k": successes, "n": trials}


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> dict[str, Any]:
    """``k1/n1 - k2/n2`` with Newcombe's hybrid score interval (from the two Wilson intervals); None without trials."""
    if n1 <= 0 or n2 <= 0:
        return {"value": None, "lo": None, "hi": None}
    a, b = wilson(k1, n1, z), wilson(k2, n2, z)
    d = a["value"] - b["value"]
    lo = d - math.sqrt((a["value"] - a["lo"]) ** 2 + (b["hi"] - b["value"]) ** 2)
    hi = d + math.sqrt((a["hi"] - a["value"]) ** 2 + (b["value"] - b["lo"]) ** 2)
    return {"value": d, "lo": lo, "hi": hi}
