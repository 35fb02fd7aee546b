"""Policy-gradient surrogates: PPO-clip (token ratio, optional dual-clip) and GSPO (sequence ratio).

Shapes: logp_new, logp_old, response_mask ``[B, T]``; advantages ``[B, T]`` (token broadcast) or ``[B]``.

PPO-clip, per token, with r = exp(logp_new - logp_old) (log-ratio clamped to [-20, 20] before exp for safety):
    l1 = -A r,   l2 = -A clip(r, 1 - clip_low, 1 + clip_high),   l = max(l1, l2)
    dual-clip (c > 1, only where A < 0):  l = min(l, -A c)
    loss = aggregate(l, m, agg_mode)

Optional per-token weights w ``[B, T]`` (e.g. the rollout-correction weights of algo/rollout_correction.py; None =
1 everywhere; no gradient flows through them) multiply the per-token loss before aggregation:
    loss = aggregate(w * l, m, agg_mode)

GSPO (Zheng et al. 2025), sequence-level length-normalised ratio
    s_i = exp( sum_t m (logp_new - logp_old) / sum_t m )
made token-level with the stop-gradient trick so that the gradient still flows per token:
    log r_{i,t} = sg(log s_i) + logp_new[i,t] - sg(logp_new[i,t])
(value of r_{i,t} is s_i for every token of response i; d r_{i,t} / d logp_new[i,t] = s_i), then the same clipped
surrogate and aggregation as PPO-clip. The GSPO paper uses much smaller clip ranges (about 3e-4 / 4e-4) and
"seq-mean-token-mean" aggregation; pass them explicitly.

Other losses register themselves in the same table from their own modules: algo/covariance_losses.py (Clip-Cov,
KL-Cov), algo/logprob_losses.py (GPG, CISPO, DPPO-TV / DPPO-KL: the log-probability times a constant weight) and
algo/ratio_losses.py (SAPO's soft gate, GMPO's geometric mean).

Registry: every loss is registered by name (``@register_policy_loss("name")``) and looked up with
:func:`get_policy_loss_fn` (``algorithm.policy_loss`` in the config names it), so a new loss is one decorated function
here and never touches the objective or the trainer. A loss takes (logp_new, logp_old, advantages, response_mask) and
the keywords clip_low, clip_high, dual_clip, agg_mode, token_weights, and returns (loss, metrics with at least
pg_loss, pg_clip_frac, approx_kl).

Metrics (floats): pg_loss, pg_clip_frac (fraction of response tokens where the clipped branch is active, i.e. l2 > l1),
dual_clip_frac (fraction of response tokens where the dual clip bound is active), approx_kl = masked mean of
k1 = logp_old - logp_new (old vs new; as verl's ``ppo_kl``), approx_kl_k3 = masked mean of k3 =
exp(logp_new - logp_old) - (logp_new - logp_old) - 1 (non-negative), ratio_mean, ratio_max.
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry
from searchr1_lld.algo.advantages import check_advantages
from searchr1_lld.algo.aggregation import aggregate, masked_mean
from searchr1_lld.algo.step_metrics import Max

LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn`` as the policy loss ``name`` (a name may be registered once)."""
    return registry.register(POLICY_LOSSES, "policy loss", name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; a clear error listing the known names otherwise."""
    return registry.lookup(POLICY_LOSSES, "policy loss", name)


def _token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` advantages (detached) from ``[B]`` or token-broadcast ``[B, T]`` ones."""
    check_advantages(advantages, response_mask)
    if advantages.dim() == 1:
        return advantages.detach()[:, None].expand_as(response_mask)
    return advantages.detach()


def check_shapes(logp_new: torch.Tensor, logp_old: torch.Tensor, response_mask: torch.Tensor) -> None:
    """logp_new, logp_old and response_mask are all ``[B, T]``; a ValueError naming the three shapes otherwise."""
    if not (logp_new.shape == logp_old.shape == response_mask.shape) or logp_new.dim() != 2:
        raise ValueError(
            f"logp_new, logp_old, response_mask must all be [B, T]; got {tuple(logp_new.shape)}, "
            f"{tuple(logp_old.shape)}, {tuple(response_mask.shape)}"
        )


def apply_token_weights(per_token: torch.Tensor, token_weights: torch.Tensor | None,
                        response_mask: torch.Tensor) -> torch.Tensor:
    """w * l ``[B, T]`` (w detached; None = 1 everywhere: ``per_token`` itself)."""
    if token_weights is None:
        return per_token
    if token_weights.shape != response_mask.shape:
        raise ValueError(f"token_weights must be [B, T] like response_mask {tuple(response_mask.shape)}; "
                         f"got {tuple(token_weights.shape)}")
    return per_token * token_weights.detach().to(per_token.dtype)


def _check(logp_new: torch.Tensor, logp_old: torch.Tensor, response_mask: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    check_shapes(logp_new, logp_old, response_mask)
    if not (0 < clip_low < 1) or clip_high <= 0:
        raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0; got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")


def _clipped_surrogate(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    agg_mode: str,
    kl_log_ratio: torch.Tensor,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(l1, l2)
    if dual_clip is not None:
        l3 = -adv * dual_clip
        dual_active = (adv < 0) & (l3 < clipped)
        per_token = torch.where(adv < 0, torch.minimum(clipped, l3), clipped)
    else:
        dual_active = torch.zeros_like(response_mask, dtype=torch.bool)
        per_token = clipped
    per_token = apply_token_weights(per_token, token_weights, response_mask)
    loss = aggregate(per_token, response_mask, agg_mode)
    with torch.no_grad():
        m = response_mask != 0
        mf = m.to(log_ratio.dtype)
        kl_x = kl_log_ratio.detach()  # logp_new - logp_old
        metrics = {
            "pg_loss": float(loss.detach()),
            "pg_clip_frac": float(masked_mean((l2 > l1).to(mf.dtype), mf)),
            "dual_clip_frac": float(masked_mean(dual_active.to(mf.dtype), mf)),
            "approx_kl": float(masked_mean(-kl_x, mf)),
            "approx_kl_k3": float(masked_mean(torch.exp(kl_x) - kl_x - 1, mf)),
            "ratio_mean": float(masked_mean(ratio.detach(), mf)),
            "ratio_max": Max(torch.where(m, ratio.detach(), torch.zeros_like(ratio)).max()) if m.any() else Max(0.0),
        }
    return loss, metrics


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg_mode: str = "token-mean",
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with a token-level ratio (module docstring). Returns (loss, metrics)."""
    _check(logp_new, logp_old, response_mask, clip_low, clip_high, dual_clip)
    adv = _token_advantages(advantages, response_mask)
    log_ratio = torch.clamp(logp_new - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return _clipped_surrogate(log_ratio, adv, response_mask, clip_low, clip_high, dual_clip, agg_mode, log_ratio,
                              token_weights)


@register_policy_loss("gspo")
def gspo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg_mode: str = "token-mean",
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO surrogate: length-normalised sequence ratio, token-level via stop-gradient (module docstring)."""
    _check(logp_new, logp_old, response_mask, clip_low, clip_high, dual_clip)
    adv = _token_advantages(advantages, response_mask)
    m = (response_mask != 0).to(logp_new.dtype)
    token_log_ratio = logp_new - logp_old.detach()
    seq_log_ratio = (token_log_ratio * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)  # [B]
    log_ratio = seq_log_ratio.detach()[:, None] + logp_new - logp_new.detach()
    log_ratio = torch.clamp(log_ratio, max=LOG_RATIO_CLAMP)
    return _clipped_surrogate(log_ratio, adv, response_mask, clip_low, clip_high, dual_clip, agg_mode, token_log_ratio,
                              token_weights)
