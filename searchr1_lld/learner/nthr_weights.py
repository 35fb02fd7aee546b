"""NTHR's token weights of one training step (algorithm.nthr; the formulas: searchr1_lld/algo/nthr.py).

Computed once per step, before its updates, under the policy that computed ``logp_old`` (the paper's old policy),
one prompt group at a time: only the groups with both a correct (A > 0) and an incorrect (A < 0) response are run,
through a no-grad forward of their rows (padded or packed as trainer.pack_sequences makes them, within the token
budget), whose final hidden states are captured at the output head (policy_logprobs.final_hidden_states: no logits
are formed; the probabilities on the group's response vocabulary come from the head's rows for those ids, their
normaliser from the whole vocabulary in tiles). A group's hidden states ``[n, t, H]`` live only while its weights are
computed. The weights multiply the policy loss's per-token term (``token_weights``), with the rollout-correction
weights when those are on.

Not available where the output head cannot be read outside its own forward (DeepSpeed ZeRO-3, a model without a plain
``nn.Linear`` head, logit post-processing): a RuntimeError says so at the first step.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from searchr1_lld import distributed
from searchr1_lld.algo import nthr
from searchr1_lld.learner import batching, policy_logprobs
from searchr1_lld.learner.state import Learner
from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.rollout.types import TrajectoryBatch


def mixed_groups(advantages: torch.Tensor, group_ids: torch.Tensor) -> list[list[int]]:
    """The rows of each group that has a response with A > 0 and one with A < 0, groups in order of appearance."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(int(g), []).append(i)
    return [rows for rows in groups.values()
            if bool((advantages[rows] > 0).any()) and bool((advantages[rows] < 0).any())]


def rows_hidden_states(learner: Learner, rows: dict[str, Any]) -> tuple[torch.Tensor, torch.nn.Linear]:
    """(final hidden states ``[b, t, H]`` predicting the responses of ``rows`` (step.model_rows: padded or packed;
    packed: 0 off the response mask), the output head) under the policy."""
    dev, model = learner.accelerator.device, learner.model
    if rows.get("cu_seq_lens") is None and rows.get("segments") is None:
        hidden, head = policy_logprobs.final_hidden_states(
            model, input_ids=rows["input_ids"][:, :-1].to(dev), attention_mask=rows["attention_mask"][:, :-1].to(dev),
            position_ids=rows["position_ids"][:, :-1].to(dev), use_cache=False)
        return hidden[:, rows["p"] - 1:], head
    to_dev = lambda x: None if x is None else x.to(dev)  # noqa: E731
    kwargs = policy_logprobs.packed_forward_kwargs(model, rows["input_ids"].to(dev), rows["position_ids"].to(dev),
                                                   to_dev(rows["cu_seq_lens"]), rows["segments"])
    hidden, head = policy_logprobs.final_hidden_states(model, **kwargs)
    b, t = rows["responses"].shape
    flat = hidden[0, rows["logit_index"].to(dev)]
    out = flat.new_zeros(b * t, flat.shape[-1]).index_copy(0, rows["out_index"].to(dev), flat)
    return out.view(b, t, -1), head


def group_weights(learner: Learner, batch: TrajectoryBatch, rows: list[int], advantages: torch.Tensor,
                  hidden: torch.Tensor, head: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, selected) ``[n, t]`` of one group's ``rows`` from their final hidden states ``[n, t, H]``."""
    nc, dev, t = learner.cfg.algorithm.nthr, hidden.device, hidden.shape[1]
    labels, mask = batch.responses[rows][:, :t].to(dev), batch.response_mask[rows][:, :t].to(dev)
    weight, bias = policy_logprobs.sampled_vocabulary(head, learner.backend.vocab_limit)
    temperature = learner.cfg.rollout.temperature
    errors, _ = nthr.response_vocabulary_errors(hidden, weight, bias, labels, mask,
                                                temperature=temperature if temperature > 0 else 1.0,
                                                chunk_size=learner.cfg.trainer.logprob_chunk_size or None)
    adv, gid = advantages[rows].to(dev), batch.group_ids[rows].to(dev)
    return nthr.nthr_weights(hidden, errors, adv, gid, mask, beta=nc.beta, eta_rule=nc.eta_rule, eta=nc.eta)


def step_weights(learner: Learner, batch: TrajectoryBatch, advantages: torch.Tensor,
                 model_rows: Callable[[list[int]], dict[str, Any]]) -> tuple[torch.Tensor | None, dict[str, float]]:
    """(NTHR's weights ``[B, T]`` on CPU, metrics) of the step (module docstring) from its ``advantages`` ``[B]``;
    ``model_rows(idx)``: rows ``idx`` of ``batch`` as one forward's inputs (step.model_rows); (None, {}) when
    algorithm.nthr is off. Every rank runs the same number of forwards (the missing ones re-run one row and are
    discarded)."""
    if not learner.cfg.algorithm.nthr.enabled:
        return None, {}
    t0 = time.time()
    B, T = batch.responses.shape
    weights, selected = torch.ones(B, T), torch.zeros(B, T, dtype=torch.bool)
    lengths = batch.attention_mask.sum(1).tolist()
    budget = learner.cfg.trainer.micro_batch_token_budget
    groups = mixed_groups(advantages, batch.group_ids)
    passes = [(g, mb) for g, rows in enumerate(groups)
              for mb in batching.micro_batches_by_tokens(lengths, rows, budget)]
    (n_pass,) = distributed.agree_max(learner.accelerator, [len(passes)])
    pending: dict[int, torch.Tensor] = {}  # row -> its hidden states [t_row, H], until its group is complete
    with evaluating(learner.model):
        for k in range(n_pass):
            g, mb = passes[k] if k < len(passes) else (-1, [0])
            hidden, head = rows_hidden_states(learner, model_rows(mb))
            if g < 0:
                continue
            pending.update({r: hidden[j].float() for j, r in enumerate(mb)})
            rows = groups[g]
            if all(r in pending for r in rows):
                hs = [pending.pop(r) for r in rows]
                t = max(x.shape[0] for x in hs)
                h = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, t - x.shape[0])) for x in hs])
                w, s = group_weights(learner, batch, rows, advantages, h, head)
                weights[rows, :t], selected[rows, :t] = w.cpu(), s.cpu()
    out = nthr.nthr_metrics(weights, selected, advantages, batch.response_mask)
    out.update({"nthr/mixed_groups": float(len(groups)), "time/nthr_s": time.time() - t0})
    return weights, out
