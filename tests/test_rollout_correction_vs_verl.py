"""The rollout correction equals verl 0.9.1's (``verl/trainer/ppo/rollout_corr_helper.py`` and the bypass loss of
``core_algos.py``, executed from the pinned wheel by tests/verl_reference.py) on random log-probs in realistic
ranges: engine/learner gaps from 1e-3 to 1 per token (log-uniform per response), ragged responses, thresholds that
some responses cross. Each test prints its largest absolute gap to verl. The presets are checked against verl's
classmethods of the same name."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from searchr1_lld.algo import rollout_correction as rc_fns
from searchr1_lld.algo.policy_loss import get_policy_loss_fn
from searchr1_lld.algo.terms import TermBatch, policy_gradient
from searchr1_lld.config import load_config
from searchr1_lld.config.correction_presets import CORRECTION_PRESETS
from searchr1_lld.config.validation import get_dotted
from verl_reference import verl_rollout_corr  # noqa: F401  (the session fixture)


def _logprobs(seed: int, B: int = 48, T: int = 24):
    """(logp_old, logp_engine, mask): engine log-probs in [-4, 0], the learner's off by N(0, s_i) per token with s_i
    log-uniform in [1e-3, 1] per response; every response has at least one token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    engine = -torch.rand(B, T, generator=g) * 4
    scale = 10 ** (-3 + 3 * torch.rand(B, 1, generator=g))
    old = engine + scale * torch.randn(B, T, generator=g)
    return old, engine, mask


def _gap(name: str, ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> float:
    gap = float(((ours - theirs) * mask).abs().max())
    print(f"{name}: max abs gap to verl {gap:.3g}")
    return gap


WEIGHT_CASES = [  # (our mode, cap, cap_lower, verl's rollout_is, rollout_is_threshold)
    ("token", 2.0, None, "token", 2.0),
    ("sequence", 2.0, None, "sequence", 2.0),
    ("sequence", 5.0, None, "sequence", 5.0),
    ("token_mask", 5.0, 0.5, "token", "0.5_5.0"),
    ("token_mask", 1.2, 0.9, "token", "0.9_1.2"),
    ("sequence_mask", 5.0, 0.5, "sequence", "0.5_5.0"),
    ("sequence_mask", 3.0, None, "sequence", "1e-30_3.0"),  # TRL's sequence_mask (no lower bound) as verl's IcePop
]


@pytest.mark.parametrize("mode, cap, cap_lower, level, threshold", WEIGHT_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weight_modes_equal_verls(verl_rollout_corr, mode, cap, cap_lower, level, threshold, seed):
    old, eng, mask = _logprobs(seed)
    theirs, _ = verl_rollout_corr.helper.compute_rollout_correction_weights(
        old - eng, mask, rollout_is=level, rollout_is_threshold=threshold)
    ours = rc_fns.tis_weights(old, eng, mask, mode=mode, cap=cap, cap_lower=cap_lower)
    assert _gap(f"weights {mode} C={cap} c={cap_lower} (seed {seed})", ours, theirs, mask) < 1e-5
    assert torch.all(ours[mask == 0] == 1.0)
    w = ours[mask != 0]  # the bounds were crossed: some weights capped or zeroed, others not
    assert bool((w == 0).any() | (w == cap).any()) and bool(((w > 0) & (w < cap)).any())


REJECTION_CASES = [  # (rule, our upper, our lower, verl's rollout_rs_threshold)
    ("token_k1", 2.0, 0.5, "0.5_2.0"),
    ("token_k1", 1.5, None, 1.5),  # one bound: the lower is its reciprocal
    ("token_k2", 0.05, None, 0.05),
    ("token_k3", 0.05, None, 0.05),
    ("seq_sum_k1", 2.0, 0.5, "0.5_2.0"),  # seq-MIS (decoupled_seq_is_rs)
    ("seq_sum_k2", 1.0, None, 1.0),
    ("seq_sum_k3", 1.0, None, 1.0),
    ("seq_mean_k1", 1.001, 0.999, "0.999_1.001"),  # Geo-RS (verl's default bounds)
    ("seq_mean_k1", 1.1, 0.8, "0.8_1.1"),
    ("seq_mean_k2", 0.01, None, 0.01),
    ("seq_mean_k3", 0.01, None, 0.01),  # K3-RS (verl's default bound)
    ("seq_max_k2", 0.1, None, 0.1),
    ("seq_max_k3", 0.1, None, 0.1),
]


@pytest.mark.parametrize("rule, upper, lower, threshold", REJECTION_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_rules_equal_verls(verl_rollout_corr, rule, upper, lower, threshold, seed):
    old, eng, mask = _logprobs(seed)
    theirs, metrics = verl_rollout_corr.helper.compute_rollout_rejection_mask(
        old - eng, mask, rollout_rs=rule, rollout_rs_threshold=threshold)
    settings = SimpleNamespace(mode="off", cap=2.0, cap_lower=None, rejection=rule, rejection_upper=upper,
                               rejection_lower=lower, bypass=False)
    c = rc_fns.correct(settings, old, eng, mask)
    ours = c.mask(mask)
    assert _gap(f"rejection {rule} {threshold} (seed {seed})", ours, theirs, torch.ones_like(mask)) == 0.0
    kept = float(ours.sum())
    assert 0 < kept < float(mask.sum())  # some tokens rejected, some kept
    stats = rc_fns.rejection_stats(mask, c.keep)
    assert stats["rollout/masked_token_frac"] == pytest.approx(metrics["rollout_rs_masked_fraction"], abs=1e-6)
    assert stats["rollout/rejected_response_frac"] == pytest.approx(metrics["rollout_rs_seq_masked_fraction"],
                                                                    abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mismatch_metrics_equal_verls_offpolicy_metrics(verl_rollout_corr, seed):
    old, eng, mask = _logprobs(seed)
    theirs = verl_rollout_corr.helper.compute_offpolicy_metrics(old, eng, mask)
    ours = rc_fns.mismatch_metrics(old, eng, mask)
    names = {"engine_learner_kl_k1": "kl", "engine_learner_kl_k3": "k3_kl", "learner_ppl": "training_ppl",
             "engine_ppl": "rollout_ppl", "log_ppl_diff": "log_ppl_diff", "log_ppl_abs_diff": "log_ppl_abs_diff",
             "chi2_token": "chi2_token", "chi2_seq": "chi2_seq"}
    assert set(ours) == {f"rollout/{k}" for k in names}
    gaps = {k: abs(ours[f"rollout/{k}"] - theirs[v]) / max(1.0, abs(theirs[v])) for k, v in names.items()}
    print(f"mismatch metrics (seed {seed}): largest relative gap to verl {max(gaps.values()):.3g}")
    assert max(gaps.values()) < 1e-5, gaps
    assert theirs["kl"] != 0.0 and theirs["chi2_seq"] > 0.1  # a real mismatch was measured


def _from_verl(cfg) -> dict:
    """verl's RolloutCorrectionConfig as this repository's settings (config/correction_presets.py's mapping)."""
    out = {"rollout_correction.mode": "off", "rollout_correction.rejection": "off",
           "rollout_correction.bypass": bool(cfg.bypass_mode)}
    if cfg.rollout_is is not None:
        spec = str(cfg.rollout_is_threshold)
        lower, _, upper = spec.rpartition("_")
        out["rollout_correction.mode"] = cfg.rollout_is + ("_mask" if lower else "")
        out["rollout_correction.cap"] = float(upper)
        if lower:
            out["rollout_correction.cap_lower"] = float(lower)
    if cfg.rollout_rs is not None:
        lower, _, upper = str(cfg.rollout_rs_threshold).rpartition("_")
        out["rollout_correction.rejection"] = cfg.rollout_rs
        out["rollout_correction.rejection_upper"] = float(upper)
        out["rollout_correction.rejection_lower"] = float(lower) if lower else None
    if cfg.bypass_mode:
        out["policy_loss"] = cfg.loss_type
    return out


def test_presets_are_verls_classmethods(verl_rollout_corr):
    """Every classmethod preset of verl's RolloutCorrectionConfig is a preset here under its name, expanding into
    the same settings (verl's defaults of its arguments); trl_sequence_mask is TRL's default."""
    cls = verl_rollout_corr.config.RolloutCorrectionConfig
    verl_names = {n for n, v in vars(cls).items() if isinstance(v, classmethod)}
    assert verl_names == set(CORRECTION_PRESETS) - {"trl_sequence_mask"}
    for name in sorted(verl_names):
        alg = load_config(None, [f"algorithm.rollout_correction.preset={name}"]).algorithm
        for key, value in _from_verl(getattr(cls, name)()).items():
            got = get_dotted(alg, key)
            assert got == value, (name, key, got, value)
    trl = load_config(None, ["algorithm.rollout_correction.preset=trl_sequence_mask"]).algorithm.rollout_correction
    assert (trl.mode, trl.cap, trl.cap_lower, trl.rejection, trl.bypass) == ("sequence_mask", 3.0, None, "off", False)


BYPASS_PRESETS = ["bypass_ppo_clip", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs", "bypass_pg_is",
                  "bypass_pg_token_icepop", "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis",
                  "bypass_pg_geo_rs_token_tis"]


class _Config(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


@pytest.mark.parametrize("name", BYPASS_PRESETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_bypass_policy_loss_equals_verls(verl_rollout_corr, name, seed):
    """Our policy-loss term in bypass mode (logp_old := the engine's) against verl's
    compute_policy_loss_bypass_mode with the preset's config, value and gradient; token-mean over the mini-batch's
    tokens (verl's global batch_num_tokens), PPO-clip with verl's default dual clip 3."""
    eng, new, mask = _logprobs(seed, B=32, T=20)  # current policy `new` off the engine by 1e-3..1 per token
    adv = torch.randn(32, generator=torch.Generator().manual_seed(seed + 7))[:, None] * mask
    verl_cfg = getattr(verl_rollout_corr.config.RolloutCorrectionConfig, name)()
    actor = _Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                    global_batch_info={"dp_size": 1, "batch_num_tokens": float(mask.sum())},
                    policy_loss=_Config(rollout_correction=verl_cfg))
    alg = load_config(None, [f"algorithm.rollout_correction.preset={name}", "algorithm.dual_clip=3.0"]).algorithm

    def theirs_fn(x):
        with mock.patch.dict(sys.modules, verl_rollout_corr.modules):
            return verl_rollout_corr.core_algos.compute_policy_loss_bypass_mode(
                eng, x, adv, mask, loss_agg_mode="token-mean", config=actor)

    def ours_fn(x):
        batch = TermBatch(logp_new=x, logp_old=eng, advantages=adv, response_mask=mask,
                          denominator=float(mask.sum()), token_denominator=float(mask.sum()))
        return policy_gradient(batch, alg)

    (v_theirs, g_theirs), (v_ours, g_ours) = (_value_and_grad(fn, new) for fn in (theirs_fn, ours_fn))
    gap = max(abs(v_ours - v_theirs), float((g_ours - g_theirs).abs().max()))
    print(f"bypass {name} (seed {seed}): max abs gap to verl (value, gradient) {gap:.3g}")
    assert v_ours == pytest.approx(v_theirs, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    assert float(g_ours.abs().sum()) > 0


def _value_and_grad(fn, logp_new):
    x = logp_new.clone().requires_grad_(True)
    loss = fn(x)[0]
    return float(loss.detach()), torch.autograd.grad(loss, x)[0]


def test_reinforce_is_verls_reinforce_loss(verl_rollout_corr):
    eng, new, mask = _logprobs(3, B=16, T=12)
    adv = torch.randn(16, generator=torch.Generator().manual_seed(3))[:, None] * mask
    w = rc_fns.tis_weights(new, eng, mask, mode="sequence", cap=2.0)
    actor = _Config(global_batch_info={})
    theirs = _value_and_grad(lambda x: verl_rollout_corr.core_algos.compute_policy_loss_reinforce(
        eng, x, adv, mask, loss_agg_mode="token-mean", config=actor, rollout_is_weights=w), new)
    ours = _value_and_grad(lambda x: get_policy_loss_fn("reinforce")(x, eng, adv, mask, token_weights=w), new)
    gap = max(abs(ours[0] - theirs[0]), float((ours[1] - theirs[1]).abs().max()))
    print(f"reinforce: max abs gap to verl (value, gradient) {gap:.3g}")
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
