"""Truncated importance sampling (algo/rollout_correction.py) and the policy loss's token weights: hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.algo.policy_loss import gspo_loss, ppo_clip_loss
from searchr1_lld.algo.rollout_correction import tis_weights, weight_stats

# two responses, three positions; row 1 has a masked (observation / padding) last token
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -9.0]])
ENG = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.4, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_weights_hand_computed():
    # log-ratios old - engine: [0.5, -1.0, 0.0], [-0.1, 0.3, (masked)]; cap 1.5 truncates exp(0.5) = 1.6487
    w = tis_weights(OLD, ENG, MASK, mode="token", cap=1.5)
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0], [math.exp(-0.1), math.exp(0.3), 1.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    w = tis_weights(OLD, ENG, MASK, mode="token", cap=2.0)
    assert w[0, 0].item() == pytest.approx(math.exp(0.5))


def test_sequence_weights_hand_computed():
    # row sums of the masked log-ratios: 0.5 - 1.0 + 0.0 = -0.5 and -0.1 + 0.3 = 0.2 -> exp(-0.5), exp(0.2) under cap 3
    w = tis_weights(OLD, ENG, MASK, mode="sequence", cap=3.0)
    assert torch.allclose(w[0], torch.full((3,), math.exp(-0.5)), atol=1e-6)
    assert torch.allclose(w[1, :2], torch.full((2,), math.exp(0.2)), atol=1e-6) and w[1, 2] == 1.0
    w = tis_weights(OLD, ENG, MASK, mode="sequence", cap=1.1)  # exp(0.2) = 1.2214 is truncated to 1.1
    assert w[1, 0].item() == pytest.approx(1.1) and w[0, 0].item() == pytest.approx(math.exp(-0.5))


def test_weights_never_overflow_and_carry_no_gradient():
    old = torch.tensor([[500.0, -500.0]], requires_grad=True)
    w = tis_weights(old, torch.zeros(1, 2), torch.ones(1, 2), mode="token", cap=2.0)
    assert torch.isfinite(w).all() and w[0, 0] == 2.0 and w[0, 1] == 0.0 and not w.requires_grad
    assert tis_weights(old, torch.zeros(1, 2), torch.ones(1, 2), mode="sequence", cap=2.0)[0, 0] == 1.0  # sum 0


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="cap"):
        tis_weights(OLD, ENG, MASK, cap=0.5)
    with pytest.raises(ValueError, match="mode"):
        tis_weights(OLD, ENG, MASK, mode="off")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        tis_weights(OLD, ENG[:, :2], MASK)


def test_weight_stats_hand_computed():
    w = tis_weights(OLD, ENG, MASK, mode="token", cap=1.5)
    s = weight_stats(OLD, ENG, MASK, w, mode="token", cap=1.5)
    vals = [1.5, math.exp(-1.0), 1.0, math.exp(-0.1), math.exp(0.3)]  # the 5 response tokens
    assert s["rollout/tis_weight_mean"] == pytest.approx(sum(vals) / 5)
    assert s["rollout/tis_weight_min"] == pytest.approx(math.exp(-1.0))
    assert s["rollout/tis_weight_max"] == pytest.approx(1.5)
    assert s["rollout/tis_capped_frac"] == pytest.approx(1 / 5)
    w = tis_weights(OLD, ENG, MASK, mode="sequence", cap=1.1)
    s = weight_stats(OLD, ENG, MASK, w, mode="sequence", cap=1.1)
    assert s["rollout/tis_weight_mean"] == pytest.approx((math.exp(-0.5) + 1.1) / 2)
    assert s["rollout/tis_capped_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("loss_fn", [ppo_clip_loss, gspo_loss])
def test_policy_loss_token_weights(loss_fn):
    # identical old/new (ratio 1, nothing clipped): per-token loss is -A; token-mean of -A * w over the mask
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -9.0]], requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    w = torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.0, 7.0]])
    loss, _ = loss_fn(lp, lp.detach(), adv, MASK, token_weights=w)
    expected = (-(0.5 + 1.0 + 2.0) * 1.0 + 2.0 * (1.5 + 0.0)) / 5
    assert loss.item() == pytest.approx(expected)
    base, _ = loss_fn(lp, lp.detach(), adv, MASK)
    ones, _ = loss_fn(lp, lp.detach(), adv, MASK, token_weights=torch.ones(2, 3))
    assert ones.item() == pytest.approx(base.item()) and base.item() == pytest.approx((-3.0 + 4.0) / 5)
    loss.backward()  # gradient per token is -A * w (ratio 1) / 5
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, -1.0, -2.0], [3.0, 0.0, 0.0]]) / 5, atol=1e-6)
    with pytest.raises(ValueError, match="token_weights"):
        loss_fn(lp, lp.detach(), adv, MASK, token_weights=torch.ones(2, 2))
