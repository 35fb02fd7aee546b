"""The algorithm core: pure tensor functions (advantages, policy losses, KL, aggregation, LLDS, the likelihood anchor,
spans, log-probs).

Every formula lives in exactly one function whose docstring states it with shapes. Advantage estimators, policy
losses, aggregation modes, KL estimators and the terms of the objective are registered by name (algo/registry.py);
the objective (algo/objective.py) sums the terms; the trainer calls the objective.
"""

from searchr1_lld.algo.advantages import (ADVANTAGE_ESTIMATORS, broadcast_to_tokens, check_advantages,
                                          get_advantage_fn, grpo_outcome_advantages)
from searchr1_lld.algo.aggregation import AGG_MODES, AGGREGATIONS, aggregate, masked_mean
from searchr1_lld.algo.anchor import nll_anchor_loss
from searchr1_lld.algo.kl import KL_KINDS, kl_penalty
from searchr1_lld.algo.llds import GATES, adaptive_lam_answer, llds_can_act, llds_gate, llds_loss, per_response_advantage
from searchr1_lld.algo.objective import AlgorithmSettings, mini_batch_denominators, objective
from searchr1_lld.algo.terms import OBJECTIVE_TERMS, TermBatch, register_term
from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, linear_logprobs_entropy, naive_logprobs_entropy
from searchr1_lld.algo.policy_loss import POLICY_LOSSES, gspo_loss, ppo_clip_loss
from searchr1_lld.algo.covariance_losses import clip_cov_loss, kl_cov_loss
from searchr1_lld.algo.logprob_losses import cispo_loss, dppo_kl_loss, dppo_tv_loss, gpg_loss, vespo_loss
from searchr1_lld.algo.ratio_losses import geo_mean_loss, sapo_loss
from searchr1_lld.algo.token_selection import mask_responses, top_entropy_mask
from searchr1_lld.algo.spans import (
    action_span_list,
    action_spans,
    answer_span_list,
    answer_span_mask,
    answer_span_mask_list,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "AGGREGATIONS",
    "AlgorithmSettings",
    "OBJECTIVE_TERMS",
    "POLICY_LOSSES",
    "TermBatch",
    "GATES",
    "KL_KINDS",
    "action_span_list",
    "action_spans",
    "adaptive_lam_answer",
    "aggregate",
    "answer_span_list",
    "answer_span_mask",
    "answer_span_mask_list",
    "broadcast_to_tokens",
    "check_advantages",
    "chunked_logprobs_entropy",
    "cispo_loss",
    "clip_cov_loss",
    "dppo_kl_loss",
    "dppo_tv_loss",
    "geo_mean_loss",
    "get_advantage_fn",
    "gpg_loss",
    "grpo_outcome_advantages",
    "gspo_loss",
    "kl_cov_loss",
    "kl_penalty",
    "linear_logprobs_entropy",
    "llds_can_act",
    "llds_gate",
    "llds_loss",
    "mask_responses",
    "masked_mean",
    "mini_batch_denominators",
    "naive_logprobs_entropy",
    "nll_anchor_loss",
    "objective",
    "per_response_advantage",
    "ppo_clip_loss",
    "register_term",
    "sapo_loss",
    "top_entropy_mask",
    "vespo_loss",
]
