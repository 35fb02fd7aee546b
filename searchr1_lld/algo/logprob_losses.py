"""Policy losses on the log-probability itself, each weighted per token by a factor that carries no gradient:

    l[i,t] = -w[i,t] * A[i,t] * logp_new[i,t],      loss = aggregate(tw * l, m, agg_mode)

so that d l / d logp_new = -w A (REINFORCE with a per-token weight). Registered in algo/policy_loss.py's table as
``gpg``, ``cispo``, ``dppo_tv``, ``dppo_kl`` and ``vespo``; the first four equal verl 0.9.1's function of the same name
(``verl/trainer/ppo/core_algos.py``), checked by tests/test_methods_vs_verl.py; vespo equals TRL 1.16's loss
(tests/test_methods_vs_trl.py).

Shapes: logp_new, logp_old, response_mask, token weights tw ``[B, T]`` (tw: rollout-correction weights, None = 1, no
gradient); advantages ``[B, T]`` or ``[B]``. With x = clamp(logp_new - logp_old, -20, 20) and r = exp(x):

    gpg      w = 1                                          (GPG, Chu et al. 2025, arXiv 2504.02546;
                                                             verl ``compute_policy_loss_gpg``). Registered as
                                                             ``reinforce`` too: verl's
                                                             ``compute_policy_loss_reinforce``, the loss of its
                                                             bypass REINFORCE presets (algo/rollout_correction.py)
    cispo    w = sg(clip(r, 1 - clip_low, 1 + clip_high))   (CISPO, MiniMax-M1, arXiv 2506.13585;
                                                             verl ``compute_policy_loss_cispo``). clip_low >= 1
                                                             removes the lower bound (verl's example: clip_low 10,
                                                             clip_high 0.2)
    dppo_tv  w = sg(min(r, c)) * valid,  p = exp(logp_new), q = exp(logp_old):
                 valid = p - q <= clip_high          where A > 0
                         p - q >= -clip_low          where A <= 0
                                                            (DPPO-Binary-TV, arXiv 2602.04879;
                                                             verl ``compute_policy_loss_dppo_tv``)
    dppo_kl  w = sg(min(r, c)) * valid, with the binary KL
                 D = q (logp_old - logp_new) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)):
                 valid = D <= clip_high or p <= q    where A > 0
                         D <= clip_low  or p >= q    where A <= 0
                                                            (DPPO-Binary-KL, arXiv 2602.04879;
                                                             verl ``compute_policy_loss_dppo_kl``)
    vespo    w = sg(phi(W_i)), one weight per response from its sequence ratio W_i (VESPO, arXiv 2602.10693;
             TRL 1.16 ``GRPOTrainer.get_gamma_weights``, ``loss_type="vespo"``):
                 log W_i = clamp( sum_t m x, log 1e-8, 20 )           (a sum over the response, not a mean)
                 phi(W)  = exp( lam + k log W - lam W ) = e^lam W^k e^(-lam W)     (phi(1) = 1, no gradient)
                 (k, lam) = (k_pos, lambda_pos) where A >= 0, (k_neg, lambda_neg) where A < 0
                 (``algorithm.vespo``; TRL's defaults 2, 3, 3, 2); a non-finite phi counts as 0, as TRL's.
             A smooth, asymmetric Gamma-shaped weight in place of the ratio clip: near 1 on-policy, fading for
             responses whose likelihood moved far either way. TRL aggregates it by token-mean over the global batch
             (its ``dapo`` normalisation; the preset ``vespo`` pins ``token-mean``). TRL folds its own token-level
             sampler ratios (vLLM importance sampling) into W; here rollout-correction weights tw multiply each
             token's term, as for every other loss.

For DPPO clip_low / clip_high are divergence thresholds, not ratio ranges (verl's example run: 0.15 for TV, 0.05 for
KL), and c = ``clip_ratio_c`` (``algorithm.dppo_tv`` / ``algorithm.dppo_kl``; verl's function default 20) truncates
the importance weight. dual_clip is accepted for the common interface and not used.

Metrics: pg_loss; pg_clip_frac (cispo: share of response tokens whose ratio was clipped; dppo: share outside the
trust region, valid = 0; gpg, vespo: 0); approx_kl = masked mean of -x (verl's ``ppo_kl``); vespo_phi_mean (vespo: the
masked token mean of phi, each response's weight counted on each of its tokens; TRL's ``vespo/phi_seq_mean`` is the
mean over responses).
"""

from __future__ import annotations

import math

import torch

from searchr1_lld.algo.aggregation import aggregate, masked_mean
from searchr1_lld.algo.policy_loss import (LOG_RATIO_CLAMP, _token_advantages, apply_token_weights, check_shapes,
                                           register_policy_loss)


def _positive(**values: float) -> None:
    bad = {k: v for k, v in values.items() if not v > 0}
    if bad:
        raise ValueError(f"must be > 0: {bad}")


def _weighted_logprob_loss(weight: torch.Tensor, adv: torch.Tensor, logp_new: torch.Tensor, log_ratio: torch.Tensor,
                           response_mask: torch.Tensor, agg_mode: str, token_weights: torch.Tensor | None,
                           outside: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """aggregate(tw * (-sg(weight) A logp_new), m) and the metrics (module docstring); ``outside`` ``[B, T]`` bool
    marks the tokens counted by pg_clip_frac."""
    per_token = -weight.detach() * adv * logp_new
    loss = aggregate(apply_token_weights(per_token, token_weights, response_mask), response_mask, agg_mode)
    mf = (response_mask != 0).to(logp_new.dtype)
    return loss, {"pg_loss": float(loss.detach()),
                  "pg_clip_frac": float(masked_mean(outside.to(mf.dtype), mf)),
                  "approx_kl": float(masked_mean(-log_ratio.detach(), mf))}


def _log_ratio(logp_new: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    return torch.clamp(logp_new - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register_policy_loss("reinforce")
@register_policy_loss("gpg")
def gpg_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
             *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
             agg_mode: str = "token-mean", token_weights: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: l = -A logp_new, no ratio and no clip (module docstring; the clip ranges are not used). Returns (loss,
    metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    adv = _token_advantages(advantages, response_mask)
    log_ratio = _log_ratio(logp_new, logp_old)
    return _weighted_logprob_loss(torch.ones_like(logp_new), adv, logp_new, log_ratio, response_mask, agg_mode,
                                  token_weights, torch.zeros_like(response_mask, dtype=torch.bool))


@register_policy_loss("cispo")
def cispo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
               *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
               agg_mode: str = "token-mean", token_weights: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: l = -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp_new (module docstring). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    _positive(clip_low=clip_low, clip_high=clip_high)
    adv = _token_advantages(advantages, response_mask)
    log_ratio = _log_ratio(logp_new, logp_old)
    ratio = torch.exp(log_ratio.detach())
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return _weighted_logprob_loss(clipped, adv, logp_new, log_ratio, response_mask, agg_mode, token_weights,
                                  ratio != clipped)


def _dppo(valid: torch.Tensor, logp_new: torch.Tensor, log_ratio: torch.Tensor, adv: torch.Tensor,
          response_mask: torch.Tensor, agg_mode: str, token_weights: torch.Tensor | None, clip_ratio_c: float
          ) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO's loss from its trust-region mask ``valid`` ``[B, T]`` bool: w = sg(min(r, c)) * valid."""
    if not clip_ratio_c > 0:
        raise ValueError(f"clip_ratio_c must be > 0, got {clip_ratio_c}")
    weight = torch.clamp(torch.exp(log_ratio.detach()), max=clip_ratio_c) * valid.to(logp_new.dtype)
    return _weighted_logprob_loss(weight, adv, logp_new, log_ratio, response_mask, agg_mode, token_weights, ~valid)


@register_policy_loss("dppo_tv")
def dppo_tv_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, *, clip_low: float = 0.15, clip_high: float = 0.15,
                 dual_clip: float | None = None, agg_mode: str = "token-mean",
                 token_weights: torch.Tensor | None = None, clip_ratio_c: float = 20.0
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: -sg(min(r, c)) A logp_new on the tokens whose probability moved by at most clip_high up
    (A > 0) or clip_low down (A <= 0); 0 elsewhere (module docstring). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    _positive(clip_low=clip_low, clip_high=clip_high)
    adv = _token_advantages(advantages, response_mask)
    with torch.no_grad():
        moved = torch.exp(logp_new) - torch.exp(logp_old)
        valid = torch.where(adv > 0, moved <= clip_high, moved >= -clip_low)
    return _dppo(valid, logp_new, _log_ratio(logp_new, logp_old), adv, response_mask, agg_mode, token_weights,
                 clip_ratio_c)


@register_policy_loss("dppo_kl")
def dppo_kl_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, *, clip_low: float = 0.05, clip_high: float = 0.05,
                 dual_clip: float | None = None, agg_mode: str = "token-mean",
                 token_weights: torch.Tensor | None = None, clip_ratio_c: float = 20.0
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: -sg(min(r, c)) A logp_new on the tokens whose binary KL stays within clip_high (A > 0) or
    clip_low (A <= 0), or that moved the other way; 0 elsewhere (module docstring). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    _positive(clip_low=clip_low, clip_high=clip_high)
    adv = _token_advantages(advantages, response_mask)
    with torch.no_grad():
        p, q = torch.exp(logp_new), torch.exp(logp_old)
        binary_kl = q * (logp_old - logp_new) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
        valid = torch.where(adv > 0, (binary_kl <= clip_high) | (p <= q), (binary_kl <= clip_low) | (p >= q))
    return _dppo(valid, logp_new, _log_ratio(logp_new, logp_old), adv, response_mask, agg_mode, token_weights,
                 clip_ratio_c)


@torch.no_grad()
def gamma_weights(log_ratio: torch.Tensor, adv: torch.Tensor, response_mask: torch.Tensor, *, k_pos: float,
                  lambda_pos: float, k_neg: float, lambda_neg: float) -> torch.Tensor:
    """VESPO's phi(W_i) on every token of response i, ``[B, T]`` (module docstring); ``log_ratio`` = x ``[B, T]``
    (clamped to [-20, 20]), ``adv`` ``[B, T]``. No gradient."""
    m = (response_mask != 0).to(log_ratio.dtype)
    log_w = torch.clamp((log_ratio * m).sum(dim=-1, keepdim=True), math.log(1e-8), 20.0)  # [B, 1]
    nonneg = adv >= 0
    k = torch.where(nonneg, torch.full_like(adv, k_pos), torch.full_like(adv, k_neg))
    lam = torch.where(nonneg, torch.full_like(adv, lambda_pos), torch.full_like(adv, lambda_neg))
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_policy_loss("vespo")
def vespo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
               *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
               agg_mode: str = "token-mean", token_weights: torch.Tensor | None = None, k_pos: float = 2.0,
               lambda_pos: float = 3.0, k_neg: float = 3.0, lambda_neg: float = 2.0
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """VESPO: l = -sg(phi(W_i)) A logp_new, phi the Gamma weight of the response's sequence ratio W_i (module
    docstring; the clip ranges are not used). Returns (loss, metrics)."""
    check_shapes(logp_new, logp_old, response_mask)
    _positive(lambda_pos=lambda_pos, lambda_neg=lambda_neg)
    if not (k_pos >= 0 and k_neg >= 0):
        raise ValueError(f"k_pos and k_neg must be >= 0; got {k_pos}, {k_neg}")
    adv = _token_advantages(advantages, response_mask)
    log_ratio = _log_ratio(logp_new, logp_old)
    phi = gamma_weights(log_ratio, adv, response_mask, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                        lambda_neg=lambda_neg)
    loss, metrics = _weighted_logprob_loss(phi, adv, logp_new, log_ratio, response_mask, agg_mode, token_weights,
                                           torch.zeros_like(response_mask, dtype=torch.bool))
    metrics["vespo_phi_mean"] = float(masked_mean(phi, (response_mask != 0).to(phi.dtype)))
    return loss, metrics
