"""The methods by name, by hand: each new function on a small tensor computed by hand, the advantage estimator the
step looks up by name, and each preset's expansion (what it pins, and the loud conflict with a pinned key)."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.algo import advantages
from searchr1_lld.algo.aggregation import aggregate
from searchr1_lld.algo.anchor import nll_anchor_loss
from searchr1_lld.algo.covariance_losses import clip_cov_loss, kl_cov_loss
from searchr1_lld.config import ConfigError, format_help, load_config, save_config
from searchr1_lld.config.methods import METHODS, SWITCHES

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_advantage_estimators_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([5, 5, 5, 9])  # group 9 is a singleton: advantage 0
    # group 5: mean 1/3, unbiased std sqrt(1/3)
    grpo = advantages.get_advantage_fn("grpo")(scores, groups, MASK)
    s = math.sqrt(1 / 3)
    assert grpo.tolist() == pytest.approx([(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), 0.0])
    assert advantages.get_advantage_fn("grpo_no_std")(scores, groups, MASK).tolist() == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 0.0])
    # RLOO: r_i - mean of the others: 1 - 0, 0 - 1/2, 0 - 1/2
    assert advantages.get_advantage_fn("rloo")(scores, groups, MASK).tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0])
    # REINFORCE++ baseline: c = [2/3, -1/3, -1/3, 0] weighted by tokens n = [2, 1, 3, 2] (N = 8)
    c, n = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]), torch.tensor([2.0, 1.0, 3.0, 2.0])
    mu = float((n * c).sum() / 8)
    var = float((n * (c - mu) ** 2).sum() / 7)
    expected = [(x - mu) / math.sqrt(var + 1e-8) for x in c.tolist()]
    assert advantages.get_advantage_fn("reinforce_pp_baseline")(scores, groups, MASK).tolist() == pytest.approx(
        expected, rel=1e-6, abs=1e-6)
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        advantages.get_advantage_fn("gae")


def test_seq_mean_token_sum_norm_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]])
    mask = MASK.clone()
    mask[3] = 0
    # token sums 3, 4, 24 over 3 responses, divided by C = T = 3; or by a given 3 x 10
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(31 / (3 * 3))
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm", denominator=30)) == pytest.approx(31 / 30)


def test_nll_anchor_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0], [-3.0, -1.0, -2.0], [-4.0, -4.0, -9.0]],
                        requires_grad=True)
    adv = torch.tensor([0.5, 0.0, -1.0, 2.0])  # P = {0, 1, 3}: tokens 2 + 1 + 2 = 5 of N = 8
    loss, m = nll_anchor_loss(logp, adv, MASK, coef=0.2)
    assert float(loss.detach()) == pytest.approx(0.2 * (1 + 2 + 0.5 + 4 + 4) / 8)
    (g,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]) * (-0.2 / 8)
    torch.testing.assert_close(g, expected)
    assert m["nll_anchor/anchored_token_frac"] == pytest.approx(5 / 8)
    assert m["nll_anchor/mean_nll"] == pytest.approx(11.5 / 5)
    anchor = nll_anchor_loss(logp, adv, MASK, coef=0.2, denominator=16)[0]
    assert float(anchor.detach()) == pytest.approx(0.2 * 11.5 / 16)


def test_kl_cov_by_hand():
    # two responses of 2 tokens
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -1.0])
    logp_new = torch.tensor([[-1.0, -3.0], [-1.0, -3.0]], requires_grad=True)
    logp_old = logp_new.detach() - torch.tensor([[0.1, -0.2], [0.3, 0.0]])  # x = logp_new - logp_old
    # cov = (A - 0) (logp - (-2)) = [[1, -1], [-1, 1]]: ties at 1 -> k = max(floor(0.5 * 4), 1) = 2 picks both
    loss, m = kl_cov_loss(logp_new, logp_old, adv, mask, ratio=0.5, coef=0.5)
    x = [[0.1, -0.2], [0.3, 0.0]]
    per_token = [-math.exp(x[0][0]) + 0.5 * 0.1, -math.exp(x[0][1]), math.exp(x[1][0]), math.exp(x[1][1]) + 0.0]
    assert float(loss.detach()) == pytest.approx(sum(per_token) / 4)
    assert m["cov_token_frac"] == 0.5 and m["pg_clip_frac"] == 0.0


def test_clip_cov_by_hand():
    # two responses of 2 tokens, ratio 1 (no PPO clipping); cov = A (logp - mean logp) = [[2, -2], [-2, 2]] with
    # A = [1, -1], logp = [[0, -4], [0, -4]]; candidates with 1 < cov < 5: (0,0) and (1,1); k = max(floor(0.5 * 4),
    # 1) = 2: both lose their gradient
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[0.0, -4.0], [0.0, -4.0]], requires_grad=True)
    loss, m = clip_cov_loss(logp, logp.detach(), adv, mask, ratio=0.5, lb=1.0, ub=5.0)
    assert float(loss.detach()) == pytest.approx((-1 + 1) / 4)  # the tokens left: (0,1) -A r = -1, (1,0) +1
    (g,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(g, torch.tensor([[0.0, -1.0], [1.0, 0.0]]) / 4)
    assert m["cov_token_frac"] == 0.5


@pytest.mark.parametrize("name", list(METHODS))
def test_each_preset_expands_into_its_settings_and_round_trips(tmp_path, name):
    cfg = load_config(None, [f"algorithm.method={name}"])
    alg = cfg.algorithm
    for dotted, value in METHODS[name].settings.items():
        node = alg
        for part in dotted.split("."):
            node = getattr(node, part)
        assert node == value, dotted
    assert set(SWITCHES) <= set(METHODS[name].settings)
    save_config(cfg, tmp_path / "config.yaml")  # the run's saved config shows the expansion and loads back
    text = (tmp_path / "config.yaml").read_text()
    assert f"method: {name}" in text and f"policy_loss: {alg.policy_loss}" in text
    assert load_config(tmp_path / "config.yaml") == cfg


def test_preset_examples_and_conflicts():
    dr = load_config(None, ["algorithm.method=dr_grpo"]).algorithm
    assert (dr.advantage, dr.loss_agg_mode, dr.llds.enabled) == ("grpo_no_std", "seq-mean-token-sum-norm", False)
    dapo = load_config(None, ["algorithm.method=dapo_clip_higher"]).algorithm
    assert (dapo.clip_low, dapo.clip_high, dapo.policy_loss) == (0.2, 0.28, "ppo_clip")
    # a setting the preset does not pin stays the config's; a pinned one with the same value is fine
    ma = load_config(None, ["algorithm.method=llds_ma", "algorithm.llds.lam=0.3", "algorithm.llds.ma=adaptive"])
    assert (ma.algorithm.llds.lam, ma.algorithm.llds.ma, ma.algorithm.llds.enabled) == (0.3, "adaptive", True)
    with pytest.raises(ConfigError, match=r"algorithm.llds.enabled: algorithm.method=grpo pins it to False"):
        load_config(None, ["algorithm.method=grpo", "algorithm.llds.enabled=true"])
    with pytest.raises(ConfigError, match=r"algorithm.clip_high: algorithm.method=gspo pins it to 0.0004"):
        load_config(None, ["algorithm.method=gspo", "algorithm.clip_high=0.28"])
    with pytest.raises(ConfigError, match="unknown method 'dapo'"):
        load_config(None, ["algorithm.method=dapo"])
    with pytest.raises(ConfigError, match="algorithm.advantage"):
        load_config(None, ["algorithm.advantage=gae"])


def test_help_config_shows_every_preset_expanded():
    text = format_help()
    for name, preset in METHODS.items():
        assert f"  {name}: " in text
    assert "algorithm.policy_loss='gspo', algorithm.clip_low=0.0003, algorithm.clip_high=0.0004" in text
