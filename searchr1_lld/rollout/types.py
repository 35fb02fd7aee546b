"""What the rollout hands the learner: one :class:`Trajectory` per response, and :func:`to_batch` to tensors.

Token layout of a trajectory (all per-token lists aligned with ``response_ids``)::

    prompt_ids | gen turn 1 | <information> obs </information> | gen turn 2 | ... | gen turn k (<answer> x </answer>)
                 mask 1       mask 0                              mask 1             mask 1

Batch layout (``to_batch``): prompts LEFT-padded to P, responses RIGHT-padded to T::

    input_ids[b] = [pad .. pad, prompt_ids[b], response_ids[b], pad .. pad]      # [B, P + T]
                    <-- P -->                  <------- T ------->

Log-prob convention shared with the learner: the logits that predict ``responses[:, t]`` sit at position
``P - 1 + t`` of the model output over ``input_ids``, i.e.
``logp[:, t] = log_softmax(logits[:, P - 1 + t] / temperature)[responses[:, t]]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


# the finish reasons of a response that a length limit cut off, rather than one the model ended (agent_loop.py):
# "truncated" (rollout.max_total_length) and "length" (the final turn hit rollout.max_tokens_per_turn)
LENGTH_CUT_FINISHES = ("truncated", "length")


@dataclass
class Trajectory:
    """One multi-turn response to one QA row (see docs/architecture.md for the contract)."""

    row: dict[str, Any]
    group_id: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 generated, 0 observation
    answer_mask: list[int] = field(default_factory=list)  # 1 on the final generated <answer>..</answer> span
    action_spans: list[tuple[int, int]] = field(default_factory=list)  # half-open runs of generated tokens
    engine_logprobs: Optional[list[float]] = field(default_factory=list)  # 0.0 on observations; None if unknown
    num_turns: int = 0  # generation calls made for this trajectory
    valid_searches: int = 0  # closed <search> q </search> that were executed
    invalid_actions: int = 0  # turns with neither an executable search nor a closed answer
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)  # doc ids per query
    finish_reason: str = ""  # answer | max_turns | truncated | length
    truncated: bool = False  # hit rollout.max_total_length (prompt + response)
    prediction: Optional[str] = None
    reward: float = 0.0
    response_text: str = ""  # decoded response, for logging only (never re-encoded)
    # degenerate-output counters (never crash on them; count them)
    length_stops: int = 0  # turns that hit max_tokens_per_turn without a stop string / eos
    empty_turns: int = 0  # turns that produced no token at all
    eos_stops: int = 0  # turns that ended on eos without a closed tag
    # the version of the weights that generated it (the learner's count of rollout steps trained when the engine
    # loaded them; learner/pipeline); None: the step's own engine, with the weights it trains (the synchronous step)
    policy_version: Optional[int] = None

    @property
    def cut_by_length(self) -> bool:
        """Whether a length limit ended this response (:data:`LENGTH_CUT_FINISHES`): TRL's "truncated completion",
        which ``algorithm.mask_truncated_responses`` leaves out of the loss."""
        return self.truncated or self.finish_reason in LENGTH_CUT_FINISHES

    def check(self) -> None:
        """Raise ValueError if the per-token lists are not aligned (a bookkeeping bug, never silent)."""
        n = len(self.response_ids)
        lengths = {"response_mask": len(self.response_mask), "answer_mask": len(self.answer_mask)}
        if self.engine_logprobs is not None:
            lengths["engine_logprobs"] = len(self.engine_logprobs)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"trajectory {self.row.get('id')!r}: lists not aligned with response_ids ({n}): {bad}")


@dataclass
class TrajectoryBatch:
    """Tensors for the learner. B trajectories, prompts left-padded to P, responses right-padded to T."""

    input_ids: torch.Tensor  # [B, P+T] long
    attention_mask: torch.Tensor  # [B, P+T] long, 1 on prompt and response tokens
    position_ids: torch.Tensor  # [B, P+T] long, 0.. over real tokens (0 on left padding)
    responses: torch.Tensor  # [B, T] long
    response_mask: torch.Tensor  # [B, T] float, 1 on generated tokens only
    answer_mask: torch.Tensor  # [B, T] float
    engine_logprobs: torch.Tensor  # [B, T] float, 0 where unknown
    has_engine_logprobs: bool
    rewards: torch.Tensor  # [B] float
    group_ids: torch.Tensor  # [B] long
    valid_searches: torch.Tensor  # [B] long
    prompt_length: int  # P
    cut_by_length: torch.Tensor  # [B] bool, Trajectory.cut_by_length: a length limit ended the response

    @property
    def response_length(self) -> int:
        """T."""
        return int(self.responses.shape[1])

    def to(self, device: torch.device | str) -> "TrajectoryBatch":
        """Copy of the batch with every tensor on ``device``."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TrajectoryBatch(**moved)


def to_batch(trajectories: list[Trajectory], pad_token_id: int) -> TrajectoryBatch:
    """Stack trajectories into a :class:`TrajectoryBatch` (layout in the module docstring).

    P = max prompt length, T = max(1, max response length) (a batch of empty responses still has one padded column).
    """
    if not trajectories:
        raise ValueError("to_batch needs at least one trajectory")
    if pad_token_id is None:
        raise ValueError("pad_token_id must be an int (the tokenizer has no pad token?)")
    for traj in trajectories:
        traj.check()
    B = len(trajectories)
    P = max(len(t.prompt_ids) for t in trajectories)
    T = max(1, max(len(t.response_ids) for t in trajectories))
    input_ids = torch.full((B, P + T), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((B, P + T), dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.float32)
    answer_mask = torch.zeros((B, T), dtype=torch.float32)
    engine_logprobs = torch.zeros((B, T), dtype=torch.float32)
    for b, traj in enumerate(trajectories):
        p, r = len(traj.prompt_ids), len(traj.response_ids)
        input_ids[b, P - p : P] = torch.tensor(traj.prompt_ids, dtype=torch.long)
        attention_mask[b, P - p : P] = 1
        if r:
            input_ids[b, P : P + r] = torch.tensor(traj.response_ids, dtype=torch.long)
            attention_mask[b, P : P + r] = 1
            response_mask[b, :r] = torch.tensor(traj.response_mask, dtype=torch.float32)
            answer_mask[b, :r] = torch.tensor(traj.answer_mask, dtype=torch.float32)
            if traj.engine_logprobs is not None:
                engine_logprobs[b, :r] = torch.tensor(traj.engine_logprobs, dtype=torch.float32)
    position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        responses=input_ids[:, P:].clone(),
        response_mask=response_mask,
        answer_mask=answer_mask,
        engine_logprobs=engine_logprobs,
        has_engine_logprobs=all(t.engine_logprobs is not None for t in trajectories),
        rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
        group_ids=torch.tensor([int(t.group_id) for t in trajectories], dtype=torch.long),
        valid_searches=torch.tensor([int(t.valid_searches) for t in trajectories], dtype=torch.long),
        prompt_length=P,
        cut_by_length=torch.tensor([t.cut_by_length for t in trajectories], dtype=torch.bool),
    )

