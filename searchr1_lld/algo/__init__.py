"""The algorithm core: pure tensor functions (GRPO advantages, policy losses, KL, aggregation, LLDS, spans, log-probs).

Every formula lives in exactly one function whose docstring states it with shapes. The terms of the objective are
registered by name (algo/terms.py) and summed by algo/objective.py; the trainer calls the objective.
"""

from searchr1_lld.algo.advantages import broadcast_to_tokens, check_advantages, grpo_outcome_advantages
from searchr1_lld.algo.aggregation import AGG_MODES, aggregate, masked_mean
from searchr1_lld.algo.kl import KL_KINDS, kl_penalty
from searchr1_lld.algo.llds import GATES, adaptive_lam_answer, llds_can_act, llds_gate, llds_loss, per_response_advantage
from searchr1_lld.algo.objective import ObjectiveSpec, mini_batch_denominators, objective
from searchr1_lld.algo.terms import OBJECTIVE_TERMS, TermBatch, register_term
from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, linear_logprobs_entropy, naive_logprobs_entropy
from searchr1_lld.algo.policy_loss import gspo_loss, ppo_clip_loss
from searchr1_lld.algo.spans import (
    action_span_list,
    action_spans,
    answer_span_list,
    answer_span_mask,
    answer_span_mask_list,
)

__all__ = [
    "AGG_MODES",
    "OBJECTIVE_TERMS",
    "ObjectiveSpec",
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
    "grpo_outcome_advantages",
    "gspo_loss",
    "kl_penalty",
    "linear_logprobs_entropy",
    "llds_can_act",
    "llds_gate",
    "llds_loss",
    "masked_mean",
    "mini_batch_denominators",
    "naive_logprobs_entropy",
    "objective",
    "per_response_advantage",
    "ppo_clip_loss",
    "register_term",
]
