"""Reduce a per-token loss matrix ``[B, T]`` to a scalar over the response mask.

Modes (verl names), each registered by name (``algorithm.loss_agg_mode``):
- ``token-mean``              : L = sum_{i,t} m l / sum_{i,t} m                   (every token weighs the same)
- ``seq-mean-token-mean``     : L = mean_{i in S} ( sum_t m l / sum_t m )         (every response weighs the same)
- ``seq-mean-token-sum``      : L = mean_{i in S} ( sum_t m l )                   (no length normalisation)
- ``seq-mean-token-sum-norm`` : L = sum_{i,t} m l / (|S| * C)                     (Dr. GRPO: a constant C in place
                                                                                   of each response's length)
where S is the set of responses with at least one masked token (fully padded rows are not counted) and C defaults to
T, the loss matrix's width (verl's default ``loss_scale_factor``); the learner passes a constant C
(``algorithm.seq_token_sum_norm``) through ``denominator`` so that C does not depend on a micro-batch's padding.

An all-zero mask gives 0, not NaN, and the result still depends on ``loss_mat`` so backward works (zero gradient).

``denominator`` (optional) replaces the normaliser (the token count for ``token-mean``, |S| for the seq modes,
|S| * C for ``seq-mean-token-sum-norm``) so that micro-batches of one mini-batch can be normalised by the mini-batch
total for exact gradient accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from searchr1_lld.algo import registry


@dataclass(frozen=True)
class Aggregation:
    """One mode: ``reduce(masked loss [B, T], mask [B, T] float) -> (numerator, normaliser)`` (0-dim tensors), and
    what the normaliser counts (``unit``: tokens or responses; ``per_token_budget``: responses times a token constant
    C) so that the objective can name the mini-batch's normaliser (algo/objective.py)."""

    reduce: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    unit: Literal["tokens", "responses"]
    per_token_budget: bool = False


AGGREGATIONS: dict[str, Aggregation] = {}


def register_aggregation(name: str, unit: Literal["tokens", "responses"], per_token_budget: bool = False):
    """Decorator: register ``reduce`` as the aggregation mode ``name`` (:class:`Aggregation`)."""
    def decorate(fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        registry.register(AGGREGATIONS, "loss aggregation mode", name)(Aggregation(fn, unit, per_token_budget))
        return fn
    return decorate


def get_aggregation(name: str) -> Aggregation:
    """The aggregation mode registered as ``name``; a clear error listing the known names otherwise."""
    return registry.lookup(AGGREGATIONS, "loss aggregation mode", name)


def _responses(m: torch.Tensor) -> torch.Tensor:
    """|S|: the rows of the mask ``[B, T]`` with at least one token."""
    return (m.sum(dim=-1) > 0).sum()


@register_aggregation("token-mean", "tokens")
def token_mean(masked: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_{i,t} m l, sum_{i,t} m)."""
    return masked.sum(), m.sum()


@register_aggregation("seq-mean-token-mean", "responses")
def seq_mean_token_mean(masked: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_i sum_t m l / sum_t m, |S|)."""
    return _safe_div(masked.sum(dim=-1), m.sum(dim=-1)).sum(), _responses(m)


@register_aggregation("seq-mean-token-sum", "responses")
def seq_mean_token_sum(masked: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_{i,t} m l, |S|)."""
    return masked.sum(), _responses(m)


@register_aggregation("seq-mean-token-sum-norm", "responses", per_token_budget=True)
def seq_mean_token_sum_norm(masked: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_{i,t} m l, |S| * T) with T = the matrix's width (the default C)."""
    return masked.sum(), _responses(m) * m.shape[-1]


AGG_MODES = tuple(AGGREGATIONS)  # the built-in names, in the order above


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, with 0 where den == 0 (keeps num's graph)."""
    den = den.to(num.dtype)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), num * 0)


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *, denominator: float | None = None) -> torch.Tensor:
    """Scalar loss from ``loss_mat [B, T]`` and ``mask [B, T]`` (see the module docstring for the formulas)."""
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss_mat and mask must both be [B, T]; got {tuple(loss_mat.shape)} and {tuple(mask.shape)}")
    agg = get_aggregation(mode)
    m = mask.to(loss_mat.dtype)
    num, den = agg.reduce(loss_mat * m, m)
    if denominator is not None:
        den = torch.tensor(float(denominator), device=loss_mat.device)
    return _safe_div(num, den)


def default_denominator(mask: torch.Tensor, mode: str) -> float:
    """The normaliser :func:`aggregate` divides by when no ``denominator`` is given (mask ``[B, T]``)."""
    m = mask.to(torch.float32)
    return float(get_aggregation(mode).reduce(m * 0, m)[1])


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / sum(mask), 0 when the mask is empty. Shapes must match."""
    m = mask.to(values.dtype)
    return _safe_div((values * m).sum(), m.sum())


def mini_batch_denominators(response_mask: torch.Tensor) -> tuple[float, float]:
    """(tokens, responses with at least one token) of a response mask ``[B, T]``: the N_tok and N_resp a mini-batch's
    loss divides by (algo/objective.py), or the n_tok and n_resp of one micro-batch."""
    per_row = (response_mask != 0).sum(dim=1)
    return float(per_row.sum()), float((per_row > 0).sum())
