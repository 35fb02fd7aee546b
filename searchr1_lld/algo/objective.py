"""The learner's objective on one micro-batch (GRPO + KL + entropy + LLDS), scaled so that summing the
micro-batch losses of a mini-batch (gradient accumulation) gives the mini-batch loss of ``loss_scale``.

For a mini-batch M split into K micro-batches, micro-batch k with response mask m ``[B_k, T]``:

    N_tok  = sum_{i in M, t} m[i,t]               (mini_tokens:    response tokens of the mini-batch)
    N_resp = |{ i in M : sum_t m[i,t] > 0 }|     (mini_responses: responses with at least one token)
    n_tok, n_resp                                 the same counts over micro-batch k alone

``algorithm.loss_scale`` picks the denominators D (aggregated terms) and D_LLDS (the token sums of LLDS and the
anchor); C is 1, or ``algorithm.seq_token_sum_norm`` for a mode normalised by a token budget
(``seq-mean-token-sum-norm``):
- ``mini-batch-token-mean`` (this project's default; later verl's): every term is a sum over micro-batch k divided by a
  mini-batch total, so the accumulated loss is the one-shot mini-batch loss however unevenly M was cut:
      D = N_tok for agg_mode "token-mean", N_resp * C for the seq-mean modes;   D_LLDS = N_tok
- ``micro-batch-mean`` (the authors' verl actor): every term is micro-batch k's own mean, divided by K, so the
  accumulated loss is the mean over micro-batches of their means (uneven micro-batches weigh their tokens unevenly):
      D = K * n_tok for "token-mean", K * n_resp * C for the seq-mean modes;    D_LLDS = K * n_tok

    L = pg                                       policy-gradient surrogate (PPO-clip or GSPO), aggregated over D
      - entropy_coef * agg(H, D)
      + kl_coef      * agg(KL(logp_new || logp_ref), D)
      + L_LLDS                                   sum m g c max(0, logp_old - logp_new) / D_LLDS   (algo.llds)
      + L_anchor                                 coef * sum m 1[A >= 0] (-logp_new) / D_LLDS       (algo.anchor)
      + any term registered after these          (algo.terms)

agg(x, D) is :func:`searchr1_lld.algo.aggregation.aggregate` with ``denominator=D``. The policy loss functions
normalise by the micro-batch count n (tokens or responses); it is rescaled by n / D, which is the same sum over D.
``token_weights`` ``[B, T]`` (optional, None = 1; e.g. truncated importance-sampling weights between the rollout
engine and the learner) are handed to the policy loss, which multiplies its per-token term by them.

A padding micro-batch (a rank with fewer micro-batches than its peers) is this loss times 0: same graph, zero
gradient. Pure tensor function: no I/O, no distributed calls.

The terms are the functions registered in :mod:`searchr1_lld.algo.terms` (policy loss, entropy, KL, LLDS, the
likelihood anchor, and any registered after them), added in registration order; each reads its own settings of
``alg`` (the run's ``algorithm`` config); autograd differentiates the sum. One implementation of each term: editing
or re-registering one changes what training optimises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from searchr1_lld.algo import aggregation, registry, terms
from searchr1_lld.algo.aggregation import mini_batch_denominators
from searchr1_lld.algo.terms import AlgorithmSettings, TermBatch

__all__ = ["LOSS_SCALES", "AlgorithmSettings", "TermBatch", "loss_denominators", "mini_batch_denominators",
           "objective", "sum_of_terms"]



@dataclass(frozen=True)
class MicroBatchCounts:
    """What a loss scale divides by, for one micro-batch: the mini-batch's and the micro-batch's counts."""

    mini_tokens: float  # N_tok
    mini_responses: float  # N_resp
    micro_tokens: float  # n_tok of the micro-batch (all its passes)
    micro_responses: float  # n_resp
    micro_batches: int  # K
    per_token_units: bool  # the aggregation mode sums over tokens (token-mean), not over responses
    budget: float  # C: 1, or algorithm.seq_token_sum_norm for a mode normalised by a token budget


# loss scale(counts) -> (D, D_LLDS), registered by the name ``algorithm.loss_scale`` gives it (module docstring)
LossScaleFn = Callable[[MicroBatchCounts], "tuple[float, float]"]
LOSS_SCALES: dict[str, LossScaleFn] = {}


@registry.register(LOSS_SCALES, "loss scale", "mini-batch-token-mean")
def mini_batch_token_mean(c: MicroBatchCounts) -> tuple[float, float]:
    """Every term a sum over the micro-batch divided by a mini-batch total: D = N_tok (token-mean) or N_resp * C,
    D_LLDS = N_tok."""
    return (c.mini_tokens if c.per_token_units else c.mini_responses * c.budget), c.mini_tokens


@registry.register(LOSS_SCALES, "loss scale", "micro-batch-mean")
def micro_batch_mean(c: MicroBatchCounts) -> tuple[float, float]:
    """Every term the micro-batch's own mean divided by K: D = K n_tok (token-mean) or K n_resp C, D_LLDS = K n_tok
    (an empty micro-batch gets D = K, which leaves its zero sums at 0)."""
    local = c.micro_tokens if c.per_token_units else c.micro_responses
    return c.micro_batches * max(local, 1.0) * c.budget, c.micro_batches * max(c.micro_tokens, 1.0)


def _check_aggregation(alg: AlgorithmSettings, mini_tokens: float, mini_responses: float, micro_batches: int) -> None:
    """The aggregation mode and loss scale are known and the denominators are positive."""
    aggregation.get_aggregation(alg.loss_agg_mode)
    registry.lookup(LOSS_SCALES, "loss scale", alg.loss_scale)
    if mini_tokens <= 0 or mini_responses <= 0:
        raise ValueError(f"mini-batch denominators must be > 0; got mini_tokens={mini_tokens}, mini_responses={mini_responses}")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1; got {micro_batches}")


def loss_denominators(alg: AlgorithmSettings, response_mask: torch.Tensor, *, mini_tokens: float,
                      mini_responses: float, micro_batches: int,
                      group: tuple[float, float] | None = None) -> tuple[float, float]:
    """(D, D_LLDS) of one micro-batch with response mask ``[B, T]`` under ``alg.loss_scale`` (module docstring).
    ``group``: (n_tok, n_resp) of the micro-batch this forward pass is a part of, when a micro-batch is run in
    several passes (default: this pass is the whole micro-batch). Under ``micro-batch-mean`` an empty micro-batch
    (no response token) gets D = K, which leaves its zero sums at 0."""
    agg = aggregation.get_aggregation(alg.loss_agg_mode)
    n_tok, n_resp = mini_batch_denominators(response_mask) if group is None else group
    counts = MicroBatchCounts(mini_tokens=mini_tokens, mini_responses=mini_responses, micro_tokens=n_tok,
                              micro_responses=n_resp, micro_batches=micro_batches, per_token_units=agg.unit == "tokens",
                              budget=float(alg.seq_token_sum_norm) if agg.per_token_budget else 1.0)
    return registry.lookup(LOSS_SCALES, "loss scale", alg.loss_scale)(counts)


def objective(
    alg: AlgorithmSettings,
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    mini_tokens: float,
    mini_responses: float,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    answer_mask: torch.Tensor | None = None,
    valid_searches_mean: float | None = None,
    token_weights: torch.Tensor | None = None,
    micro_batches: int = 1,
    micro_batch_counts: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Micro-batch loss L (module docstring) and its metrics: the sum of the registered terms, each with its own
    autograd graph and metrics.

    Args:
        alg: the run's algorithm settings (``AlgorithmConfig``); each term reads its own.
        logp_new: [B, T] current log-probs (carry the gradient). logp_old: [B, T] rollout-policy log-probs.
        advantages: [B] or [B, T] (token broadcast). response_mask: [B, T].
        mini_tokens, mini_responses: N_tok and N_resp of the whole mini-batch (:func:`mini_batch_denominators`).
        micro_batches: K, the number of micro-batches the mini-batch was cut into (``micro-batch-mean`` divides by it).
        micro_batch_counts: (n_tok, n_resp) of the whole micro-batch when these rows are one of its forward passes.
        logp_ref: [B, T] reference log-probs (KL term when given and alg.kl_coef > 0).
        entropy: [B, T] token entropies (entropy term when given and alg.entropy_coef != 0; carries gradient).
        answer_mask: [B, T] the final answer span, and valid_searches_mean the step's mean valid searches per
            response: what LLDS-MA reads (alg.llds.ma). token_weights: [B, T] per-token policy-gradient weights.

    Returns:
        (loss, metrics): metrics are micro-batch means over its response tokens -- pg_loss, pg_clip_frac, approx_kl
        (from the policy loss), kl_ref, entropy (when computed), and the ``llds/*`` and ``nll_anchor/*`` metrics of the
        terms that are on.
    """
    _check_aggregation(alg, mini_tokens, mini_responses, micro_batches)
    denom, token_denom = loss_denominators(alg, response_mask, mini_tokens=mini_tokens, mini_responses=mini_responses,
                                           micro_batches=micro_batches, group=micro_batch_counts)
    batch = TermBatch(logp_new=logp_new, logp_old=logp_old, advantages=advantages, response_mask=response_mask,
                      denominator=denom, token_denominator=token_denom, logp_ref=logp_ref, entropy=entropy,
                      answer_mask=answer_mask, valid_searches_mean=valid_searches_mean, token_weights=token_weights)
    return sum_of_terms(batch, alg)


def sum_of_terms(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """L = the sum of the values of the registered terms that are on (in registration order), and their metrics."""
    loss: torch.Tensor | None = None
    metrics: dict[str, float] = {}
    for term in terms.OBJECTIVE_TERMS.values():
        value, term_metrics = term(batch, alg)
        metrics.update(term_metrics)
        if value is not None:
            loss = value if loss is None else loss + value
    if loss is None:
        raise ValueError(f"no term of the objective is on (registered: {list(terms.OBJECTIVE_TERMS)})")
    return loss, metrics
