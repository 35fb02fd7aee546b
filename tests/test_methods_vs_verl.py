"""Each method's function equals verl's (verl/trainer/ppo/core_algos.py of the pinned PyPI release, tests/
verl_reference.py) on random tensors, to float tolerance: the advantage estimators (REMAX's included), Clip-Cov, KL-Cov, DAPO's
clip-higher as a setting of PPO-clip, Dr. GRPO's aggregation, and CISPO, SAPO, GMPO, GPG, DPPO-TV and DPPO-KL (value
and gradient; each prints its largest absolute gap to verl). (The likelihood anchor has no verl counterpart:
tests/test_methods.py checks it by hand.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from searchr1_lld.algo.advantages import broadcast_to_tokens, get_advantage_fn
from searchr1_lld.algo.aggregation import aggregate
from searchr1_lld.algo.covariance_losses import clip_cov_loss, kl_cov_loss
from searchr1_lld.algo.logprob_losses import cispo_loss, dppo_kl_loss, dppo_tv_loss, gpg_loss
from searchr1_lld.algo.ratio_losses import geo_mean_loss, sapo_loss
from searchr1_lld.algo.policy_loss import ppo_clip_loss
from verl_reference import verl_core_algos  # noqa: F401  (the session fixture)

VERL_ADVANTAGE = {"grpo": ("compute_grpo_outcome_advantage", {}),
                  "grpo_no_std": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
                  "rloo": ("compute_rloo_outcome_advantage", {}),
                  "reinforce_pp_baseline": ("compute_reinforce_plus_plus_baseline_outcome_advantage", {}),
                  "grpo_passk": ("compute_grpo_passk_outcome_advantage", {"config": {"norm_adv_by_std_in_grpo": True}}),
                  "opo": ("compute_opo_outcome_advantage", {}),
                  "gpg": ("compute_gpg_outcome_advantage", {})}


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
@pytest.mark.parametrize("rewards", ["graded", "binary"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantage_estimators_equal_verls(verl_core_algos, name, rewards, seed):
    scores, groups, mask, _, _ = _batch(seed)
    if rewards == "binary":  # exact-match rewards: ties within groups, zeros in the batch
        scores = (scores > 0.6).float()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(scores)), mask.sum(1).long() - 1] = scores  # the score on the last token
    fn, kw = VERL_ADVANTAGE[name]
    kw = {k: (_Config(**v) if k == "config" else v) for k, v in kw.items()}
    theirs, _ = getattr(verl_core_algos, fn)(token_rewards, mask, np.asarray(groups), **kw)
    ours = broadcast_to_tokens(get_advantage_fn(name)(scores, groups, mask, eps=1e-6), mask)
    print(f"advantage {name} ({rewards}, seed {seed}) vs verl {fn}: max abs gap {float((ours - theirs).abs().max()):.3g}")
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert float(ours.abs().sum()) > 0


@pytest.mark.parametrize("rewards", ["graded", "binary"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_remax_equals_verls(verl_core_algos, rewards, seed):
    """ReMax: each prompt group's greedy baseline, repeated over its responses as verl repeats the batch, against
    verl's compute_remax_outcome_advantage on the token rewards (the score on the last token)."""
    scores, groups, mask, _, _ = _batch(seed)
    _, inverse = torch.unique(groups, return_inverse=True)
    g = torch.Generator().manual_seed(100 + seed)
    greedy = torch.randint(0, 3, (int(inverse.max()) + 1,), generator=g).float() / 2
    if rewards == "binary":
        scores, greedy = (scores > 0.6).float(), (greedy > 0.6).float()
    baselines = greedy[inverse]
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(scores)), mask.sum(1).long() - 1] = scores
    theirs, _ = verl_core_algos.compute_remax_outcome_advantage(token_rewards, baselines, mask)
    ours = broadcast_to_tokens(get_advantage_fn("remax")(scores, groups, mask, eps=1e-6, baselines=baselines), mask)
    print(f"advantage remax ({rewards}, seed {seed}) vs verl compute_remax_outcome_advantage: max abs gap "
          f"{float((ours - theirs).abs().max()):.3g}")
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


def _verl_actor(verl, clip_low, clip_high, **fields):
    """An instance of verl's ActorConfig (as its stand-in class: CISPO and SAPO assert the type) with the fields the
    losses read."""
    cls = type("ActorConfigData", (verl.ActorConfig, _Config), {})
    return cls(clip_ratio=0.2, clip_ratio_low=clip_low, clip_ratio_high=clip_high, global_batch_info={},
               policy_loss=SimpleNamespace(), **fields)


def _realistic(seed: int, B: int = 32, T: int = 24):
    """_batch with log-probs of real probabilities (logp_new <= 0; DPPO reads exp(logp)) and GRPO advantages."""
    scores, groups, mask, logp_old, logp_new = _batch(seed, B=B, T=T)
    logp_new = logp_new.clamp(max=-1e-3)
    adv = broadcast_to_tokens(get_advantage_fn("grpo")(scores, groups, mask), mask)
    return mask, logp_old, logp_new, adv


# name: (our function and keywords, verl's function, its config's clip_low / clip_high and extra fields, agg mode)
VERL_LOSSES = {
    "cispo": (cispo_loss, {"clip_low": 10.0, "clip_high": 0.2}, "compute_policy_loss_cispo", (10.0, 0.2, {}),
              "token-mean"),
    "cispo_both_sides": (cispo_loss, {"clip_low": 0.2, "clip_high": 0.28}, "compute_policy_loss_cispo",
                         (0.2, 0.28, {}), "seq-mean-token-mean"),
    "sapo": (sapo_loss, {"tau_pos": 1.0, "tau_neg": 1.05}, "compute_policy_loss_sapo",
             (0.2, 0.2, {"tau_pos": 1.0, "tau_neg": 1.05}), "seq-mean-token-mean"),
    "sapo_steep": (sapo_loss, {"tau_pos": 2.0, "tau_neg": 4.0}, "compute_policy_loss_sapo",
                   (0.2, 0.2, {"tau_pos": 2.0, "tau_neg": 4.0}), "seq-mean-token-mean"),
    "geo_mean": (geo_mean_loss, {"clip_low": 0.4, "clip_high": 0.4}, "compute_policy_loss_geo_mean",
                 (0.4, 0.4, {}), "seq-mean-token-mean"),
    "geo_mean_narrow": (geo_mean_loss, {"clip_low": 0.05, "clip_high": 0.1}, "compute_policy_loss_geo_mean",
                        (0.05, 0.1, {}), "seq-mean-token-mean"),
    "gpg": (gpg_loss, {}, "compute_policy_loss_gpg", (0.2, 0.2, {}), "token-mean"),
    "dppo_tv": (dppo_tv_loss, {"clip_low": 0.15, "clip_high": 0.15, "clip_ratio_c": 1.2},
                "compute_policy_loss_dppo_tv", (0.15, 0.15, {"clip_ratio_c": 1.2}), "seq-mean-token-sum-norm"),
    "dppo_kl": (dppo_kl_loss, {"clip_low": 0.05, "clip_high": 0.02, "clip_ratio_c": 1.2},
                "compute_policy_loss_dppo_kl", (0.05, 0.02, {"clip_ratio_c": 1.2}), "token-mean"),
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", list(VERL_LOSSES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_new_policy_losses_equal_verls(verl_core_algos, name, weighted, seed):
    """Value and gradient (d loss / d logp_new) equal verl's, with and without rollout-correction token weights; the
    clip, gate or trust region is active on some tokens and not on others (the comparison exercised it)."""
    ours_fn, our_kw, verl_fn, (lo, hi, fields), agg_mode = VERL_LOSSES[name]
    mask, logp_old, logp_new, adv = _realistic(seed)
    weights = 0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(50 + seed)) if weighted else None
    cfg = _verl_actor(verl_core_algos, lo, hi, **fields)
    theirs = _value_and_grad(lambda x: getattr(verl_core_algos, verl_fn)(
        logp_old, x, adv, mask, loss_agg_mode=agg_mode, config=cfg, rollout_is_weights=weights), logp_new)
    ours_full = ours_fn(logp_new.clone().requires_grad_(True), logp_old, adv, mask, agg_mode=agg_mode,
                        token_weights=weights, **our_kw)
    ours = _value_and_grad(ours_fn, logp_new, logp_old, adv, mask, agg_mode=agg_mode, token_weights=weights,
                           **our_kw)
    gap = max(abs(ours[0] - theirs[0]), float((ours[1] - theirs[1]).abs().max()))
    print(f"policy loss {name} (weighted {weighted}, seed {seed}) vs verl {verl_fn}: max abs gap {gap:.3g}")
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    assert float(ours[1].abs().sum()) > 0
    if name not in ("gpg", "sapo", "sapo_steep"):  # these have nothing to clip
        assert 0 < ours_full[1]["pg_clip_frac"] < 1, ours_full[1]
