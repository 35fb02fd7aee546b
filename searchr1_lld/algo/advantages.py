"""GRPO outcome advantages: one scalar per response, normalised within its prompt group.

    A_i = (r_i - mean_{j in G(i)} r_j) / (std_{j in G(i)} r_j + eps)     norm_by_std=True  (GRPO)
    A_i =  r_i - mean_{j in G(i)} r_j                                   norm_by_std=False (Dr. GRPO)

std is the *unbiased* sample standard deviation (divide by |G| - 1) by default, as in verl / Search-R1's
``torch.std``; ``unbiased=False`` divides by |G|. A group with a single response has no baseline: its advantage is 0.
A group whose rewards are all equal gets advantage 0 (numerator 0).
"""

from __future__ import annotations

import torch


def grpo_outcome_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6, norm_by_std: bool = True, unbiased: bool = True
) -> torch.Tensor:
    """GRPO advantage ``[B]`` from outcome scores ``[B]`` and group ids ``[B]`` (any integers; vectorised)."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(f"scores and group_ids must both be [B]; got {tuple(scores.shape)} and {tuple(group_ids.shape)}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if scores.numel() == 0:
        return scores.clone()
    r = scores.detach().to(torch.float32 if not scores.is_floating_point() else scores.dtype)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros_like(count).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    if norm_by_std:
        sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
        dof = (count - 1).clamp(min=1) if unbiased else count
        std = (sq / dof).sqrt()
        adv = centred / (std[inverse] + eps)
    else:
        adv = centred
    singleton = (count == 1)[inverse]
    return torch.where(singleton, torch.zeros_like(adv), adv)


def broadcast_to_tokens(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B] -> [B, T]``: A[i, t] = adv[i] * response_mask[i, t] (0 outside the mask)."""
    if adv.dim() != 1 or response_mask.dim() != 2 or adv.shape[0] != response_mask.shape[0]:
        raise ValueError(f"expected adv [B] and response_mask [B, T]; got {tuple(adv.shape)} and {tuple(response_mask.shape)}")
    return adv[:, None] * response_mask.to(adv.dtype)


def check_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> None:
    """The advantages are ``[B]`` (one per response) or ``[B, T]`` (token broadcast) like ``response_mask [B, T]``;
    a ValueError naming both shapes otherwise."""
    if advantages.dim() == 1:
        if advantages.shape[0] != response_mask.shape[0]:
            raise ValueError(f"advantages [B] has B={advantages.shape[0]} but response_mask has "
                             f"B={response_mask.shape[0]}")
    elif advantages.shape != response_mask.shape:
        raise ValueError(f"advantages must be [B] or [B, T] like response_mask {tuple(response_mask.shape)}; "
                         f"got {tuple(advantages.shape)}")
