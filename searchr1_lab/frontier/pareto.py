"""The Pareto frontier of points scored on two axes, both to be maximised (pure)."""

from __future__ import annotations

from typing import Sequence


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a`` is at least as good as ``b`` on both axes and better on one."""
    return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the points no other point dominates (:func:`dominates`), in the order of the first axis (ties:
    the second). Equal points are all on the frontier when none dominates them."""
    front = [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))
