"""Each method's function equals verl's (verl/trainer/ppo/core_algos.py of the pinned PyPI release, tests/
verl_reference.py) on random tensors, to float tolerance: the advantage estimators, Clip-Cov, KL-Cov, DAPO's
clip-higher as a setting of PPO-clip, and Dr. GRPO's aggregation. (The likelihood anchor has no verl counterpart:
tests/test_methods.py checks it by hand.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from searchr1_lld.algo.advantages import broadcast_to_tokens, get_advantage_fn
from searchr1_lld.algo.aggregation import aggregate
from searchr1_lld.algo.covariance_losses import clip_cov_loss, kl_cov_loss
from searchr1_lld.algo.policy_loss import ppo_clip_loss
from verl_reference import verl_core_algos  # noqa: F401  (the session fixture)

VERL_ADVANTAGE = {"grpo": ("compute_grpo_outcome_advantage", {}),
                  "grpo_no_std": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
                  "rloo": ("compute_rloo_outcome_advantage", {}),
                  "reinforce_pp_baseline": ("compute_reinforce_plus_plus_baseline_outcome_advantage", {})}


def _batch(seed: int, B: int = 24, T: int = 11):
    """Random rewards in groups of 2..5 (every group at least two: rollout.n >= 2), ragged masks, log-probs."""
    g = torch.Generator().manual_seed(seed)
    sizes = []
    while sum(sizes) < B:
        sizes.append(int(torch.randint(2, 6, (1,), generator=g)))
    sizes[-1] -= sum(sizes) - B
    if sizes[-1] < 2:
        sizes[-2] += sizes.pop()
    groups = torch.repeat_interleave(torch.arange(len(sizes)) * 7 + 3, torch.tensor(sizes))
    scores = torch.randint(0, 3, (B,), generator=g).float() / 2 + 0.1 * torch.rand(B, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logp_old = -torch.rand(B, T, generator=g) * 4
    logp_new = logp_old + 0.3 * torch.randn(B, T, generator=g)
    return scores, groups, mask, logp_old, logp_new


@pytest.mark.parametrize("name", list(VERL_ADVANTAGE))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantage_estimators_equal_verls(verl_core_algos, name, seed):
    scores, groups, mask, _, _ = _batch(seed)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(scores)), mask.sum(1).long() - 1] = scores  # the score on the last token
    fn, kw = VERL_ADVANTAGE[name]
    theirs, _ = getattr(verl_core_algos, fn)(token_rewards, mask, np.asarray(groups), **kw)
    ours = broadcast_to_tokens(get_advantage_fn(name)(scores, groups, mask, eps=1e-6), mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert float(ours.abs().sum()) > 0


class _Config(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


def _actor_config(clip_low=0.2, clip_high=0.2, **policy_loss):
    """The fields of verl's ActorConfig its policy losses read (a plain namespace with ``get``: the config is
    data)."""
    return _Config(clip_ratio=0.2, clip_ratio_low=clip_low, clip_ratio_high=clip_high, global_batch_info={},
                           policy_loss=SimpleNamespace(**{"clip_cov_ratio": None, "clip_cov_lb": None,
                                                          "clip_cov_ub": None, "kl_cov_ratio": None,
                                                          "ppo_kl_coef": None, **policy_loss}))


def _value_and_grad(fn, logp_new, *args, **kw):
    x = logp_new.clone().requires_grad_(True)
    loss = fn(x, *args, **kw)[0]
    return float(loss.detach()), torch.autograd.grad(loss, x)[0]


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_cov_equals_verls(verl_core_algos, agg_mode, seed):
    scores, groups, mask, logp_old, logp_new = _batch(seed, B=40, T=30)
    adv = broadcast_to_tokens(4 * get_advantage_fn("grpo")(scores, groups, mask), mask)
    logp_new = logp_old + 1.5 * (logp_new - logp_old)  # wide covariance: many candidates in (lb, ub)
    cfg = _actor_config(0.2, 0.28, clip_cov_ratio=0.02, clip_cov_lb=1.0, clip_cov_ub=5.0)
    torch.manual_seed(100 + seed)
    theirs = _value_and_grad(lambda x: verl_core_algos.compute_policy_loss_clip_cov(
        logp_old, x, adv, mask, loss_agg_mode=agg_mode, config=cfg), logp_new)
    torch.manual_seed(100 + seed)  # the same draw of the covariance tokens
    ours = _value_and_grad(clip_cov_loss, logp_new, logp_old, adv, mask, clip_low=0.2, clip_high=0.28,
                           agg_mode=agg_mode, ratio=0.02, lb=1.0, ub=5.0)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    # the covariance removed the gradient of some tokens PPO did not clip (the comparison exercised the draw)
    plain = _value_and_grad(ppo_clip_loss, logp_new, logp_old, adv, mask, clip_low=0.2, clip_high=0.28,
                            agg_mode=agg_mode)
    assert int(((plain[1] != 0) & (ours[1] == 0)).sum()) >= 2


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_cov_equals_verls(verl_core_algos, agg_mode, seed):
    scores, groups, mask, logp_old, logp_new = _batch(seed, B=40, T=30)
    adv = broadcast_to_tokens(get_advantage_fn("grpo")(scores, groups, mask), mask)
    cfg = _actor_config(kl_cov_ratio=0.05, ppo_kl_coef=0.7)
    theirs = _value_and_grad(lambda x: verl_core_algos.compute_policy_loss_kl_cov(
        logp_old, x, adv, mask, loss_agg_mode=agg_mode, config=cfg), logp_new)
    ours = _value_and_grad(kl_cov_loss, logp_new, logp_old, adv, mask, agg_mode=agg_mode, ratio=0.05, coef=0.7)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    unpenalised = _value_and_grad(kl_cov_loss, logp_new, logp_old, adv, mask, agg_mode=agg_mode, ratio=0.05, coef=0.0)
    assert not torch.allclose(ours[1], unpenalised[1])  # the penalty is part of what was compared


@pytest.mark.parametrize("seed", [0, 1])
def test_clip_higher_is_verls_vanilla_loss_with_asymmetric_clip(verl_core_algos, seed):
    scores, groups, mask, logp_old, logp_new = _batch(seed, B=32, T=20)
    adv = broadcast_to_tokens(get_advantage_fn("grpo")(scores, groups, mask), mask)
    cfg = _actor_config(0.2, 0.28)
    cfg.clip_ratio_c = 3.0
    theirs = _value_and_grad(lambda x: verl_core_algos.compute_policy_loss_vanilla(
        logp_old, x, adv, mask, loss_agg_mode="token-mean", config=cfg), logp_new)
    ours = _value_and_grad(ppo_clip_loss, logp_new, logp_old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq_mean_token_sum_norm_equals_verls(verl_core_algos, seed):
    _, _, mask, _, loss_mat = _batch(seed)
    mask[3] = 0  # a fully padded response is not counted
    theirs = verl_core_algos.agg_loss(loss_mat, mask, "seq-mean-token-sum-norm")  # C = T
    assert float(aggregate(loss_mat, mask, "seq-mean-token-sum-norm")) == pytest.approx(float(theirs), rel=1e-6)
    n_resp = float((mask.sum(1) > 0).sum())
    theirs_c = verl_core_algos.agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=4096)
    ours_c = aggregate(loss_mat, mask, "seq-mean-token-sum-norm", denominator=n_resp * 4096)
    assert float(ours_c) == pytest.approx(float(theirs_c), rel=1e-6)
