"""The objective: micro-batch accumulation == one-shot mini-batch, hand-computed value and gradient, padding = 0."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.algo import aggregation
from algorithm_settings import algorithm, with_lam_answer
from searchr1_lld.algo.objective import mini_batch_denominators, objective


def _batch(seed=0, B=7, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 2, 5, 0, 7, 1, 4])  # uneven, one empty response
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    mask[4, 3] = 0  # a hole (an <information> block) splits response 4 into two action spans
    theta = torch.randn(B, T, generator=g, requires_grad=True)
    logp_old = torch.nn.functional.logsigmoid(theta.detach() + 0.3 * torch.randn(B, T, generator=g))
    logp_ref = torch.nn.functional.logsigmoid(theta.detach() - 0.2 * torch.randn(B, T, generator=g))
    adv = torch.tensor([1.0, -0.5, 0.7, 0.0, -1.2, 0.4, 0.0])
    answer = torch.zeros(B, T)
    answer[:, 1] = 1
    return theta, logp_old, logp_ref, adv, mask, answer


def _loss(spec, theta, rows, logp_old, logp_ref, adv, mask, answer, n_tok, n_resp, lam_answer):
    idx = torch.as_tensor(rows)
    logp_new = torch.nn.functional.logsigmoid(theta[idx])
    entropy = -logp_new.exp() * logp_new  # any differentiable per-token term
    loss, _ = objective(with_lam_answer(spec, lam_answer), logp_new, logp_old[idx], adv[idx], mask[idx],
                        mini_tokens=n_tok, mini_responses=n_resp, logp_ref=logp_ref[idx], entropy=entropy,
                        answer_mask=answer[idx])
    return loss


@pytest.mark.parametrize("agg_mode", list(aggregation.AGG_MODES))
@pytest.mark.parametrize("policy", ["ppo_clip", "gspo"])
def test_uneven_micro_batches_accumulate_to_the_mini_batch_gradient(agg_mode, policy):
    theta, logp_old, logp_ref, adv, mask, answer = _batch()
    spec = algorithm(policy_loss=policy, loss_agg_mode=agg_mode, kl_coef=0.3, entropy_coef=0.05, llds_lam=0.5,
                         llds_gate="action", clip_low=0.1, clip_high=0.15, dual_clip=3.0)
    n_tok, n_resp = mini_batch_denominators(mask)
    assert (n_tok, n_resp) == (float(mask.sum()), 6.0)
    one_shot = _loss(spec, theta, list(range(7)), logp_old, logp_ref, adv, mask, answer, n_tok, n_resp, 0.1)
    (g_one,) = torch.autograd.grad(one_shot, theta)
    acc = torch.zeros_like(theta)
    value = 0.0
    for rows in ([4], [0, 3, 6], [1, 2, 5]):  # uneven micro-batches, one containing the empty response
        loss = _loss(spec, theta, rows, logp_old, logp_ref, adv, mask, answer, n_tok, n_resp, 0.1)
        value += float(loss.detach())
        acc += torch.autograd.grad(loss, theta)[0]
    assert value == pytest.approx(float(one_shot.detach()), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(acc, g_one, rtol=1e-5, atol=1e-7)
    assert float(g_one.abs().sum()) > 0
    # the micro-batch's own normalisation (the bug this function prevents) would not accumulate to it
    wrong = torch.zeros_like(theta)
    for rows in ([4], [0, 3, 6], [1, 2, 5]):
        sub_tok, sub_resp = mini_batch_denominators(mask[torch.as_tensor(rows)])
        wrong += torch.autograd.grad(
            _loss(spec, theta, rows, logp_old, logp_ref, adv, mask, answer, sub_tok, sub_resp, 0.1), theta)[0]
    assert not torch.allclose(wrong, g_one, rtol=1e-3, atol=1e-6)


def test_hand_computed_value_token_mean():
    # logp_new == logp_old: ratio 1, no clipping, LLDS 0; pg = -sum(A m) / N_tok; KL k1 = logp - ref
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0], [-0.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    spec = algorithm(kl_coef=0.5, kl_type="k1", llds_lam=1.0)
    loss, m = objective(spec, logp, logp.detach(), adv, mask, mini_tokens=6.0, mini_responses=4.0, logp_ref=ref)
    pg = -(2.0 + 2.0 - 1.0) / 6.0
    kl_term = 0.5 * (0.5 + 0.0 + 0.0) / 6.0
    assert float(loss.detach()) == pytest.approx(pg + kl_term)
    assert m["kl_ref"] == pytest.approx(0.5 / 3)
    assert m["llds/loss"] == 0.0


def test_hand_computed_value_and_gradient_with_every_term_active():
    # B=2, T=3, the last column padding. log r = logp_new - logp_old; A = [1, -1]; clip 0.2; N_tok of the micro-batch
    # 4, of the mini-batch 5 (D = 5: every term is a sum over the micro-batch / 5)
    log_r = torch.tensor([[0.5, -0.1, 0.3], [-0.5, 0.1, -0.3]])
    x = torch.tensor([[0.2, -0.4, 0.5], [0.6, 0.0, 0.5]])  # logp_new - logp_ref
    logp = torch.tensor([[-1.0, -2.0, -0.3], [-0.7, -1.5, -0.9]], requires_grad=True)
    ent = torch.tensor([[1.0, 2.0, 5.0], [0.5, 1.5, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    spec = algorithm(kl_coef=0.5, kl_type="k2", entropy_coef=0.1, llds_lam=0.2, llds_gate="none")
    loss, m = objective(spec, logp, logp.detach() - log_r, adv, mask, mini_tokens=5.0, mini_responses=2.0,
                        logp_ref=logp.detach() - x, entropy=ent)
    e = math.exp
    # PPO-clip per token, max(-A r, -A clip(r, 0.8, 1.2)):
    #   (0,0) r = e^0.5 = 1.65 > 1.2, A > 0: clipped, -1.2 (no gradient)   (0,1) r = e^-0.1: -e^-0.1, d/dlogp = -e^-0.1
    #   (1,0) r = e^-0.5 = 0.61 < 0.8, A < 0: clipped, 0.8 (no gradient)   (1,1) r = e^0.1: e^0.1, d/dlogp = e^0.1
    pg_sum = -1.2 - e(-0.1) + 0.8 + e(0.1)
    kl_sum = 0.5 * (0.2**2 + 0.4**2 + 0.6**2)  # k2 = x^2 / 2; d/dlogp = x
    # LLDS (gate none): P = {response 0}; d = -log r; only (0,1) has d = 0.1 > 0: 0.2 * 0.1 / 5, d/dlogp = -0.2 / 5
    expected = pg_sum / 5 + 0.5 * kl_sum / 5 - 0.1 * (1.0 + 2.0 + 0.5 + 1.5) / 5 + 0.2 * 0.1 / 5
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    g_logp, g_ent = torch.autograd.grad(loss, (logp, ent))
    expected_g = torch.tensor([[0.5 * 0.2, -e(-0.1) + 0.5 * -0.4 - 0.2, 0.0], [0.5 * 0.6, e(0.1), 0.0]]) / 5
    torch.testing.assert_close(g_logp, expected_g, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_ent, -0.1 * mask / 5, rtol=1e-6, atol=1e-7)
    assert m["pg_loss"] == pytest.approx(pg_sum / 4, rel=1e-6)  # the micro-batch's own token mean
    assert m["pg_clip_frac"] == 0.5 and m["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["kl_ref"] == pytest.approx(kl_sum / 4, rel=1e-6) and m["entropy"] == pytest.approx(5.0 / 4)
    assert m["llds/loss"] == pytest.approx(0.2 * 0.1 / 5, rel=1e-5) and m["llds/active_token_frac"] == 0.25


def test_padding_micro_batch_has_zero_gradient_and_bad_denominators_fail():
    theta, logp_old, logp_ref, adv, mask, answer = _batch()
    spec = algorithm(kl_coef=0.1, llds_lam=0.2)
    loss = _loss(spec, theta, [0, 1], logp_old, logp_ref, adv, mask, answer, 10.0, 2.0, None) * 0.0
    (g,) = torch.autograd.grad(loss, theta)
    assert float(g.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="denominators"):
        objective(spec, theta, logp_old, adv, mask, mini_tokens=0.0, mini_responses=1.0)

