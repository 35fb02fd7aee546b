"""The learner's objective on one micro-batch (GRPO + KL + entropy + LLDS), scaled so that summing the
micro-batch losses of a mini-batch (gradient accumulation) gives the mini-batch loss of ``loss_scale``.

For a mini-batch M split into K micro-batches, micro-batch k with response mask m ``[B_k, T]``:

    N_tok  = sum_{i in M, t} m[i,t]               (mini_tokens:    response tokens of the mini-batch)
    N_resp = |{ i in M : sum_t m[i,t] > 0 }|     (mini_responses: responses with at least one token)
    n_tok, n_resp                                 the same counts over micro-batch k alone

``loss_scale`` picks the denominators D (aggregated terms) and D_LLDS (the LLDS term):
- ``mini-batch-token-mean`` (this project's default; later verl's): every term is a sum over micro-batch k divided by a
  mini-batch total, so the accumulated loss is the one-shot mini-batch loss however unevenly M was cut:
      D = N_tok for agg_mode "token-mean", N_resp for the seq-mean modes;   D_LLDS = N_tok
- ``micro-batch-mean`` (the authors' verl actor): every term is micro-batch k's own mean, divided by K, so the
  accumulated loss is the mean over micro-batches of their means (uneven micro-batches weigh their tokens unevenly):
      D = K * n_tok for "token-mean", K * n_resp for the seq-mean modes;    D_LLDS = K * n_tok

    L = pg                                       policy-gradient surrogate (PPO-clip or GSPO), aggregated over D
      + kl_coef      * agg(KL(logp_new || logp_ref), D)
      - entropy_coef * agg(H, D)
      + L_LLDS                                   sum m g c max(0, logp_old - logp_new) / D_LLDS   (algo.llds)

agg(x, D) is :func:`searchr1_lld.algo.aggregation.aggregate` with ``denominator=D``. The policy loss functions
normalise by the micro-batch count n (tokens or responses); it is rescaled by n / D, which is the same sum over D.
``token_weights`` ``[B, T]`` (optional, None = 1; e.g. truncated importance-sampling weights between the rollout
engine and the learner) are handed to the policy loss, which multiplies its per-token term by them.

A padding micro-batch (a rank with fewer micro-batches than its peers) is this loss times 0: same graph, zero
gradient. Pure tensor function: no I/O, no distributed calls.

One implementation of each term, differentiated by autograd: the policy loss is looked up by name in the registry of
:mod:`searchr1_lld.algo.policy_loss` (``spec.policy_loss``), the KL term is :func:`searchr1_lld.algo.kl.kl_penalty`,
the aggregation :func:`searchr1_lld.algo.aggregation.aggregate` and the LLDS term
:func:`searchr1_lld.algo.llds.llds_loss`. Editing or re-registering one of them changes what training optimises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from searchr1_lld.algo import aggregation, kl, llds, policy_loss


@dataclass(frozen=True)
class ObjectiveSpec:
    """The coefficients and modes of the objective (a view of ``AlgorithmConfig``)."""

    policy_loss: str = "ppo_clip"  # a name registered in algo.policy_loss ("ppo_clip", "gspo", ...)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    llds_lam: float = 0.0  # 0 = LLDS off
    llds_gate: str = "action"
    llds_tau: float = 0.0
    loss_scale: str = "mini-batch-token-mean"  # or "micro-batch-mean" (module docstring)


LOSS_SCALES = ("mini-batch-token-mean", "micro-batch-mean")


def mini_batch_denominators(response_mask: torch.Tensor) -> tuple[float, float]:
    """(N_tok, N_resp) of a mini-batch's response mask ``[B, T]`` (module docstring)."""
    per_row = (response_mask != 0).sum(dim=1)
    return float(per_row.sum()), float((per_row > 0).sum())


def _check_aggregation(spec: ObjectiveSpec, mini_tokens: float, mini_responses: float, micro_batches: int) -> None:
    """The aggregation mode and loss scale are known and the denominators are positive."""
    if spec.agg_mode not in aggregation.AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {spec.agg_mode!r}; expected one of {list(aggregation.AGG_MODES)}")
    if spec.loss_scale not in LOSS_SCALES:
        raise ValueError(f"unknown loss scale {spec.loss_scale!r}; expected one of {list(LOSS_SCALES)}")
    if mini_tokens <= 0 or mini_responses <= 0:
        raise ValueError(f"mini-batch denominators must be > 0; got mini_tokens={mini_tokens}, mini_responses={mini_responses}")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1; got {micro_batches}")


def loss_denominators(spec: ObjectiveSpec, response_mask: torch.Tensor, *, mini_tokens: float, mini_responses: float,
                      micro_batches: int, group: tuple[float, float] | None = None) -> tuple[float, float]:
    """(D, D_LLDS) of one micro-batch with response mask ``[B, T]`` under ``spec.loss_scale`` (module docstring).
    ``group``: (n_tok, n_resp) of the micro-batch this forward pass is a part of, when a micro-batch is run in
    several passes (default: this pass is the whole micro-batch). Under ``micro-batch-mean`` an empty micro-batch
    (no response token) gets D = K, which leaves its zero sums at 0."""
    if spec.loss_scale == "mini-batch-token-mean":
        return (mini_tokens if spec.agg_mode == "token-mean" else mini_responses), mini_tokens
    n_tok, n_resp = mini_batch_denominators(response_mask) if group is None else group
    local = n_tok if spec.agg_mode == "token-mean" else n_resp
    return micro_batches * max(local, 1.0), micro_batches * max(n_tok, 1.0)


def objective(
    spec: ObjectiveSpec,
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
    lam_answer: float | None = None,
    token_weights: torch.Tensor | None = None,
    micro_batches: int = 1,
    micro_batch_counts: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Micro-batch loss L (module docstring) and its metrics, term by term: the registered policy loss, then the
    entropy, KL and LLDS terms, each with its own autograd graph and metrics.

    Args:
        spec: coefficients and modes.
        logp_new: [B, T] current log-probs (carry the gradient). logp_old: [B, T] rollout-policy log-probs.
        advantages: [B] or [B, T] (token broadcast). response_mask: [B, T].
        mini_tokens, mini_responses: N_tok and N_resp of the whole mini-batch (:func:`mini_batch_denominators`).
        micro_batches: K, the number of micro-batches the mini-batch was cut into (``micro-batch-mean`` divides by it).
        micro_batch_counts: (n_tok, n_resp) of the whole micro-batch when these rows are one of its forward passes.
        logp_ref: [B, T] reference log-probs (KL term when given and spec.kl_coef > 0).
        entropy: [B, T] token entropies (entropy term when given and spec.entropy_coef != 0; carries gradient).
        answer_mask, lam_answer: LLDS-MA (both or neither). token_weights: [B, T] per-token policy-gradient weights.

    Returns:
        (loss, metrics): metrics are micro-batch means over its response tokens -- pg_loss, pg_clip_frac, approx_kl
        (from the policy loss), kl_ref, entropy (when computed), and the ``llds/*`` metrics when LLDS is on.
    """
    _check_aggregation(spec, mini_tokens, mini_responses, micro_batches)
    n_tok, n_resp = mini_batch_denominators(response_mask)
    denom, llds_denom = loss_denominators(spec, response_mask, mini_tokens=mini_tokens, mini_responses=mini_responses,
                                          micro_batches=micro_batches, group=micro_batch_counts)
    local = n_tok if spec.agg_mode == "token-mean" else n_resp

    loss_fn = policy_loss.get_policy_loss_fn(spec.policy_loss)
    extra = {} if token_weights is None else {"token_weights": token_weights}
    pg, pg_m = loss_fn(logp_new, logp_old, advantages, response_mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
                       dual_clip=spec.dual_clip, agg_mode=spec.agg_mode, **extra)
    loss = pg * (local / denom)  # pg normalises by the micro-batch count `local`: rescaled to D
    metrics = {"pg_loss": pg_m["pg_loss"], "pg_clip_frac": pg_m["pg_clip_frac"], "approx_kl": pg_m["approx_kl"]}

    if entropy is not None:
        if spec.entropy_coef:
            loss = loss - spec.entropy_coef * aggregation.aggregate(entropy, response_mask, spec.agg_mode, denominator=denom)
        metrics["entropy"] = float(aggregation.masked_mean(entropy.detach(), response_mask))
    if logp_ref is not None:
        kl_tok = kl.kl_penalty(logp_new, logp_ref.detach(), spec.kl_type)
        if spec.kl_coef > 0:
            loss = loss + spec.kl_coef * aggregation.aggregate(kl_tok, response_mask, spec.agg_mode, denominator=denom)
        metrics["kl_ref"] = float(aggregation.masked_mean(kl_tok.detach(), response_mask))
    if spec.llds_lam > 0:
        l_llds, llds_m = llds.llds_loss(
            logp_new, logp_old, advantages, response_mask, gate=spec.llds_gate, lam=spec.llds_lam, tau=spec.llds_tau,
            answer_mask=answer_mask if lam_answer is not None else None, lam_answer=lam_answer,
            denominator=llds_denom,
        )
        loss = loss + l_llds
        metrics.update(llds_m)
    return loss, metrics

