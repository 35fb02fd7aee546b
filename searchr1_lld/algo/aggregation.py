"""Reduce a per-token loss matrix ``[B, T]`` to a scalar over the response mask.

Modes (verl names):
- ``token-mean``          : L = sum_{i,t} m l / sum_{i,t} m                       (every token weighs the same)
- ``seq-mean-token-mean`` : L = mean_{i in S} ( sum_t m l / sum_t m )             (every response weighs the same)
- ``seq-mean-token-sum``  : L = mean_{i in S} ( sum_t m l )                       (Dr. GRPO style, no length norm)
where S is the set of responses with at least one masked token (fully padded rows are not counted).

An all-zero mask gives 0, not NaN, and the result still depends on ``loss_mat`` so backward works (zero gradient).

``denominator`` (optional) replaces the normaliser (token count for ``token-mean``, response count for the seq modes)
so that micro-batches of one mini-batch can be normalised by the mini-batch total for exact gradient accumulation.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, with 0 where den == 0 (keeps num's graph)."""
    den = den.to(num.dtype)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), num * 0)


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *, denominator: float | None = None) -> torch.Tensor:
    """Scalar loss from ``loss_mat [B, T]`` and ``mask [B, T]`` (see the module docstring for the formulas)."""
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss_mat and mask must both be [B, T]; got {tuple(loss_mat.shape)} and {tuple(mask.shape)}")
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {list(AGG_MODES)}")
    m = mask.to(loss_mat.dtype)
    masked = loss_mat * m
    if mode == "token-mean":
        den = m.sum() if denominator is None else torch.tensor(float(denominator), device=loss_mat.device)
        return _safe_div(masked.sum(), den)
    tokens_per_seq = m.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        per_seq = _safe_div(masked.sum(dim=-1), tokens_per_seq)  # [B]
    else:
        per_seq = masked.sum(dim=-1)
    if denominator is None:
        den = (tokens_per_seq > 0).sum()
    else:
        den = torch.tensor(float(denominator), device=loss_mat.device)
    return _safe_div(per_seq.sum(), den)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / sum(mask), 0 when the mask is empty. Shapes must match."""
    m = mask.to(values.dtype)
    return _safe_div((values * m).sum(), m.sum())


def mini_batch_denominators(response_mask: torch.Tensor) -> tuple[float, float]:
    """(tokens, responses with at least one token) of a response mask ``[B, T]``: the N_tok and N_resp a mini-batch's
    loss divides by (algo/objective.py), or the n_tok and n_resp of one micro-batch."""
    per_row = (response_mask != 0).sum(dim=1)
    return float(per_row.sum()), float((per_row > 0).sum())
