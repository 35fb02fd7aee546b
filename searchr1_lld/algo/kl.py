"""Per-token KL penalty estimators between the current policy and a frozen reference (Schulman's k1/k2/k3).

With log-ratio x = logp - ref_logp (all ``[B, T]``):
- ``k1``                 : x                                   (unbiased, high variance, can be negative)
- ``abs``                : |x|
- ``k2`` / ``mse``       : 0.5 * x^2
- ``low_var_kl`` / ``k3``: exp(-x) + x - 1 = exp(ref - logp) - (ref - logp) - 1   (unbiased, >= 0, low variance)
  As in verl: the log-ratio (ref - logp) is clamped to [-20, 20] before exp, and the result to [-10, 10] (so the
  estimate and its gradient stay finite when the policy drifts far from the reference; the gradient is 0 once clamped).

Every estimator is a function of x registered by name (``@register_kl_estimator("name")``); ``algorithm.kl_type``
names the one :func:`kl_penalty` uses.
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry

K3_LOG_RATIO_CLAMP = 20.0
K3_RESULT_CLAMP = 10.0

KLEstimator = Callable[[torch.Tensor], torch.Tensor]
KL_ESTIMATORS: dict[str, KLEstimator] = {}


def register_kl_estimator(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator: register an estimator ``x [B, T] -> [B, T]`` under each of ``names`` (aliases)."""
    return registry.register(KL_ESTIMATORS, "KL estimator", *names)


@register_kl_estimator("k1")
def k1(x: torch.Tensor) -> torch.Tensor:
    """k1 = x."""
    return x


@register_kl_estimator("abs")
def absolute(x: torch.Tensor) -> torch.Tensor:
    """|x|."""
    return x.abs()


@register_kl_estimator("k2", "mse")
def k2(x: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * x^2."""
    return 0.5 * x.square()


@register_kl_estimator("low_var_kl", "k3")
def k3(x: torch.Tensor) -> torch.Tensor:
    """k3 = exp(-x) + x - 1, log-ratio -x clamped to [-20, 20] and the result to [-10, 10] (module docstring)."""
    log_ratio = torch.clamp(-x, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # ref - logp
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -K3_RESULT_CLAMP, K3_RESULT_CLAMP)


KL_KINDS = tuple(KL_ESTIMATORS)  # the built-in names, in the order above


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of the registered estimator ``kind`` (see module docstring). Gradient flows
    through ``logp`` (and ``ref_logp`` if it requires grad; callers pass a detached reference)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp shapes differ: {tuple(logp.shape)} vs {tuple(ref_logp.shape)}")
    estimator = registry.lookup(KL_ESTIMATORS, "KL estimator", kind)
    return estimator(logp - ref_logp)
