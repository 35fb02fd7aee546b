"""GRPO advantages and token broadcast, hand-computed."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1_lld.algo.advantages import broadcast_to_tokens, grpo_outcome_advantages


def test_grpo_advantages_hand_computed():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 0, 3, 3, 3, 9])
    adv = grpo_outcome_advantages(scores, groups, eps=1e-6)
    # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    assert adv[:3].tolist() == pytest.approx([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)])
    assert adv[3:6].tolist() == [0.0, 0.0, 0.0]  # all-equal group
    assert adv[6].item() == 0.0  # singleton group


def test_grpo_advantages_biased_std_and_dr_grpo():
    scores = torch.tensor([1.0, 0.0, 3.0, 1.0])
    groups = torch.tensor([5, 5, 2, 2])
    biased = grpo_outcome_advantages(scores, groups, unbiased=False, eps=1e-6)
    assert biased.tolist() == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 1 / (1 + 1e-6), -1 / (1 + 1e-6)])
    dr = grpo_outcome_advantages(scores, groups, norm_by_std=False)
    assert dr.tolist() == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_grpo_advantages_interleaved_groups_and_errors():
    scores = torch.tensor([1.0, 2.0, 0.0, 4.0])
    groups = torch.tensor([1, 0, 1, 0])
    dr = grpo_outcome_advantages(scores, groups, norm_by_std=False)
    assert dr.tolist() == pytest.approx([0.5, -1.0, -0.5, 1.0])
    with pytest.raises(ValueError):
        grpo_outcome_advantages(scores, groups[:3])
    with pytest.raises(ValueError):
        grpo_outcome_advantages(scores, groups, eps=0.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 5)), min_size=1, max_size=16))
def test_grpo_advantages_zero_mean_per_group(rows):
    groups = torch.tensor([g for g, _ in rows])
    scores = torch.tensor([s for _, s in rows], dtype=torch.float64)
    adv = grpo_outcome_advantages(scores, groups)
    for g in groups.unique():
        sel = groups == g
        assert adv[sel].sum().item() == pytest.approx(0.0, abs=1e-6)
        if sel.sum() > 1:
            centred = scores[sel] - scores[sel].mean()
            assert torch.allclose(adv[sel], centred / (scores[sel].std() + 1e-6))


def test_broadcast_to_tokens():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert broadcast_to_tokens(adv, mask).tolist() == [[2.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError):
        broadcast_to_tokens(adv, mask[:1])
