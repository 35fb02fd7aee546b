"""A trust-region step size: the multiplicative learning-rate correction that steers the policy's measured step size
toward a target (pure: floats in, a float out).

The step size of a rollout step is the KL between the policy before and after its updates, measured on the step's
own samples (``lld/step_kl``, instruments/monitor.py). For small steps it grows with the square of the update's
size, and the update's size with the learning rate (Adam normalises the gradient's scale away), so a step that came
out ``r = target / measured`` times too large or small in KL is corrected by scaling the next step's learning rate
by ``sqrt(r)``. :func:`trust_region_multiplier` applies a fraction ``gain`` of that correction in log space (an
integral controller on ``log target - log measured``: the multiplier accumulates the corrections, so a persistent
error is removed and per-step noise averaged), bounded per step and overall.
"""

from __future__ import annotations

import math


def trust_region_multiplier(multiplier: float, step_kl: float, target_kl: float, *, gain: float, max_change: float,
                            lo: float, hi: float) -> float:
    """The learning-rate multiplier for the next step, from the one in force (``multiplier``), the step size it
    produced (``step_kl``) and the target of that step (``target_kl``)::

        factor = clip((target_kl / step_kl) ** (gain / 2), 1 / max_change, max_change)
        next   = clip(multiplier * factor, lo, hi)

    ``gain`` 1 removes the whole error at once if the next step behaves like this one; smaller gains average the
    measurement's noise over about ``1 / gain`` steps. A step with no usable measurement (``step_kl`` not finite or
    <= 0, e.g. every update skipped) or no target (``target_kl`` <= 0) leaves the multiplier unchanged (clipped).
    """
    if not (math.isfinite(step_kl) and step_kl > 0 and math.isfinite(target_kl) and target_kl > 0):
        return min(max(multiplier, lo), hi)
    factor = math.exp(0.5 * gain * (math.log(target_kl) - math.log(step_kl)))
    factor = min(max(factor, 1.0 / max_change), max_change)
    return min(max(multiplier * factor, lo), hi)
