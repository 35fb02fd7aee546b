"""How a term's metrics reduce over a training step: a term (algo/terms.py) or a policy loss returns each metric
with its reduction, and the step (learner/step.py) reduces every metric it receives by it, without knowing its name.

A micro-batch's metric value is a float; its type says how the step's micro-batches (every epoch, mini-batch and
micro-batch of the step; padding ones excluded) combine:

    float, TokenMean(v)      sum_k v_k n_k / sum_k n_k          n_k the micro-batch's response tokens
    TokenMean(v, weight=w)   sum_k v_k w_k / sum_k w_k          a mean over other units (responses, action spans)
    PerUpdate(v)             sum_k v_k / U                      U the step's optimiser updates (a loss normalised by
                                                                the mini-batch: its micro-batches sum to the update's)
    Sum(v)                   sum_k v_k
    Last(v)                  v of the last micro-batch          (a value of the whole step)
    Max(v)                   max_k v_k

A metric name without a ``/`` is the actor's: the step logs it as ``actor/<name>``. The types are floats, so a
term's metrics compare and print as numbers. Pure: no tensors, no I/O.
"""

from __future__ import annotations

from typing import Mapping


class TokenMean(float):
    """A mean over the micro-batch's response tokens (``weight`` None) or over ``weight`` other units."""

    def __new__(cls, value: float, weight: float | None = None):
        obj = super().__new__(cls, value)
        obj.weight = weight
        return obj


class PerUpdate(float):
    """Summed over the micro-batches of an update, averaged over the step's updates."""


class Sum(float):
    """Summed over the step's micro-batches."""


class Last(float):
    """One value for the whole step (the last micro-batch's)."""


class Max(float):
    """The largest over the step's micro-batches."""


def add_micro_batch(acc: dict[str, list], metrics: Mapping[str, float], tokens: float) -> None:
    """Fold one micro-batch's ``metrics`` (``tokens``: its response tokens) into the step's accumulator ``acc``
    (``{name: [kind, a, b]}``, made empty by the caller)."""
    for name, value in metrics.items():
        key = name if "/" in name else f"actor/{name}"
        kind = type(value) if isinstance(value, (PerUpdate, Sum, Last, Max)) else TokenMean
        slot = acc.setdefault(key, [kind, 0.0, 0.0])
        if slot[0] is not kind:
            raise ValueError(f"metric {key} is reduced as {slot[0].__name__} and as {kind.__name__} in one step")
        v = float(value)
        if kind is TokenMean:
            w = tokens if getattr(value, "weight", None) is None else float(value.weight)
            slot[1] += v * w
            slot[2] += w
        elif kind is Last:
            slot[1] = v
        elif kind is Max:
            slot[1] = v if slot[2] == 0 else max(slot[1], v)
            slot[2] = 1.0
        else:
            slot[1] += v


def reduce_step(acc: Mapping[str, list], updates: int) -> dict[str, float]:
    """The step's value of every metric of ``acc`` (module docstring); ``updates``: the step's optimiser updates. A
    mean over no weight at all (no anchored token, no action span) is 0."""
    out: dict[str, float] = {}
    for key, (kind, a, b) in acc.items():
        if kind is TokenMean:
            out[key] = a / b if b > 0 else 0.0
        elif kind is PerUpdate:
            out[key] = a / max(updates, 1)
        else:
            out[key] = a
    return out
