"""Which response tokens the loss trains on, beyond the response mask: two selections of TRL's GRPO trainer.

Shapes: response_mask, entropy ``[B, T]``; cut ``[B]`` bool. Pure tensor functions (no I/O, no distributed calls).

Responses cut off by a length limit (TRL 1.16 ``GRPOConfig.mask_truncated_completions``; DAPO's overlong filtering,
Yu et al. 2025, arXiv 2503.14476): such a response contributes no loss, so a reward it lost to the limit is not
learned from; the step zeroes its mask for the update (``algorithm.mask_truncated_responses``):

    m'[i, t] = m[i, t] * (1 - cut[i])

The high-entropy "forking" tokens (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939; TRL 1.16
``GRPOTrainer.get_high_entropy_mask`` with ``GRPOConfig.top_entropy_quantile`` = rho): the policy loss trains only on
the response tokens whose entropy is in the top rho share of the batch's response tokens,

    h*      = quantile({ H[i, t] : m[i, t] = 1 }, 1 - rho)      (torch.quantile, linear interpolation)
    s[i, t] = m[i, t] * 1[H[i, t] >= h*]

rho = 1 keeps every token; rho = 0 keeps the tokens of the largest entropy only. The entropies carry no gradient here.
"""

from __future__ import annotations

import torch


def mask_responses(response_mask: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """m' = m * (1 - cut[i]) ``[B, T]``: the rows of the responses marked ``cut`` ``[B]`` (bool) zeroed."""
    if cut.dim() != 1 or cut.shape[0] != response_mask.shape[0] or response_mask.dim() != 2:
        raise ValueError(f"need response_mask [B, T] and cut [B]; got {tuple(response_mask.shape)} and "
                         f"{tuple(cut.shape)}")
    return response_mask * (~cut.bool()).to(response_mask.dtype)[:, None]


@torch.no_grad()
def top_entropy_mask(entropy: torch.Tensor, response_mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """s ``[B, T]`` bool: the response tokens whose entropy is at least the (1 - ``quantile``) quantile of the
    entropies on ``response_mask`` (module docstring); all False when the mask is empty."""
    if entropy.shape != response_mask.shape or entropy.dim() != 2:
        raise ValueError(f"entropy and response_mask must both be [B, T]; got {tuple(entropy.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    m = response_mask != 0
    values = entropy.detach()[m].float()
    if values.numel() == 0:
        return torch.zeros_like(m)
    threshold = torch.quantile(values, 1.0 - quantile)
    return m & (entropy.detach().float() >= threshold)
