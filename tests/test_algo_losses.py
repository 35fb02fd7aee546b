"""KL estimators, aggregation modes, PPO-clip and GSPO on hand-computed tensors."""

import math

import pytest
import torch

from searchr1_lld.algo.aggregation import aggregate
from searchr1_lld.algo.kl import kl_penalty
from searchr1_lld.algo.policy_loss import gspo_loss, ppo_clip_loss

# ---------------------------------------------------------------------------------------------------------- KL


def test_kl_estimators_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])  # x = logp - ref = [0.5, -1.0]
    assert kl_penalty(logp, ref, "k1").flatten().tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(logp, ref, "abs").flatten().tolist() == pytest.approx([0.5, 1.0])
    assert kl_penalty(logp, ref, "k2").flatten().tolist() == pytest.approx([0.125, 0.5])
    assert kl_penalty(logp, ref, "mse").flatten().tolist() == pytest.approx([0.125, 0.5])
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_penalty(logp, ref, "low_var_kl").flatten().tolist() == pytest.approx(k3)
    assert kl_penalty(logp, ref, "k3").flatten().tolist() == pytest.approx(k3)
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logp, ref, "k4")


def test_k3_clamped_and_nonnegative():
    logp = torch.tensor([[-30.0, 0.0, -5.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -30.0, -5.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert kl.flatten().tolist() == pytest.approx([10.0, 10.0, 0.0])  # result clamp
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    x = torch.randn(100) * 3
    assert (kl_penalty(x, torch.zeros(100), "k3") >= 0).all()


# ---------------------------------------------------------------------------------------------------------- aggregation


def test_aggregation_modes_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert aggregate(loss, mask, "token-mean", denominator=7).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token-sum"):
        aggregate(loss, mask, "token-sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregation_empty_mask_zero_with_grad(mode):
    loss = torch.randn(2, 4, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 4), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 4))


# ---------------------------------------------------------------------------------------------------------- PPO / GSPO


def test_ppo_clip_hand_computed():
    # ratios e^{0.5}=1.65 (clipped for A>0), e^{-0.5}=0.61 (clipped for A<0), 1.0
    logp_old = torch.zeros(1, 3)
    logp_new = torch.tensor([[0.5, -0.5, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    loss, m = ppo_clip_loss(logp_new, logp_old, adv, mask)
    expected = (-1.0 * 1.2 + 1.0 * 0.8 + -2.0 * 1.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["pg_clip_frac"] == pytest.approx(2 / 3)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-7)  # k1 mean of (old - new) = (-0.5 + 0.5 + 0) / 3
    assert m["approx_kl_k3"] == pytest.approx((math.exp(0.5) - 1.5 + math.exp(-0.5) - 0.5) / 3)
    loss.backward()
    assert logp_new.grad.flatten().tolist() == pytest.approx([0.0, 0.0, -2.0 / 3])  # clipped tokens get no gradient


def test_ppo_dual_clip_and_asymmetric():
    logp_old = torch.zeros(1, 2)
    logp_new = torch.tensor([[2.0, 0.1]])  # ratio e^2 = 7.39 with A < 0
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, m = ppo_clip_loss(logp_new, logp_old, adv, mask, dual_clip=3.0, clip_high=0.05)
    tok0 = 3.0  # min(max(7.39, 1.2), 3)
    tok1 = -min(math.exp(0.1), 1.05)  # clip_high 0.05
    assert loss.item() == pytest.approx((tok0 + tok1) / 2, abs=1e-6)
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp_new, logp_old, adv, mask, dual_clip=0.5)


def test_ppo_masked_tokens_ignored_and_seq_advantages():
    logp_old = torch.zeros(2, 3)
    logp_new = torch.tensor([[0.1, 9.0, 0.0], [0.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    a, _ = ppo_clip_loss(logp_new, logp_old, torch.tensor([1.0, -1.0]), mask)
    b, _ = ppo_clip_loss(logp_new, logp_old, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]), mask)
    assert a.item() == pytest.approx(b.item())
    assert a.item() == pytest.approx((-math.exp(0.1) - 1.0 + 1.0 + 1.0) / 4, abs=1e-6)


def test_gspo_sequence_ratio_and_token_gradients():
    logp_old = torch.zeros(1, 4)
    logp_new = torch.tensor([[0.02, -0.04, 0.05, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    adv = torch.tensor([1.0])
    loss, m = gspo_loss(logp_new, logp_old, adv, mask)
    s = math.exp((0.02 - 0.04 + 0.05) / 3)  # 1.01: inside the clip range
    assert loss.item() == pytest.approx(-s, abs=1e-6)
    assert m["ratio_mean"] == pytest.approx(s, abs=1e-6)
    loss.backward()
    # d/d logp_t of -(1/3) sum_t r_t with r_t = s * exp(logp_t - sg(logp_t)) -> -s / 3 per masked token
    assert logp_new.grad.flatten().tolist() == pytest.approx([-s / 3, -s / 3, -s / 3, 0.0], abs=1e-6)
    # sequence ratio outside the clip range: the whole sequence is clipped, no gradient
    far = torch.tensor([[0.5, 0.5, 0.5, 0.0]], requires_grad=True)
    loss2, m2 = gspo_loss(far, logp_old, adv, mask)
    loss2.backward()
    assert m2["pg_clip_frac"] == pytest.approx(1.0)
    assert torch.equal(far.grad, torch.zeros(1, 4))
