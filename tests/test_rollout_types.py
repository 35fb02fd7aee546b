"""to_batch layout (hand-built trajectories)."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.rollout.types import Trajectory, to_batch

PAD = 0


def traj(prompt, resp, mask, lps=None, reward=0.0, group=0):
    return Trajectory(row={"id": "x", "golden_answers": []}, group_id=group, prompt_ids=prompt, response_ids=resp,
                      response_mask=mask, answer_mask=[0] * len(resp),
                      engine_logprobs=lps if lps is not None else [0.0] * len(resp), reward=reward)


def test_to_batch_left_pads_prompts_and_right_pads_responses():
    a = traj([11, 12, 13], [21, 22, 23, 24], [1, 1, 0, 1], [-0.1, -0.2, 0.0, -0.4], reward=1.0, group=0)
    b = traj([14], [25], [1], [-0.5], reward=0.0, group=1)
    b.valid_searches = 2
    batch = to_batch([a, b], PAD)
    assert batch.prompt_length == 3 and batch.response_length == 4
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24], [0, 0, 14, 25, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1]]
    assert batch.responses.tolist() == [[21, 22, 23, 24], [25, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]
    assert torch.allclose(batch.engine_logprobs, torch.tensor([[-0.1, -0.2, 0.0, -0.4], [-0.5, 0, 0, 0]]))
    assert batch.has_engine_logprobs is True
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.group_ids.tolist() == [0, 1]
    assert batch.valid_searches.tolist() == [0, 2]
    # convention: responses[:, t] is input_ids[:, P + t], predicted by the logits at P - 1 + t
    P = batch.prompt_length
    assert torch.equal(batch.input_ids[:, P:], batch.responses)


def test_to_batch_errors_and_edge_cases():
    with pytest.raises(ValueError, match="at least one"):
        to_batch([], PAD)
    bad = traj([1], [2, 3], [1])
    with pytest.raises(ValueError, match="not aligned"):
        to_batch([bad], PAD)
    empty = traj([1, 2], [], [])
    batch = to_batch([empty], PAD)
    assert batch.responses.shape == (1, 1) and batch.response_mask.sum() == 0
    none_lp = traj([1], [2], [1])
    none_lp.engine_logprobs = None
    assert to_batch([none_lp, traj([1], [2], [1])], PAD).has_engine_logprobs is False

