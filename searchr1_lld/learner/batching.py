"""Batching of the learner: which prompts a step trains on, and how a step's responses become mini-batches (one
optimiser step each) of micro-batches (one forward/backward each). Batch semantics: docs/batch_semantics.md."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


class PromptSampler:
    """Epoch-wise shuffled prompts; state = (epoch, cursor) so a resumed run draws the same next batch."""

    def __init__(self, rows: list[dict], batch_size: int, seed: int, shuffle: bool = True):
        if not rows:
            raise ValueError("no training rows")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        idx = list(range(len(self.rows)))
        if self.shuffle:
            np.random.default_rng(self.seed + 7919 * epoch).shuffle(idx)
        return idx

    def next_batch(self) -> list[dict]:
        batch = []
        while len(batch) < self.batch_size:
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.rows[self._order[self.cursor]])
            self.cursor += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def micro_batches_by_tokens(lengths: Sequence[int], indices: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split ``indices`` (rows of one mini-batch) into micro-batches whose padded size
    ``len(micro) * max(length in micro)`` stays within ``token_budget`` (a single longer row gets its own micro-batch).
    Rows are sorted by length first so that rows of similar length share a micro-batch (little padding)."""
    order = sorted(indices, key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and (len(cur) + 1) * new_max > token_budget:
            out.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


def micro_batches_by_prompt(prompt_lengths: Sequence[int], lengths: Sequence[int], group_ids: Sequence[int],
                            token_budget: int) -> list[list[int]]:
    """Split rows ``0 .. B-1`` into micro-batches of whole groups (rows of a group share their prompt, which a packed
    forward with shared prompts lays out once) whose packed size, each group's prompt once plus each row's
    ``length - prompt length`` response tokens, stays within ``token_budget``; a group larger than the budget is
    split into parts, each paying its prompt (a single row over the budget gets its own micro-batch). Groups in
    order of first appearance, rows in batch order."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(i)
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for rows in groups.values():
        prompt = prompt_lengths[rows[0]]
        for i in rows:
            cost = lengths[i] - prompt + (prompt if not cur or cur[-1] not in rows else 0)
            if cur and used + cost > token_budget:
                out.append(cur)
                cur, used, cost = [], 0, lengths[i]
            cur.append(i)
            used += cost
    if cur:
        out.append(cur)
    return out


def micro_batches_by_count(indices: Sequence[int], rows_per_micro: int) -> list[list[int]]:
    """Split ``indices`` in their given order into micro-batches of ``rows_per_micro`` rows (the last may be short
    when the count does not divide), as verl's actor splits a mini-batch."""
    if rows_per_micro < 1:
        raise ValueError(f"rows_per_micro must be >= 1; got {rows_per_micro}")
    idx = list(indices)
    return [idx[s : s + rows_per_micro] for s in range(0, len(idx), rows_per_micro)]


def plan_updates(lengths: Sequence[int], rows_per_mini: int, epochs: int, token_budget: int,
                 generator: torch.Generator, rows_per_micro: int = 0) -> list[list[list[int]]]:
    """``[mini-batch][micro-batch][row]`` of one step: per epoch a permutation of the rank's B rows cut into
    mini-batches of ``rows_per_mini`` (groups may straddle mini-batches: advantages are final), each split into
    micro-batches of ``rows_per_micro`` rows (:func:`micro_batches_by_count`), each run in forward passes within the
    token budget, or, with 0, into micro-batches by the token budget (:func:`micro_batches_by_tokens`), one pass each
    (B a multiple of ``rows_per_mini``)."""
    B = len(lengths)
    plan = []
    for _epoch in range(epochs):
        perm = torch.randperm(B, generator=generator).tolist()
        for start in range(0, B, rows_per_mini):
            rows = perm[start : start + rows_per_mini]
            if rows_per_micro:  # each micro-batch of the count, in forward passes within the token budget
                plan.append([p for mb in micro_batches_by_count(rows, rows_per_micro)
                             for p in micro_batches_by_tokens(lengths, mb, token_budget)])
            else:
                plan.append(micro_batches_by_tokens(lengths, rows, token_budget))
    return plan


def micro_batch_of_passes(passes: Sequence[Sequence[int]], rows_per_micro: int) -> list[int]:
    """For the forward passes of one mini-batch as :func:`plan_updates` lists them with ``rows_per_micro`` > 0 (each
    micro-batch's passes consecutive), the index of the micro-batch each pass belongs to."""
    out, seen = [], 0
    for p in passes:
        out.append(seen // rows_per_micro)
        seen += len(p)
    return out


def select_rows(batch: Any, idx: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of a TrajectoryBatch, trimmed to their own longest prompt p and response t.

    Returns input_ids/attention_mask/position_ids [b, p+t], responses/response_mask/answer_mask/engine_logprobs [b, t],
    and "p" (the prompt width): logits predicting responses[:, j] sit at position p - 1 + j.
    """
    index = torch.as_tensor(list(idx), dtype=torch.long)
    P = batch.prompt_length
    am = batch.attention_mask[index]
    p = max(1, int(am[:, :P].sum(1).max()))
    t = max(1, int(am[:, P:].sum(1).max()))
    cols = slice(P - p, P + t)
    return {
        "input_ids": batch.input_ids[index][:, cols],
        "attention_mask": am[:, cols],
        "position_ids": batch.position_ids[index][:, cols],
        "responses": batch.responses[index][:, :t],
        "response_mask": batch.response_mask[index][:, :t],
        "answer_mask": batch.answer_mask[index][:, :t],
        "engine_logprobs": batch.engine_logprobs[index][:, :t],
        "p": p,
    }


def pad_cols(x: torch.Tensor, width: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad [b, t] to [b, width]."""
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def pack_rows(batch: Any, idx: Sequence[int], *, share_prompts: bool = False) -> dict[str, Any]:
    """Rows ``idx`` of a TrajectoryBatch as one packed sequence, no padding: what :func:`select_rows` returns (the
    ``[b, t]`` tensors the objective reads) and, in place of its padded model inputs, each row's prompt and response
    back to back without its last token (which predicts nothing), ``N = sum_i (p_i + r_i - 1)`` positions:

    input_ids / position_ids ``[1, N]`` (positions restart at 0 at each row), cu_seq_lens ``[b + 1]`` int32 (the rows'
    boundaries), logit_index ``[M]`` (the position whose logits predict each of the M generated response tokens:
    observation tokens are read by the model but never predicted, every loss and metric masks them out),
    labels ``[M]`` (those tokens), out_index ``[M]`` (where each goes in the flattened ``[b, t]``).
    A row with no response keeps its prompt (at least one position) and predicts nothing.

    ``share_prompts``: a prompt that an earlier row of ``idx`` has too (the responses of one GRPO group) is laid out
    once; each row is then a prompt segment and a response segment, ``segments`` ``[b, 4]`` long (prompt start,
    prompt length, response start, response length) for the attention (policy_logprobs: each prompt attends
    causally to itself, each response to its prompt and causally to itself), and cu_seq_lens is None.
    """
    rows = select_rows(batch, idx)
    t = rows["responses"].shape[1]
    P = batch.prompt_length
    ids, positions, logit_index, labels, out_index, segments = [], [], [], [], [], []
    prompt_start: dict[tuple[int, ...], int] = {}
    n = 0  # positions laid out so far
    for k, i in enumerate(idx):
        am = batch.attention_mask[i]
        p, r = int(am[:P].sum()), int(am[P:].sum())
        prompt, response = batch.input_ids[i, P - p : P], batch.input_ids[i, P : P + r]
        key = tuple(prompt.tolist()) if share_prompts else None
        ps = prompt_start.get(key) if share_prompts else None
        if ps is None:
            ps = n
            ids.append(prompt)
            positions.append(torch.arange(p))
            n += p
            if share_prompts:
                prompt_start[key] = ps
        body = response[: max(r - 1, 0)]  # the last response token predicts nothing
        ids.append(body)
        positions.append(torch.arange(p, p + len(body)))
        segments.append((ps, p, n, len(body)))
        generated = torch.nonzero(batch.response_mask[i, :r], as_tuple=True)[0]  # observations predict nothing
        # response token g is predicted by the position before it: the prompt's last one for g = 0
        logit_index.append(torch.where(generated == 0, ps + p - 1, n + generated - 1))
        labels.append(response[generated])
        out_index.append(k * t + generated)
        n += len(body)
    rows.update(
        input_ids=torch.cat(ids)[None], position_ids=torch.cat(positions)[None], attention_mask=None,
        logit_index=torch.cat(logit_index), labels=torch.cat(labels), out_index=torch.cat(out_index),
        cu_seq_lens=None if share_prompts else torch.tensor(
            [0] + [ps + p + m for ps, p, _, m in segments], dtype=torch.int32),
        segments=torch.tensor(segments, dtype=torch.long) if share_prompts else None,
    )
    return rows


def forward_positions(rows: dict[str, Any]) -> tuple[int, int]:
    """(positions a forward over ``rows`` computes, those of them that are real tokens) for :func:`select_rows`'s
    padded rows (the model input drops the last column) or :func:`pack_rows`'s packed ones (no padding)."""
    if rows.get("cu_seq_lens") is not None or rows.get("segments") is not None:
        n = int(rows["input_ids"].numel())
        return n, n
    am = rows["attention_mask"][:, :-1]
    return int(am.numel()), int(am.sum())
