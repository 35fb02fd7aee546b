"""Rollout correction: truncated importance sampling (TIS) for the train/inference mismatch.

The rollout engine samples from pi_engine (bf16, its own kernels, vLLM's top-p renormalisation); the learner's
policy gradient assumes samples from pi_learner_old, whose log-probs it recomputes (``logp_old``). Truncated
importance sampling reweights each response token's policy-gradient term by the (capped) ratio of the two:

    token mode:     w[i, t] = min( exp(logp_old[i, t] - logp_engine[i, t]), C )
    sequence mode:  w[i, t] = min( exp( sum_s m[i, s] (logp_old[i, s] - logp_engine[i, s]) ), C )   for every t

on response tokens (m = 1); w = 1 elsewhere. Computed as exp(min(log-ratio, log C)), so it never overflows. The
weights carry no gradient (they multiply the per-token surrogate, as in verl's and TRL's TIS). C >= 1.

Shapes: logp_old, logp_engine, response_mask ``[B, T]`` -> weights ``[B, T]`` (float32).
"""

from __future__ import annotations

import math

import torch

MODES = ("token", "sequence")


def _log_ratio(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor,
               mode: str) -> torch.Tensor:
    """log of the uncapped ratio: [B, T] (token) or [B, 1] (sequence); 0 outside the response."""
    if not (logp_old.shape == logp_engine.shape == response_mask.shape) or logp_old.dim() != 2:
        raise ValueError(f"logp_old, logp_engine, response_mask must all be [B, T]; got {tuple(logp_old.shape)}, "
                         f"{tuple(logp_engine.shape)}, {tuple(response_mask.shape)}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    m = (response_mask != 0).float()
    diff = (logp_old.detach().float() - logp_engine.detach().float()) * m
    if mode == "token":
        return diff
    return diff.sum(dim=1, keepdim=True)


def tis_weights(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor, *,
                mode: str = "token", cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weights [B, T] (module docstring); 1 outside the response mask, no gradient."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    log_r = _log_ratio(logp_old, logp_engine, response_mask, mode)
    w = torch.exp(torch.clamp(log_r, max=math.log(cap))).expand_as(response_mask).clone()
    return torch.where(response_mask != 0, w, torch.ones_like(w))


def weight_stats(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor,
                 weights: torch.Tensor, *, mode: str, cap: float) -> dict[str, float]:
    """Logged next to ``rollout/engine_learner_logp_gap``, over response tokens (token) or responses (sequence):
    rollout/tis_weight_mean, _min, _max and rollout/tis_capped_frac (share where the uncapped ratio exceeded C)."""
    m = response_mask != 0
    if mode == "sequence":
        rows = m.any(dim=1)
        w = weights[:, 0][rows] if weights.shape[1] else weights.new_zeros(0)
        log_r = _log_ratio(logp_old, logp_engine, response_mask, mode)[:, 0][rows]
    else:
        w = weights[m]
        log_r = _log_ratio(logp_old, logp_engine, response_mask, mode)[m]
    if w.numel() == 0:
        return {}
    return {
        "rollout/tis_weight_mean": float(w.mean()),
        "rollout/tis_weight_min": float(w.min()),
        "rollout/tis_weight_max": float(w.max()),
        "rollout/tis_capped_frac": float((log_r > math.log(cap)).float().mean()),
    }
