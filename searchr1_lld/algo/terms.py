"""The terms of the objective: each a registered pure function of one micro-batch's tensors (algo/objective.py adds
them up; autograd differentiates the sum).

    L = sum, over the registered terms in registration order, of term(batch, spec)

The built-in terms (D and D_LLDS are the denominators of algo/objective.py):

    policy_loss   pg * n / D                                 the policy loss registered as spec.policy_loss
    entropy       - entropy_coef * agg(H, D)                 H: token entropies
    kl            + kl_coef * agg(KL(logp_new || logp_ref), D)   estimator spec.kl_type (algo/kl.py)
    llds          + L_LLDS, normalised by D_LLDS              algo/llds.py

A term is ``term(batch: TermBatch, spec: ObjectiveSpec) -> (value, metrics)``: ``value`` a 0-dim tensor added to the
loss, or None when the term is off (coefficient 0, or its input not given); ``metrics`` floats merged into the
objective's. ``@register_term("name")`` adds a term to every objective. Its settings are the algorithm config's
entry of the same name (``algorithm.<name>``), which the term reads as ``spec.settings("name")``: a new regulariser
is one function, one config entry and one test, with no edit to :class:`ObjectiveSpec`, the objective or the learner.
(The built-in terms read the fields of :class:`ObjectiveSpec`, which predate this.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from searchr1_lld.algo import kl, llds, policy_loss, registry
from searchr1_lld.algo.aggregation import aggregate, masked_mean, mini_batch_denominators


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
    loss_scale: str = "mini-batch-token-mean"  # or "micro-batch-mean" (algo/objective.py)
    # the algorithm config's entries by name: where a term registered beyond the built-in ones finds its settings,
    # under its own name (:meth:`settings`)
    term_settings: Mapping[str, Any] = field(default_factory=dict)

    def settings(self, term: str) -> Any:
        """The settings of the term registered as ``term``: the algorithm config's entry of that name
        (``algorithm.<term>``, e.g. a section dataclass); None when the config has none."""
        return self.term_settings.get(term)


@dataclass(frozen=True)
class TermBatch:
    """One micro-batch as the terms read it: its tensors and the denominators of its sums."""

    logp_new: torch.Tensor  # [B, T] current log-probs (carry the gradient)
    logp_old: torch.Tensor  # [B, T] log-probs of the rollout policy
    advantages: torch.Tensor  # [B] or [B, T] (token broadcast)
    response_mask: torch.Tensor  # [B, T] 1 on generated tokens
    denominator: float  # D: what the aggregated terms divide by
    token_denominator: float  # D_LLDS: what token sums divide by (N_tok, or K n_tok under micro-batch-mean)
    logp_ref: torch.Tensor | None = None  # [B, T] reference log-probs (the KL term)
    entropy: torch.Tensor | None = None  # [B, T] token entropies (the entropy term; carry gradient)
    answer_mask: torch.Tensor | None = None  # [B, T] 1 on the answer span (LLDS-MA, with lam_answer)
    lam_answer: float | None = None  # LLDS-MA's answer-span coefficient (None = MA off)
    token_weights: torch.Tensor | None = None  # [B, T] per-token policy-gradient weights (None = 1)


TermFn = Callable[[TermBatch, ObjectiveSpec], "tuple[torch.Tensor | None, dict[str, float]]"]
OBJECTIVE_TERMS: dict[str, TermFn] = {}


def register_term(name: str) -> Callable[[TermFn], TermFn]:
    """Decorator: add ``fn`` to the objective as the term ``name`` (after those registered before it)."""
    return registry.register(OBJECTIVE_TERMS, "objective term", name)


@register_term("policy_loss")
def policy_gradient(batch: TermBatch, spec: ObjectiveSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """L_pg = pg * n / D: pg is the policy loss registered as ``spec.policy_loss`` (algo/policy_loss.py), which
    normalises by the micro-batch's own count n (tokens for agg_mode "token-mean", responses for the seq modes);
    n / D rescales it to the same sum over D. Metrics: pg_loss, pg_clip_frac, approx_kl."""
    loss_fn = policy_loss.get_policy_loss_fn(spec.policy_loss)
    extra = {} if batch.token_weights is None else {"token_weights": batch.token_weights}
    pg, m = loss_fn(batch.logp_new, batch.logp_old, batch.advantages, batch.response_mask, clip_low=spec.clip_low,
                    clip_high=spec.clip_high, dual_clip=spec.dual_clip, agg_mode=spec.agg_mode, **extra)
    n_tok, n_resp = mini_batch_denominators(batch.response_mask)
    local = n_tok if spec.agg_mode == "token-mean" else n_resp
    return pg * (local / batch.denominator), {k: m[k] for k in ("pg_loss", "pg_clip_frac", "approx_kl")}


@register_term("entropy")
def entropy_bonus(batch: TermBatch, spec: ObjectiveSpec) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_H = -entropy_coef * agg(H, D) over the token entropies H ``[B, T]``; off when entropy_coef is 0. Metric
    (whenever H is given): entropy, the masked mean of H."""
    if batch.entropy is None:
        return None, {}
    value = None
    if spec.entropy_coef:
        value = -spec.entropy_coef * aggregate(batch.entropy, batch.response_mask, spec.agg_mode,
                                               denominator=batch.denominator)
    return value, {"entropy": float(masked_mean(batch.entropy.detach(), batch.response_mask))}


@register_term("kl")
def kl_to_reference(batch: TermBatch, spec: ObjectiveSpec) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_KL = kl_coef * agg(k(logp_new, logp_ref), D), k the estimator ``spec.kl_type`` (algo/kl.py; the reference
    is a constant); off when kl_coef <= 0. Metric (whenever logp_ref is given): kl_ref, the masked mean of k."""
    if batch.logp_ref is None:
        return None, {}
    kl_tok = kl.kl_penalty(batch.logp_new, batch.logp_ref.detach(), spec.kl_type)
    value = None
    if spec.kl_coef > 0:
        value = spec.kl_coef * aggregate(kl_tok, batch.response_mask, spec.agg_mode, denominator=batch.denominator)
    return value, {"kl_ref": float(masked_mean(kl_tok.detach(), batch.response_mask))}


@register_term("llds")
def llds_regulariser(batch: TermBatch, spec: ObjectiveSpec) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_LLDS = sum m g c max(0, logp_old - logp_new) / D_LLDS (algo/llds.py) with c = llds_lam (LLDS-MA: min(lam_answer,
    llds_lam) on the answer span when lam_answer is given), gate llds_gate, threshold llds_tau; off when llds_lam is
    0. Metrics: the llds/* of :func:`searchr1_lld.algo.llds.llds_loss`."""
    if not spec.llds_lam > 0:
        return None, {}
    return llds.llds_loss(batch.logp_new, batch.logp_old, batch.advantages, batch.response_mask, gate=spec.llds_gate,
                          lam=spec.llds_lam, tau=spec.llds_tau,
                          answer_mask=batch.answer_mask if batch.lam_answer is not None else None,
                          lam_answer=batch.lam_answer, denominator=batch.token_denominator)
