"""The terms of the objective: each a registered pure function of one micro-batch's tensors (algo/objective.py adds
them up; autograd differentiates the sum).

    L = sum, over the registered terms in registration order, of term(batch, alg)

The built-in terms (D and D_LLDS are the denominators of algo/objective.py) and the settings each reads:

    policy_loss   pg * n / D                              algorithm.{policy_loss, clip_eps, clip_low, clip_high,
                                                          dual_clip, loss_agg_mode, top_entropy_quantile} and the
                                                          loss's own section algorithm.<policy_loss> when it has
                                                          one (clip_cov, kl_cov, sapo, vespo, ...)
    entropy       - entropy_coef * agg(H, D)              algorithm.entropy_coef         H: token entropies
    kl            + kl_coef * agg(KL(logp_new || logp_ref), D)   algorithm.{kl_coef, kl_type} (algo/kl.py)
    llds          + L_LLDS, normalised by D_LLDS          algorithm.llds (LLDS-MA included; algo/llds.py)
    nll_anchor    + coef * sum m 1[A >= 0] (-logp_new) / D_LLDS   algorithm.nll_anchor (algo/anchor.py)

A term is ``term(batch: TermBatch, alg: AlgorithmSettings) -> (value, metrics)``: ``value`` a 0-dim tensor added to
the loss, or None when the term is off (coefficient 0, or its input not given); ``metrics`` floats merged into the
objective's, each typed with how the training step reduces it over its micro-batches (algo/step_metrics.py: a plain
float is a token mean; ``PerUpdate``, ``Sum``, ``Last``, ``Max``, ``TokenMean(v, weight=)``); the step logs every
metric a term returns, ``name`` as ``actor/name`` and ``group/name`` as it is. ``@register_term("name")`` adds a term to every objective; its settings are the algorithm config's
section of the same name (``algorithm.<name>``, read as ``getattr(alg, name)``): a new regulariser is one function,
one config section and one test, with no edit to the objective or the learner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from searchr1_lld.algo import anchor, kl, llds, policy_loss, registry, rollout_correction, token_selection
from searchr1_lld.algo.aggregation import aggregate, default_denominator, masked_mean
from searchr1_lld.algo.step_metrics import Last, PerUpdate, TokenMean


class AlgorithmSettings(Protocol):
    """What the objective reads of a run's algorithm settings: ``AlgorithmConfig`` (config/sections.py) is the one
    implementation; each built-in term reads the fields named in the module docstring, a registered term its own
    section ``getattr(alg, name)``."""

    policy_loss: str
    clip_eps: float
    clip_low: float | None
    clip_high: float | None
    dual_clip: float | None
    loss_agg_mode: str
    loss_scale: str
    seq_token_sum_norm: float
    kl_coef: float
    kl_type: str
    entropy_coef: float
    top_entropy_quantile: float
    llds: Any  # LLDSConfig: enabled, lam, gate, tau, ma, lam_answer, ma_adaptive_rule
    nll_anchor: Any  # NLLAnchorConfig: enabled, coef
    rollout_correction: Any  # RolloutCorrectionConfig: read by the policy loss in bypass mode (optional)


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
    answer_mask: torch.Tensor | None = None  # [B, T] 1 on the final answer span (LLDS-MA)
    valid_searches_mean: float | None = None  # the step's mean number of valid searches per response (adaptive MA)
    token_weights: torch.Tensor | None = None  # [B, T] per-token policy-gradient weights (None = 1)


TermFn = Callable[[TermBatch, AlgorithmSettings], "tuple[torch.Tensor | None, dict[str, float]]"]
OBJECTIVE_TERMS: dict[str, TermFn] = {}


def register_term(name: str) -> Callable[[TermFn], TermFn]:
    """Decorator: add ``fn`` to the objective as the term ``name`` (after those registered before it)."""
    return registry.register(OBJECTIVE_TERMS, "objective term", name)


def loss_settings(alg: AlgorithmSettings) -> dict[str, Any]:
    """The keywords of the policy loss ``alg.policy_loss``: the clip ranges (clip_low / clip_high default to
    clip_eps), dual_clip, agg_mode, and the fields of its own section ``algorithm.<policy_loss>`` if there is one."""
    own = getattr(alg, alg.policy_loss, None)
    return {"clip_low": alg.clip_low if alg.clip_low is not None else alg.clip_eps,
            "clip_high": alg.clip_high if alg.clip_high is not None else alg.clip_eps,
            "dual_clip": alg.dual_clip, "agg_mode": alg.loss_agg_mode,
            **(dataclasses.asdict(own) if dataclasses.is_dataclass(own) else {})}


def policy_token_weights(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The per-token weights ``[B, T]`` the policy loss multiplies its token terms by (None = 1): the batch's
    ``token_weights`` times, when ``alg.top_entropy_quantile`` < 1, the high-entropy selection s of
    :func:`searchr1_lld.algo.token_selection.top_entropy_mask` over this forward pass's response tokens. The
    aggregation keeps the full response mask, so a token left out adds 0 and still counts in the denominator (TRL's
    ``per_token_loss * entropy_mask``). Metric: top_entropy_kept_frac = sum s / sum m."""
    if alg.top_entropy_quantile >= 1:
        return batch.token_weights, {}
    if batch.entropy is None:
        raise ValueError(f"algorithm.top_entropy_quantile={alg.top_entropy_quantile} needs the token entropies of "
                         "the micro-batch")
    selected = token_selection.top_entropy_mask(batch.entropy, batch.response_mask, alg.top_entropy_quantile)
    weights = selected.to(batch.logp_new.dtype)
    if batch.token_weights is not None:
        weights = weights * batch.token_weights.detach().to(weights.dtype)
    kept = float(masked_mean(selected.to(weights.dtype), batch.response_mask))
    return weights, {"top_entropy_kept_frac": kept}


@register_term("policy_loss")
def policy_gradient(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """L_pg = pg * n / D: pg is the policy loss registered as ``alg.policy_loss`` (algo/policy_loss.py), which
    normalises by the micro-batch's own n (aggregation.default_denominator: tokens, responses, or responses x width);
    n / D rescales it to the same sum over D. Its token weights: :func:`policy_token_weights`. Metrics: every metric
    of the loss (pg_loss, pg_clip_frac, approx_kl and the loss's own: ratio_max, cov_token_frac of the covariance
    losses, vespo_phi_mean of VESPO, ...), and top_entropy_kept_frac under a top-entropy selection. In the rollout
    correction's bypass mode (``algorithm.rollout_correction.bypass``: logp_old is the engine's) the weights and
    rejection rule are computed here, between logp_new and the engine (rollout_correction.bypass_correction):
    rejected tokens leave the mask of the policy loss alone, and D stays the mini-batch's (verl's
    ``compute_policy_loss_bypass_mode``); its rollout/* metrics are added, as token means."""
    loss_fn = policy_loss.get_policy_loss_fn(alg.policy_loss)
    weights, selection = policy_token_weights(batch, alg)
    mask, corrected = batch.response_mask, {}
    rc = getattr(alg, "rollout_correction", None)
    if rc is not None and rc.bypass:  # weights and rejection between the policy being updated and the engine
        c, corrected = rollout_correction.bypass_correction(rc, batch.logp_new, batch.logp_old, mask)
        weights = c.weights if weights is None else (weights if c.weights is None else weights * c.weights)
        mask = c.mask(mask)
    extra = {} if weights is None else {"token_weights": weights}
    pg, m = loss_fn(batch.logp_new, batch.logp_old, batch.advantages, mask, **loss_settings(alg), **extra)
    local = default_denominator(mask, alg.loss_agg_mode)
    return pg * (local / batch.denominator), {**m, **selection, **corrected}


@register_term("entropy")
def entropy_bonus(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_H = -entropy_coef * agg(H, D) over the token entropies H ``[B, T]``; off when entropy_coef is 0. Metric
    (whenever H is given): entropy, the masked mean of H."""
    if batch.entropy is None:
        return None, {}
    value = None
    if alg.entropy_coef:
        value = -alg.entropy_coef * aggregate(batch.entropy, batch.response_mask, alg.loss_agg_mode,
                                              denominator=batch.denominator)
    return value, {"entropy": float(masked_mean(batch.entropy.detach(), batch.response_mask))}


@register_term("kl")
def kl_to_reference(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_KL = kl_coef * agg(k(logp_new, logp_ref), D), k the estimator ``alg.kl_type`` (algo/kl.py; the reference
    is a constant); off when kl_coef <= 0. Metric (whenever logp_ref is given): kl_ref, the masked mean of k."""
    if batch.logp_ref is None:
        return None, {}
    kl_tok = kl.kl_penalty(batch.logp_new, batch.logp_ref.detach(), alg.kl_type)
    value = None
    if alg.kl_coef > 0:
        value = alg.kl_coef * aggregate(kl_tok, batch.response_mask, alg.loss_agg_mode, denominator=batch.denominator)
    return value, {"kl_ref": float(masked_mean(kl_tok.detach(), batch.response_mask))}


@register_term("llds")
def llds_regulariser(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_LLDS = sum m g c max(0, logp_old - logp_new) / D_LLDS (algo/llds.py) with c = llds.lam, and on the answer
    span under LLDS-MA c = min(lam_answer', lam), lam_answer' = :func:`searchr1_lld.algo.llds.answer_coefficient` of
    llds.ma (fixed, or adaptive from the step's mean valid searches); gate llds.gate, threshold llds.tau; off unless
    llds.enabled and llds.lam > 0. Metrics (:func:`llds_step_metrics`): llds/loss, llds/active_token_frac,
    llds/mean_penalty, llds/mean_displacement, llds/gated_responses_frac, llds/gated_actions_frac, and
    llds/lam_answer_effective under MA."""
    lc = alg.llds
    if not (lc.enabled and lc.lam > 0):
        return None, {}
    lam_answer = llds.answer_coefficient(lc.ma, lc.lam_answer, batch.valid_searches_mean, lc.ma_adaptive_rule)
    if lam_answer is not None and batch.answer_mask is None:
        raise ValueError(f"algorithm.llds.ma={lc.ma} needs the answer mask of the micro-batch")
    loss, metrics = llds.llds_loss(batch.logp_new, batch.logp_old, batch.advantages, batch.response_mask,
                                   gate=lc.gate, lam=lc.lam, tau=lc.tau,
                                   answer_mask=batch.answer_mask if lam_answer is not None else None,
                                   lam_answer=lam_answer, denominator=batch.token_denominator)
    return loss, llds_step_metrics(metrics, batch.response_mask.shape[0],
                                   None if lam_answer is None else min(lam_answer, lc.lam))


def llds_step_metrics(m: dict[str, float], responses: int, lam_answer: float | None) -> dict[str, float]:
    """The metrics of :func:`searchr1_lld.algo.llds.llds_loss` on a micro-batch of ``responses`` rows, typed for
    the step: the loss per update, token means, the gated shares of the responses and of the action spans (weighted
    by their counts), and the effective answer-span coefficient once per step."""
    out = {"llds/loss": PerUpdate(m["llds/loss"]),
           "llds/active_token_frac": TokenMean(m["llds/active_token_frac"]),
           "llds/mean_penalty": TokenMean(m["llds/mean_penalty"]),
           "llds/mean_displacement": TokenMean(m["llds/mean_displacement"]),
           "llds/gated_responses_frac": TokenMean(m["llds/gated_responses"] / max(responses, 1), weight=responses),
           "llds/gated_actions_frac": TokenMean(m["llds/gated_actions"] / max(m["llds/total_actions"], 1.0),
                                                weight=m["llds/total_actions"])}
    if lam_answer is not None:
        out["llds/lam_answer_effective"] = Last(lam_answer)
    return out


@register_term("nll_anchor")
def likelihood_anchor(batch: TermBatch, alg: AlgorithmSettings) -> tuple[torch.Tensor | None, dict[str, float]]:
    """L_anchor = coef * sum m 1[A >= 0] (-logp_new) / D_LLDS (algo/anchor.py); off unless nll_anchor.enabled and
    nll_anchor.coef > 0. Metrics: nll_anchor/loss per update, nll_anchor/anchored_token_frac (a token mean) and
    nll_anchor/mean_nll (a mean over the anchored tokens)."""
    s = alg.nll_anchor
    if not (s.enabled and s.coef > 0):
        return None, {}
    loss, m = anchor.nll_anchor_loss(batch.logp_new, batch.advantages, batch.response_mask, coef=s.coef,
                                     denominator=batch.token_denominator)
    anchored = m["nll_anchor/anchored_token_frac"] * float((batch.response_mask != 0).sum())
    return loss, {"nll_anchor/loss": PerUpdate(m["nll_anchor/loss"]),
                  "nll_anchor/anchored_token_frac": TokenMean(m["nll_anchor/anchored_token_frac"]),
                  "nll_anchor/mean_nll": TokenMean(m["nll_anchor/mean_nll"], weight=anchored)}
