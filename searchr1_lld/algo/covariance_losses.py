"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617): policy losses that hold back the few tokens whose advantage and log-probability co-vary
most, the tokens that drive the policy's entropy down. Registered in algo/policy_loss.py's table as ``clip_cov`` and
``kl_cov``; their settings are the sections ``algorithm.clip_cov`` and ``algorithm.kl_cov`` (keywords below).

Shapes: logp_new, logp_old, response_mask, token_weights ``[B, T]``; advantages ``[B, T]`` or ``[B]``. With
x = logp_new - logp_old, r = exp(x), m the response mask, N = sum m, and the centred covariance of each token

    cov[i,t] = (A[i,t] - masked_mean(A)) * (logp_new[i,t] - masked_mean(logp_new))      (no gradient)

Clip-Cov (PPO-clip, then a random few covariance tokens lose their gradient):
    l1 = -A r,  l2 = -A clip(r, 1 - clip_low, 1 + clip_high),  clipped = m & (l2 > l1)
    candidates = m & ~clipped & (lb < cov < ub);  k = max(floor(ratio * N), 1)
    corr[i,t] = 0 on min(k, |candidates|) candidates drawn uniformly without replacement (torch.randperm over the
                candidates in row-major order; ``generator`` or the global RNG), 1 elsewhere
    loss = aggregate(w * corr * max(l1, l2), m, agg_mode)
KL-Cov (no clipping; the k tokens of largest covariance get a |x| penalty):
    k = max(floor(ratio * N), 1);  top = the k response tokens with the largest cov
    l = -A r + coef * |x| * 1[(i,t) in top];   loss = aggregate(w * l, m, agg_mode)
    (clip_low, clip_high and dual_clip are accepted for the common interface and not used: KL-Cov does not clip)

Metrics: those of algo/policy_loss.py (pg_loss, pg_clip_frac, approx_kl, ...) and cov_token_frac, the fraction of
response tokens the covariance selected (Clip-Cov: gradient removed; KL-Cov: penalised).
"""

from __future__ import annotations

import torch

from searchr1_lld.algo.aggregation import aggregate, masked_mean
from searchr1_lld.algo.policy_loss import (LOG_RATIO_CLAMP, _check, _clipped_surrogate, _token_advantages,
                                           register_policy_loss)


@torch.no_grad()
def token_covariance(advantages: torch.Tensor, logp_new: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """cov ``[B, T]`` = (A - masked_mean(A)) * (logp_new - masked_mean(logp_new)) over the response mask (module
    docstring); ``advantages`` ``[B, T]``. No gradient."""
    m = response_mask != 0
    a, lp = advantages.detach(), logp_new.detach()
    return (a - masked_mean(a, m)) * (lp - masked_mean(lp, m))


def _budget(ratio: float, m: torch.Tensor) -> int:
    """k = max(floor(ratio * N), 1) for the N response tokens of ``m``."""
    if ratio <= 0:
        raise ValueError(f"the covariance ratio must be > 0, got {ratio}")
    return max(int(ratio * int(m.sum())), 1)


@register_policy_loss("clip_cov")
def clip_cov_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                  dual_clip: float | None = None, agg_mode: str = "token-mean",
                  token_weights: torch.Tensor | None = None, ratio: float = 2e-4, lb: float = 1.0, ub: float = 5.0,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (module docstring): PPO-clip whose per-token loss is zeroed on k random tokens with lb < cov < ub
    among those PPO did not clip. Returns (loss, metrics)."""
    _check(logp_new, logp_old, response_mask, clip_low, clip_high, dual_clip)
    adv = _token_advantages(advantages, response_mask)
    log_ratio = torch.clamp(logp_new - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    m = response_mask != 0
    with torch.no_grad():
        ratio_t = torch.exp(log_ratio)
        clipped = m & (-adv * torch.clamp(ratio_t, 1.0 - clip_low, 1.0 + clip_high) > -adv * ratio_t)
        cov = token_covariance(adv, logp_new, response_mask)
        candidates = torch.nonzero(m & ~clipped & (cov > lb) & (cov < ub))  # [n, 2], row-major
        k = _budget(ratio, m)
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:k].to(candidates.device)]
        corr = torch.ones_like(logp_new, dtype=log_ratio.dtype)
        corr[chosen[:, 0], chosen[:, 1]] = 0.0
    weights = corr if token_weights is None else corr * token_weights.detach().to(corr.dtype)
    loss, metrics = _clipped_surrogate(log_ratio, adv, response_mask, clip_low, clip_high, dual_clip, agg_mode,
                                       log_ratio, weights)
    metrics["cov_token_frac"] = float(masked_mean((corr == 0).to(corr.dtype), m))
    return loss, metrics


@register_policy_loss("kl_cov")
def kl_cov_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: float | None = None, agg_mode: str = "token-mean",
                token_weights: torch.Tensor | None = None, ratio: float = 2e-4,
                coef: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (module docstring): the unclipped surrogate -A r, plus coef * |logp_new - logp_old| on the k tokens
    of largest covariance. Returns (loss, metrics)."""
    _check(logp_new, logp_old, response_mask, clip_low, clip_high, dual_clip)
    adv = _token_advantages(advantages, response_mask)
    log_ratio = torch.clamp(logp_new - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    m = response_mask != 0
    with torch.no_grad():
        cov = token_covariance(adv, logp_new, response_mask).masked_fill(~m, -torch.inf)
        top = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        if m.any():
            top[torch.topk(cov.reshape(-1), _budget(ratio, m)).indices] = True
        top = top.view(m.shape)
    per_token = -adv * torch.exp(log_ratio) + coef * log_ratio.abs() * top.to(log_ratio.dtype)
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    loss = aggregate(per_token, response_mask, agg_mode)
    mf = m.to(log_ratio.dtype)
    return loss, {"pg_loss": float(loss.detach()), "pg_clip_frac": 0.0,
                  "approx_kl": float(masked_mean(-log_ratio.detach(), mf)),
                  "cov_token_frac": float(masked_mean(top.to(mf.dtype), mf))}
