"""Policy losses on the log-probability itself, each weighted per token by a factor that carries no gradient:

    l[i,t] = -w[i,t] * A[i,t] * logp_new[i,t],      loss = aggregate(tw * l, m, agg_mode)

so that d l / d logp_new = -w A (REINFORCE with a per-token weight). Registered in algo/policy_loss.py's table as
``gpg``, ``cispo``, ``dppo_tv`` and ``dppo_kl``; each equals verl 0.9.1's function of the same name
(``verl/trainer/ppo/core_algos.py``), checked by tests/test_methods_vs_verl.py.

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

For DPPO clip_low / clip_high are divergence thresholds, not ratio ranges (verl's example run: 0.15 for TV, 0.05 for
KL), and c = ``clip_ratio_c`` (``algorithm.dppo_tv`` / ``algorithm.dppo_kl``; verl's function default 20) truncates
the importance weight. dual_clip is accepted for the common interface and not used.

Metrics: pg_loss; pg_clip_frac (cispo: share of response tokens whose ratio was clipped; dppo: share outside the
trust region, valid = 0; gpg: 0); approx_kl = masked mean of -x (verl's ``ppo_kl``).
"""

from __future__ import annotations

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
