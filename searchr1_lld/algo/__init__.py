"""The algorithm core: pure tensor functions (GRPO advantages, policy losses, KL, aggregation, LLDS, spans, log-probs)."""

from searchr1_lld.algo.spans import (
    action_span_list,
    action_spans,
    answer_span_list,
    answer_span_mask,
    answer_span_mask_list,
)

__all__ = [
    "action_span_list",
    "action_spans",
    "answer_span_list",
    "answer_span_mask",
    "answer_span_mask_list",
]
