"""Surrogates on the probability ratio other than PPO's hard token clip: SAPO's soft gate and GMPO's geometric mean.
Registered in algo/policy_loss.py's table as ``sapo`` and ``geo_mean``; each equals verl 0.9.1's function
(``verl/trainer/ppo/core_algos.py``), checked by tests/test_methods_vs_verl.py.

Shapes: logp_new, logp_old, response_mask, token weights tw ``[B, T]`` (rollout-correction weights, None = 1, no
gradient); advantages ``[B, T]`` or ``[B]``; x = logp_new - logp_old; m the response mask; n_i = sum_t m[i,t].

SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025, arXiv 2511.20347; verl ``compute_policy_loss_sapo``):
the clip becomes a smooth gate whose slope is 1 at r = 1 and fades away from it,
    r = exp(clamp(x, -20, 20)),  tau = tau_pos where A > 0, tau_neg where A <= 0
    f(r) = sigmoid(tau (r - 1)) * 4 / tau,      l = -f(r) A,     loss = aggregate(tw * l, m, agg_mode)
(verl aggregates SAPO with seq-mean-token-mean whatever its loss_agg_mode; the preset ``sapo`` pins that mode).
tau_pos, tau_neg: ``algorithm.sapo`` (verl's defaults 1.0 and 1.05).

GMPO (Geometric-Mean Policy Optimization, Zhao et al. 2025, arXiv 2507.20673; verl ``compute_policy_loss_geo_mean``):
one ratio per response, the geometric mean of its clipped token ratios, clipped in log space on the side the
advantage's sign makes harmful (s = sign(A)):
    x'[i,t] = s * min(s x, s clamp(x, -clip_low, clip_high))      (A > 0: min(x, clip_high); A < 0: max(x, -clip_low))
    R_i = exp( sum_t m x' / (n_i + 1e-8) ),   A_i = sum_t m A / (n_i + 1e-8),   L_i = -A_i R_i
    with token weights: L_i *= exp( sum_t m log(tw + 1e-10) / (n_i + 1e-8) )   (their geometric mean, as verl)
    loss = aggregate(L_i on every token of response i, m, agg_mode)
With seq-mean-token-mean (the preset ``gmpo``) the loss is mean_i L_i over the responses with tokens: verl's
``torch.mean(pg_losses)`` whenever no row is fully padded. The paper's clip range is 0.4 on both sides (e^-0.4,
e^0.4); x is not clamped (as verl). dual_clip is accepted for the common interface and not used by either loss.

Metrics: pg_loss; pg_clip_frac (SAPO: 0, nothing is clipped; GMPO: share of response tokens where the clipped
branch is active, x' != x); approx_kl = masked mean of -x (verl's ``ppo_kl``).
"""

from __future__ import annotations

import torch

from searchr1_lld.algo.aggregation import aggregate, masked_mean
from searchr1_lld.algo.policy_loss import (LOG_RATIO_CLAMP, _token_advantages, apply_token_weights, check_shapes,
                                           register_policy_loss)


def _metrics(loss: torch.Tensor, log_ratio: torch.Tensor, response_mask: torch.Tensor,
             clipped: torch.Tensor) -> dict[str, float]:
    mf = (response_mask != 0).to(log_ratio.dtype)
    return {"pg_loss": float(loss.detach()), "pg_clip_frac": float(masked_mean(clipped.to(mf.dtype), mf)),
            "approx_kl": float(masked_mean(-log_ratio.detach(), mf))}


@register_policy_loss("sapo")
def sapo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
              *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
              agg_mode: str = "seq-mean-token-mean", token_weights: torch.Tensor | None = None,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: l = -sigmoid(tau (r - 1)) * 4 / tau * A, tau = tau_pos (A > 0) or tau_neg (module docstring; the clip
    ranges are not used). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0; got {tau_pos}, {tau_neg}")
    adv = _token_advantages(advantages, response_mask)
    log_ratio = torch.clamp(logp_new - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    loss = aggregate(apply_token_weights(-gate * adv, token_weights, response_mask), response_mask, agg_mode)
    return loss, _metrics(loss, log_ratio, response_mask, torch.zeros_like(response_mask, dtype=torch.bool))


@register_policy_loss("geo_mean")
def geo_mean_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, *, clip_low: float = 0.4, clip_high: float = 0.4,
                  dual_clip: float | None = None, agg_mode: str = "seq-mean-token-mean",
                  token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO: L_i = -A_i * exp(mean_t of the sign-clipped log-ratios of response i), the same L_i on each of its
    tokens, aggregated (module docstring). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    if not (clip_low > 0 and clip_high > 0):
        raise ValueError(f"clip_low and clip_high must be > 0; got {clip_low}, {clip_high}")
    adv = _token_advantages(advantages, response_mask)
    m = (response_mask != 0).to(logp_new.dtype)
    n = m.sum(dim=-1) + 1e-8  # [B]
    log_ratio = logp_new - logp_old.detach()
    sign = torch.sign(adv)
    clipped_side = sign * torch.minimum(sign * log_ratio, sign * torch.clamp(log_ratio, -clip_low, clip_high))
    seq_ratio = torch.exp((clipped_side * m).sum(dim=-1) / n)  # [B]
    seq_loss = -(adv * m).sum(dim=-1) / n * seq_ratio  # [B]
    if token_weights is not None:
        log_w = torch.log(apply_token_weights(torch.ones_like(m), token_weights, response_mask) + 1e-10)
        seq_loss = seq_loss * torch.exp((log_w * m).sum(dim=-1) / n)
    loss = aggregate(seq_loss[:, None].expand_as(m), response_mask, agg_mode)
    clipped = (clipped_side.detach() != log_ratio.detach()) & (adv != 0)
    return loss, _metrics(loss, log_ratio, response_mask, clipped)
