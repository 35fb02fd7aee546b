"""The composed objective: micro-batch accumulation == one-shot mini-batch, hand-computed value, padding = 0."""

from __future__ import annotations

import dataclasses
import importlib
import warnings

import pytest
import torch

from searchr1_lld.algo import aggregation
from searchr1_lld.algo.objective import ObjectiveSpec, composed_objective, mini_batch_denominators, objective


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
    loss, _ = objective(spec, logp_new, logp_old[idx], adv[idx], mask[idx], mini_tokens=n_tok, mini_responses=n_resp,
                        logp_ref=logp_ref[idx], entropy=entropy, answer_mask=answer[idx], lam_answer=lam_answer)
    return loss


@pytest.mark.parametrize("agg_mode", list(aggregation.AGG_MODES))
@pytest.mark.parametrize("policy", ["ppo_clip", "gspo"])
def test_uneven_micro_batches_accumulate_to_the_mini_batch_gradient(agg_mode, policy):
    theta, logp_old, logp_ref, adv, mask, answer = _batch()
    spec = ObjectiveSpec(policy_loss=policy, agg_mode=agg_mode, kl_coef=0.3, entropy_coef=0.05, llds_lam=0.5,
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
    spec = ObjectiveSpec(kl_coef=0.5, kl_type="k1", llds_lam=1.0)
    loss, m = objective(spec, logp, logp.detach(), adv, mask, mini_tokens=6.0, mini_responses=4.0, logp_ref=ref)
    pg = -(2.0 + 2.0 - 1.0) / 6.0
    kl_term = 0.5 * (0.5 + 0.0 + 0.0) / 6.0
    assert float(loss.detach()) == pytest.approx(pg + kl_term)
    assert m["kl_ref"] == pytest.approx(0.5 / 3)
    assert m["llds/loss"] == 0.0


def test_padding_micro_batch_has_zero_gradient_and_bad_denominators_fail():
    theta, logp_old, logp_ref, adv, mask, answer = _batch()
    spec = ObjectiveSpec(kl_coef=0.1, llds_lam=0.2)
    loss = _loss(spec, theta, [0, 1], logp_old, logp_ref, adv, mask, answer, 10.0, 2.0, None) * 0.0
    (g,) = torch.autograd.grad(loss, theta)
    assert float(g.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="denominators"):
        objective(spec, theta, logp_old, adv, mask, mini_tokens=0.0, mini_responses=1.0)


def _fused_vs_composed(spec, theta, logp_old, logp_ref, adv, mask, answer, lam_answer, token_weights, core=None):
    n_tok, n_resp = mini_batch_denominators(mask)
    results = []
    for fn in (objective, composed_objective):
        th = theta.detach().clone().requires_grad_(True)
        logp_new = torch.nn.functional.logsigmoid(th)
        entropy = -logp_new.exp() * logp_new
        loss, metrics = fn(spec, logp_new, logp_old, adv, mask, mini_tokens=n_tok + 3, mini_responses=n_resp + 1,
                           logp_ref=logp_ref, entropy=entropy, answer_mask=answer, lam_answer=lam_answer,
                           token_weights=token_weights)
        (grad,) = torch.autograd.grad(loss * 1.7, th)
        results.append((loss.detach(), metrics, grad))
    return results


@pytest.mark.parametrize("agg_mode", list(aggregation.AGG_MODES))
@pytest.mark.parametrize("kl_type", ["low_var_kl", "k1", "abs", "k2"])
@pytest.mark.parametrize("variant", ["plain", "dual_weights_ma", "response_gate", "no_llds_1d_adv"])
def test_fused_objective_equals_the_composed_reference(agg_mode, kl_type, variant):
    theta, logp_old, logp_ref, adv, mask, answer = _batch(seed=3)
    # large displacements so that clipping, the dual clip, both KL clamps and the LLDS gate are all exercised
    logp_old = torch.nn.functional.logsigmoid(theta.detach() + 0.7 + 2.0 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(5)))
    logp_ref = logp_ref.clone()
    logp_ref[0, :3] = -30.0  # k3's log-ratio clamp (|x| > 20) and result clamp (> 10)
    kw = dict(agg_mode=agg_mode, kl_type=kl_type, kl_coef=0.3, entropy_coef=0.05, clip_low=0.1, clip_high=0.15,
              llds_lam=0.5, llds_gate="action", llds_tau=0.05)
    lam_answer, weights = None, None
    if variant == "dual_weights_ma":
        kw["dual_clip"] = 1.5
        lam_answer = 0.1
        weights = torch.rand(theta.shape, generator=torch.Generator().manual_seed(7)) * 2
    elif variant == "response_gate":
        kw["llds_gate"] = "response"
    elif variant == "no_llds_1d_adv":
        kw.update(llds_lam=0.0, entropy_coef=0.0)
    token_adv = adv[:, None].expand_as(mask) * mask if variant != "no_llds_1d_adv" else adv
    spec = ObjectiveSpec(**kw)
    (f_loss, f_m, f_grad), (r_loss, r_m, r_grad) = _fused_vs_composed(
        spec, theta, logp_old, logp_ref, token_adv, mask, answer, lam_answer, weights)
    # within 1e-6, relative to the value's size (fp32: the k2 term reaches ~50 here, one ulp is 4e-6)
    assert abs(float(f_loss) - float(r_loss)) <= 1e-6 * max(1.0, abs(float(r_loss)))
    torch.testing.assert_close(f_grad, r_grad, rtol=1e-6, atol=1e-6)
    assert float(r_grad.abs().sum()) > 0
    assert set(f_m) == set(r_m)
    for k in r_m:
        assert f_m[k] == pytest.approx(r_m[k], rel=1e-6, abs=1e-6), k
    if kw["llds_lam"] > 0:
        assert r_m["llds/active_token_frac"] > 0  # the LLDS term is really exercised


def test_fused_objective_detects_a_wrong_gradient():
    # guard for the equivalence test above: a fused gradient that drops the LLDS part must not pass
    theta, logp_old, logp_ref, adv, mask, answer = _batch(seed=3)
    logp_old = torch.nn.functional.logsigmoid(theta.detach() + 2.0)
    spec = ObjectiveSpec(llds_lam=0.5)
    (_, _, f_grad), (_, _, r_grad) = _fused_vs_composed(spec, theta, logp_old, logp_ref, adv, mask, answer, None, None)
    no_llds = ObjectiveSpec(llds_lam=0.0)
    (_, _, g0), _ = _fused_vs_composed(no_llds, theta, logp_old, logp_ref, adv, mask, answer, None, None)
    torch.testing.assert_close(f_grad, r_grad, rtol=0, atol=1e-6)
    assert (f_grad - g0).abs().max() > 1e-3


@pytest.mark.slow
def test_compiled_objective_equals_eager():
    """torch.compile of the fused pass (ObjectiveSpec.compile) agrees with the eager pass within 1e-6."""
    theta, logp_old, logp_ref, adv, mask, answer = _batch(seed=3)
    logp_old = torch.nn.functional.logsigmoid(theta.detach() + 0.5 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(5)))
    spec = ObjectiveSpec(kl_coef=0.3, entropy_coef=0.05, llds_lam=0.5, dual_clip=2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager = _fused_vs_composed(spec, theta, logp_old, logp_ref, adv, mask, answer, 0.1, None)[0]
        compiled = _fused_vs_composed(dataclasses.replace(spec, compile=True), theta, logp_old, logp_ref, adv, mask,
                                      answer, 0.1, None)[0]
    assert not [w for w in caught if "running it eagerly" in str(w.message)], "compile fell back to eager"
    assert abs(float(eager[0]) - float(compiled[0])) <= 1e-6
    torch.testing.assert_close(eager[2], compiled[2], rtol=0, atol=1e-6)
    for k in eager[1]:
        assert compiled[1][k] == pytest.approx(eager[1][k], abs=1e-6), k


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    objective_mod = importlib.import_module("searchr1_lld.algo.objective")

    def broken(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(objective_mod, "_COMPILED", None)
    monkeypatch.setattr(torch, "compile", broken)
    theta, logp_old, logp_ref, adv, mask, answer = _batch(seed=3)
    spec = ObjectiveSpec(kl_coef=0.3, llds_lam=0.5, compile=True)
    with pytest.warns(UserWarning, match="running it eagerly") as caught:
        (f_loss, _, f_grad), (r_loss, _, r_grad) = _fused_vs_composed(spec, theta, logp_old, logp_ref, adv, mask,
                                                                         answer, None, None)
        _fused_vs_composed(spec, theta, logp_old, logp_ref, adv, mask, answer, None, None)
    assert len([w for w in caught if "running it eagerly" in str(w.message)]) == 1
    torch.testing.assert_close(f_grad, r_grad, rtol=0, atol=1e-6)
