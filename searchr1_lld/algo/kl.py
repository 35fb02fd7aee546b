"""Per-token KL penalty estimators between the current policy and a frozen reference (Schulman's k1/k2/k3).

With log-ratio x = logp - ref_logp (all ``[B, T]``):
- ``k1``                 : x                                   (unbiased, high variance, can be negative)
- ``abs``                : |x|
- ``k2`` / ``mse``       : 0.5 * x^2
- ``low_var_kl`` / ``k3``: exp(-x) + x - 1 = exp(ref - logp) - (ref - logp) - 1   (unbiased, >= 0, low variance)
  As in verl: the log-ratio (ref - logp) is clamped to [-20, 20] before exp, and the result to [-10, 10] (so the
  estimate and its gradient stay finite when the policy drifts far from the reference; the gradient is 0 once clamped).
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "abs", "k2", "mse", "low_var_kl", "k3")
K3_LOG_RATIO_CLAMP = 20.0
K3_RESULT_CLAMP = 10.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` (see module docstring). Gradient flows through ``logp`` (and ``ref_logp`` if it
    requires grad; callers pass a detached reference)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp shapes differ: {tuple(logp.shape)} vs {tuple(ref_logp.shape)}")
    x = logp - ref_logp
    if kind == "k1":
        return x
    if kind == "abs":
        return x.abs()
    if kind in ("k2", "mse"):
        return 0.5 * x.square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(-x, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # ref - logp
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -K3_RESULT_CLAMP, K3_RESULT_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {list(KL_KINDS)}")
