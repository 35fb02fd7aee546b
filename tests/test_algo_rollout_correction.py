"""Rollout correction (algo/rollout_correction.py): every IS weight mode and rejection rule, the statistics, the
mismatch diagnostics and the bypass mode's policy-loss term, hand-computed on small tensors; the policy loss's token
weights. (tests/test_rollout_correction_vs_verl.py compares them with verl's functions.)"""

from __future__ import annotations

import math

import pytest
import torch

from types import SimpleNamespace

from searchr1_lld.algo import rollout_correction as rc_fns
from searchr1_lld.algo.policy_loss import gspo_loss, ppo_clip_loss
from searchr1_lld.algo.rollout_correction import tis_weights, weight_stats
from searchr1_lld.algo.terms import TermBatch, policy_gradient

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
    # log-ratios clamped to +-20 before exp (verl's SAFETY_BOUND): the lowest weight is exp(-20), not 0
    assert torch.isfinite(w).all() and w[0, 0] == 2.0 and w[0, 1].item() == pytest.approx(math.exp(-20))
    assert not w.requires_grad
    assert tis_weights(old, torch.zeros(1, 2), torch.ones(1, 2), mode="sequence", cap=2.0)[0, 0] == 1.0  # sum 0


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="cap"):
        tis_weights(OLD, ENG, MASK, cap=0.5)
    with pytest.raises(ValueError, match="unknown rollout-correction weight mode 'off'.*token"):
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


# ---------------------------------------------------------------------------------------------------------------------
# the other weight modes, the rejection rules, their statistics, the diagnostics, bypass (OLD, ENG, MASK as above:
# log r = [0.5, -1.0, 0.0] and [-0.1, 0.3, (masked)]; sums -0.5 and 0.2)
# ---------------------------------------------------------------------------------------------------------------------

E = math.exp


def test_mask_modes_zero_the_weight_outside_the_bounds_and_truncation_takes_a_lower_bound():
    w = tis_weights(OLD, ENG, MASK, mode="token_mask", cap=1.5, cap_lower=0.5)  # IcePop: e^0.5 > 1.5, e^-1 < 0.5
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 1.0], [E(-0.1), E(0.3), 1.0]]), atol=1e-6)
    w = tis_weights(OLD, ENG, MASK, mode="token", cap=1.5, cap_lower=0.5)  # TRL's token_truncate: clip(r, c, C)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 1.0], [E(-0.1), E(0.3), 1.0]]), atol=1e-6)
    # TRL's sequence_mask (no lower bound): R = e^-0.5 kept as it is, e^0.2 = 1.22 above C = 1.1 weighs 0
    w = tis_weights(OLD, ENG, MASK, mode="sequence_mask", cap=1.1)
    assert torch.allclose(w, torch.tensor([[E(-0.5)] * 3, [0.0, 0.0, 1.0]]), atol=1e-6)
    w = tis_weights(OLD, ENG, MASK, mode="sequence_mask", cap=1.5, cap_lower=0.7)  # e^-0.5 = 0.61 < 0.7
    assert torch.allclose(w, torch.tensor([[0.0] * 3, [E(0.2), E(0.2), 1.0]]), atol=1e-6)
    w = tis_weights(OLD, ENG, MASK, mode="sequence", cap=1.1, cap_lower=0.7)
    assert torch.allclose(w, torch.tensor([[0.7] * 3, [1.1, 1.1, 1.0]]), atol=1e-6)


def _keep(name, upper, lower=None):
    log_r = rc_fns.log_ratio(OLD, ENG, MASK)
    return rc_fns.REJECTIONS[name](log_r, MASK != 0, upper=upper, lower=lower)[MASK != 0].tolist()


# k1 = -log r: [-0.5, 1.0, 0.0], [0.1, -0.3]; k2 = (log r)^2 / 2: [0.125, 0.5, 0], [0.005, 0.045];
# k3 = r - 1 - log r: [0.14872, 0.36788, 0], [0.00484, 0.04986]. Response tokens in order: 3 of row 0, 2 of row 1.
REJECTION_CASES = [
    ("token_k1", 2.0, None, [True, False, True, True, True]),  # |k1| <= log 2 = 0.693
    ("token_k1", 2.0, 0.8, [False, False, True, True, False]),  # k1 in [log 0.8, log 2] = [-0.223, 0.693]
    ("token_k2", 0.2, None, [True, False, True, True, True]),
    ("token_k3", 0.1, None, [False, False, True, True, True]),
    ("seq_sum_k1", 1.5, None, [False] * 3 + [True] * 2),  # sums 0.5 > log 1.5 = 0.405; -0.2
    ("seq_sum_k2", 0.1, None, [False] * 3 + [True] * 2),  # 0.625, 0.05
    ("seq_sum_k3", 0.1, None, [False] * 3 + [True] * 2),  # 0.5166, 0.0547
    ("seq_mean_k1", 1.2, 0.95, [True] * 3 + [False] * 2),  # geometric: means 0.1667 <= 0.182; -0.1 < log 0.95
    ("seq_mean_k2", 0.1, None, [False] * 3 + [True] * 2),  # 0.2083, 0.025
    ("seq_mean_k3", 0.05, None, [False] * 3 + [True] * 2),  # K3: 0.1722, 0.0273
    ("seq_max_k2", 0.1, None, [False] * 3 + [True] * 2),  # 0.5, 0.045
    ("seq_max_k3", 0.1, None, [False] * 3 + [True] * 2),  # 0.3679, 0.0499
]


@pytest.mark.parametrize("name, upper, lower, kept", REJECTION_CASES)
def test_rejection_rules_hand_computed(name, upper, lower, kept):
    assert _keep(name, upper, lower) == kept


def test_every_registered_rule_and_mode_has_a_hand_computed_case():
    assert {c[0] for c in REJECTION_CASES} == set(rc_fns.REJECTIONS)
    assert set(rc_fns.WEIGHT_MODES) == {"token", "sequence", "token_mask", "sequence_mask"}
    assert {n for n in rc_fns.REJECTIONS if rc_fns.takes_lower_bound(n)} == {"token_k1", "seq_sum_k1", "seq_mean_k1"}


def _settings(**kw):
    base = dict(mode="off", cap=2.0, cap_lower=None, rejection="off", rejection_upper=None, rejection_lower=None,
                bypass=False)
    return SimpleNamespace(**{**base, **kw})


def test_correct_composes_weights_and_rejection_and_its_statistics():
    rc = _settings(mode="token", cap=1.5, rejection="token_k1", rejection_upper=2.0)
    c = rc_fns.correct(rc, OLD, ENG, MASK)
    assert torch.allclose(c.weights, tis_weights(OLD, ENG, MASK, mode="token", cap=1.5))
    assert c.keep.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]  # 1 off the response
    assert c.mask(MASK.float()).tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    s = rc_fns.correction_stats(rc, OLD, ENG, MASK, c)
    assert s["rollout/masked_token_frac"] == pytest.approx(1 / 5)
    assert s["rollout/rejected_response_frac"] == pytest.approx(1 / 2)
    assert s["rollout/tis_capped_frac"] == pytest.approx(1 / 5) and "rollout/tis_below_frac" not in s
    off = rc_fns.correct(_settings(), OLD, ENG, MASK)
    assert off.weights is None and off.keep is None and off.mask(MASK) is MASK
    old = OLD.clone().requires_grad_(True)  # no gradient through weights or masks
    c = rc_fns.correct(_settings(mode="sequence", rejection="seq_mean_k3", rejection_upper=0.05), old, ENG, MASK)
    assert not c.weights.requires_grad and not c.keep.requires_grad
    assert c.keep[:, 0].tolist() == [0.0, 1.0]
    s = rc_fns.weight_stats(OLD, ENG, MASK, tis_weights(OLD, ENG, MASK, mode="sequence_mask", cap=1.5, cap_lower=0.7),
                            mode="sequence_mask", cap=1.5, cap_lower=0.7)
    assert s["rollout/tis_below_frac"] == pytest.approx(0.5) and s["rollout/tis_capped_frac"] == 0.0
    assert s["rollout/tis_weight_mean"] == pytest.approx(E(0.2) / 2)


def test_mismatch_metrics_hand_computed():
    # learner OLD, engine ENG: x = learner - engine = [0.5, -1, 0], [-0.1, 0.3]
    m = rc_fns.mismatch_metrics(OLD, ENG, MASK)
    x = [0.5, -1.0, 0.0, -0.1, 0.3]
    assert m["rollout/engine_learner_kl_k1"] == pytest.approx(-sum(x) / 5)
    assert m["rollout/engine_learner_kl_k3"] == pytest.approx(sum(E(v) - 1 - v for v in x) / 5)
    assert m["rollout/learner_ppl"] == pytest.approx((E(3.5 / 3) + E(0.2)) / 2)  # row means -7/6, -0.2
    assert m["rollout/engine_ppl"] == pytest.approx((E(1.0) + E(0.3)) / 2)  # row means -1, -0.3
    assert m["rollout/log_ppl_diff"] == pytest.approx((1 / 6 - 0.1) / 2)
    assert m["rollout/log_ppl_abs_diff"] == pytest.approx((1 / 6 + 0.1) / 2)
    assert m["rollout/chi2_token"] == pytest.approx(sum(E(2 * v) for v in x) / 5 - 1)
    assert m["rollout/chi2_seq"] == pytest.approx((E(-1.0) + E(0.4)) / 2 - 1)
    assert rc_fns.mismatch_metrics(None, ENG, MASK) == {"rollout/engine_ppl": m["rollout/engine_ppl"]}
    assert rc_fns.mismatch_metrics(OLD, ENG, torch.zeros_like(MASK)) == {}
    same = rc_fns.mismatch_metrics(OLD, OLD, MASK)  # engine = learner: no mismatch
    assert same["rollout/engine_learner_kl_k3"] == 0.0 and same["rollout/log_ppl_diff"] == 0.0


def _alg(policy_loss="ppo_clip", **rc):
    return SimpleNamespace(policy_loss=policy_loss, clip_eps=0.2, clip_low=None, clip_high=None, dual_clip=None,
                           loss_agg_mode="token-mean", top_entropy_quantile=1.0,
                           rollout_correction=_settings(bypass=True, **rc))


def test_bypass_term_weights_and_rejects_against_the_policy_being_updated():
    """Bypass: logp_old is the engine's (ENG), the current policy is OLD. REINFORCE with sequence TIS: loss =
    sum_t -A w logp_new / D with w = min(R, C) from pi_new / pi_engine, D the mini-batch's tokens; a rejection rule
    drops tokens from the numerator only (verl's compute_policy_loss_bypass_mode)."""
    adv = torch.tensor([1.0, -2.0])
    lp = OLD.clone().requires_grad_(True)
    batch = TermBatch(logp_new=lp, logp_old=ENG, advantages=adv, response_mask=MASK.float(), denominator=10.0,
                      token_denominator=10.0)
    value, m = policy_gradient(batch, _alg("reinforce", mode="sequence", cap=1.1))
    w = [E(-0.5), 1.1]  # R_0 = e^-0.5, R_1 = e^0.2 truncated at 1.1
    expected = (-1.0 * w[0] * (-1.0 - 2.0 - 0.5) + 2.0 * w[1] * (-0.3 - 0.1)) / 10
    assert value.item() == pytest.approx(expected, rel=1e-5)
    assert m["rollout/tis_weight_mean"] == pytest.approx((3 * w[0] + 2 * w[1]) / 5)
    assert m["rollout/engine_learner_kl_k1"] == pytest.approx(0.3 / 5)
    value.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-w[0]] * 3, [2 * w[1]] * 2 + [0.0]]) / 10, atol=1e-6)
    # PPO-clip against the engine, K3 rejection (response 0 rejected): ratio r = e^{x} of the kept response only
    value, m = policy_gradient(batch, _alg(rejection="seq_mean_k3", rejection_upper=0.05))
    r = [E(-0.1), E(0.3)]  # A = -2 < 0: max(-A r, -A clip(r, 0.8, 1.2)) = 2 max(r, clip(r))
    assert value.item() == pytest.approx((2 * max(r[0], 0.9048) + 2 * max(r[1], 1.2)) / 10, rel=1e-5)
    assert m["rollout/masked_token_frac"] == pytest.approx(3 / 5)
    plain, _ = policy_gradient(batch, SimpleNamespace(**{**vars(_alg()), "rollout_correction": None}))
    assert plain.item() != pytest.approx(value.item())
