"""A plain likelihood anchor: the negative log-likelihood of the responses with a non-negative advantage, no gate.

The control a claim about LLDS needs (docs/design.md): it pulls up the likelihood of the same responses LLDS protects
(P = { i : A_i >= 0 }), on every one of their tokens, whether or not the update lowered it. For ``[B, T]`` tensors:

    L_anchor = coef * sum_{i,t} m[i,t] 1[i in P] (-logp_new[i,t]) / D         D = sum_{i,t} m[i,t] by default

normalised like L_LLDS (algo/llds.py: by all response tokens, so that micro-batches accumulate exactly with the
objective's D_LLDS), which makes its gradient on an anchored token, -coef / D, equal LLDS's on an active token at
coef = lambda. No counterpart in verl. The gradient flows only through ``logp_new``.
"""

from __future__ import annotations

import torch

from searchr1_lld.algo.llds import preserving_rows


def nll_anchor_loss(logp_new: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
                    coef: float, denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """L_anchor (module docstring) from logp_new ``[B, T]``, advantages ``[B]`` or ``[B, T]`` (token broadcast) and
    the response mask ``[B, T]``; ``denominator`` replaces sum m (micro-batch accumulation).

    Returns (loss, metrics): nll_anchor/loss (the value), nll_anchor/anchored_token_frac (share of response tokens in
    P-responses), nll_anchor/mean_nll (mean -logp_new over those tokens)."""
    if logp_new.shape != response_mask.shape or logp_new.dim() != 2:
        raise ValueError(f"logp_new and response_mask must both be [B, T]; got {tuple(logp_new.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if coef < 0:
        raise ValueError(f"the anchor's coef must be >= 0, got {coef}")
    m = response_mask.detach() != 0
    anchored = m & preserving_rows(advantages, m)[:, None]  # [B, T], constant
    w = anchored.to(logp_new.dtype)
    n_tok = m.sum().to(logp_new.dtype)
    den = n_tok if denominator is None else torch.tensor(float(denominator), dtype=logp_new.dtype,
                                                         device=logp_new.device)
    loss = coef * (w * -logp_new).sum() / torch.where(den > 0, den, torch.ones_like(den))
    with torch.no_grad():
        n_anchor = w.sum()
        metrics = {"nll_anchor/loss": float(loss.detach()),
                   "nll_anchor/anchored_token_frac": float(n_anchor / n_tok.clamp(min=1)),
                   "nll_anchor/mean_nll": float((w * -logp_new.detach()).sum() / n_anchor.clamp(min=1))}
    return loss, metrics
