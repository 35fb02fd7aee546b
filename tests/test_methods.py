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
from searchr1_lld.algo.logprob_losses import cispo_loss, dppo_kl_loss, dppo_tv_loss, gpg_loss
from searchr1_lld.algo.ratio_losses import geo_mean_loss, sapo_loss
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


# seven responses: groups 5 (three), 9 (two), 7 (two tied), with 2, 1, 3, 2, 1, 2, 2 tokens
SCORES7 = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 1.0])
GROUPS7 = torch.tensor([5, 5, 5, 9, 9, 7, 7])
MASK7 = (torch.arange(3)[None, :] < torch.tensor([2, 1, 3, 2, 1, 2, 2])[:, None]).float()


def test_grpo_passk_by_hand():
    # group 5: best 1 (first response), second 0.5, unbiased std of [1, 0, 0.5] = 0.5; group 9: 1 - 0 over
    # std sqrt(1/2); group 7: a tie at the top gives 0
    adv = advantages.get_advantage_fn("grpo_passk")(SCORES7, GROUPS7, MASK7, eps=1e-6)
    assert adv.tolist() == pytest.approx([0.5 / (0.5 + 1e-6), 0, 0, 1 / (math.sqrt(0.5) + 1e-6), 0, 0, 0])


def test_opo_by_hand():
    # baselines: group 5 (2 * 1 + 1 * 0 + 3 * 0.5) / 6 = 7/12; group 9 (2 * 1 + 1 * 0) / 3 = 2/3; group 7: 1
    adv = advantages.get_advantage_fn("opo")(SCORES7, GROUPS7, MASK7)
    assert adv.tolist() == pytest.approx([5 / 12, -7 / 12, -1 / 12, 1 / 3, -2 / 3, 0, 0])


def test_gpg_advantage_by_hand():
    # alpha = 7 responses / 5 with a non-zero score = 1.4; group means 0.5, 0.5, 1
    adv = advantages.get_advantage_fn("gpg")(SCORES7, GROUPS7, MASK7)
    assert adv.tolist() == pytest.approx([0.7, -0.7, 0.0, 0.7, -0.7, 0.0, 0.0])


def _loss_and_grad(fn, logp_new, *args, **kw):
    x = logp_new.clone().requires_grad_(True)
    loss, metrics = fn(x, *args, **kw)
    return float(loss.detach()), torch.autograd.grad(loss, x)[0], metrics


# two responses of 2 and 3 tokens; A = [1, -2]; x = logp_new - logp_old = [[0.5, -0.5], [0.1, -0.2, 0]]
MASK2 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV2 = torch.tensor([1.0, -2.0])
NEW2 = torch.tensor([[-0.5, -2.5, -9.0], [-0.4, -1.2, -3.0]])
OLD2 = NEW2 - torch.tensor([[0.5, -0.5, 0.0], [0.1, -0.2, 0.0]])


def test_gpg_loss_by_hand():
    # -A logp_new, token-mean over 5 tokens: (0.5 + 2.5 - 0.8 - 2.4 - 6) / 5
    value, grad, m = _loss_and_grad(gpg_loss, NEW2, OLD2, ADV2, MASK2)
    assert value == pytest.approx((0.5 + 2.5 - 0.8 - 2.4 - 6.0) / 5)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.0, 0.0], [2.0, 2.0, 2.0]]) / 5)
    assert m["pg_clip_frac"] == 0.0


def test_cispo_by_hand():
    # weights sg(clip(r, 0.8, 1.2)): r = e^0.5 -> 1.2, e^-0.5 -> 0.8, e^0.1 kept, e^-0.2 kept, 1 kept
    w = [[1.2, 0.8], [math.exp(0.1), math.exp(-0.2), 1.0]]
    value, grad, m = _loss_and_grad(cispo_loss, NEW2, OLD2, ADV2, MASK2, clip_low=0.2, clip_high=0.2)
    expected = (-w[0][0] * -0.5 - w[0][1] * -2.5 + 2 * (w[1][0] * -0.4 + w[1][1] * -1.2 + w[1][2] * -3.0)) / 5
    assert value == pytest.approx(expected)
    torch.testing.assert_close(grad, torch.tensor([[-w[0][0], -w[0][1], 0.0], [2 * w[1][0], 2 * w[1][1], 2.0]]) / 5)
    assert m["pg_clip_frac"] == pytest.approx(2 / 5)
    # clip_low >= 1: no lower bound, only e^0.5 is clipped
    _, grad, m = _loss_and_grad(cispo_loss, NEW2, OLD2, ADV2, MASK2, clip_low=10.0, clip_high=0.2)
    assert float(grad[0, 1]) == pytest.approx(-math.exp(-0.5) / 5) and m["pg_clip_frac"] == pytest.approx(1 / 5)


# DPPO: probabilities q (old) -> p (new); A = [1, -2]
Q3 = torch.tensor([[0.5, 0.01, 0.5], [0.6, 0.6, 0.3]])
P3 = torch.tensor([[0.7, 0.1, 0.5], [0.4, 0.5, 0.3]])


def test_dppo_tv_by_hand():
    # delta 0.15: (0,0) moved +0.2 with A > 0 and (1,0) moved -0.2 with A < 0 leave the trust region; (0,1) +0.09,
    # (1,1) -0.1, (1,2) 0 stay. Weights min(r, 1.1): r(0,1) = 10 -> 1.1, r(1,1) = 5/6, r(1,2) = 1
    value, grad, m = _loss_and_grad(dppo_tv_loss, P3.log(), Q3.log(), ADV2, MASK2, clip_low=0.15, clip_high=0.15,
                                    clip_ratio_c=1.1)
    expected = (-1.1 * math.log(0.1) + 2 * (5 / 6) * math.log(0.5) + 2 * math.log(0.3)) / 5
    assert value == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.1, 0.0], [0.0, 2 * 5 / 6, 2.0]]) / 5)
    assert m["pg_clip_frac"] == pytest.approx(2 / 5)


def test_dppo_kl_by_hand():
    # binary KL q log(q/p) + (1-q) log((1-q)/(1-p)) against 0.05: (0,0) 0.087 and (1,0) 0.081 leave the trust region,
    # and so does (0,1): 0.01 log(0.1) + 0.99 log(0.99/0.9) = 0.071 (which TV at 0.15 keeps); (1,1) 0.020 stays,
    # and (1,2) 0
    kl = [q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p)) for q, p in ((0.5, 0.7), (0.01, 0.1),
                                                                                    (0.6, 0.4), (0.6, 0.5))]
    assert [round(k, 3) for k in kl] == [0.087, 0.071, 0.081, 0.020]
    value, grad, m = _loss_and_grad(dppo_kl_loss, P3.log(), Q3.log(), ADV2, MASK2, clip_low=0.05, clip_high=0.05,
                                    clip_ratio_c=1.1)
    assert value == pytest.approx((2 * (5 / 6) * math.log(0.5) + 2 * math.log(0.3)) / 5, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0], [0.0, 2 * 5 / 6, 2.0]]) / 5)
    assert m["pg_clip_frac"] == pytest.approx(3 / 5)


def test_sapo_by_hand():
    # f(r) = sigmoid(tau (r - 1)) 4 / tau, tau 1 (A > 0) or 1.05; l = -f(r) A; seq-mean-token-mean over 2 responses
    def f(r, tau):
        return 4 / tau / (1 + math.exp(-tau * (r - 1)))

    r = [[math.exp(0.5), math.exp(-0.5)], [math.exp(0.1), math.exp(-0.2), 1.0]]
    value, grad, m = _loss_and_grad(sapo_loss, NEW2, OLD2, ADV2, MASK2, agg_mode="seq-mean-token-mean")
    row0 = -(f(r[0][0], 1.0) + f(r[0][1], 1.0)) / 2
    row1 = 2 * (f(r[1][0], 1.05) + f(r[1][1], 1.05) + f(r[1][2], 1.05)) / 3
    assert value == pytest.approx((row0 + row1) / 2)
    # at r = 1 the gate's slope is 1: the gradient of the unclipped surrogate, -A / (n_i |S|) = 2 / (3 * 2)
    assert float(grad[1, 2]) == pytest.approx(2 / 6)
    # d l / d logp = -A f'(r) r with f'(r) = 4 sigmoid(u) (1 - sigmoid(u)), u = tau (r - 1)
    s = 1 / (1 + math.exp(-(r[0][0] - 1)))
    assert float(grad[0, 0]) == pytest.approx(-4 * s * (1 - s) * r[0][0] / 4)
    assert m["pg_clip_frac"] == 0.0


def test_geo_mean_by_hand():
    # clip 0.4 in log space on the harmful side: row 0 (A > 0) x = [0.5, -0.5] -> [0.4, -0.5], mean -0.05;
    # row 1 (A < 0) x = [0.1, -0.2, 0] (no token below -0.4): mean -0.1/3. L_i = -A_i exp(mean); mean over rows
    value, grad, m = _loss_and_grad(geo_mean_loss, NEW2, OLD2, ADV2, MASK2, clip_low=0.4, clip_high=0.4)
    r0, r1 = math.exp(-0.05), math.exp(-0.1 / 3)
    assert value == pytest.approx((-r0 + 2 * r1) / 2)
    # d/dx of exp(mean): R_i / n_i on unclipped tokens, 0 on the clipped one; times -A_i / 2
    torch.testing.assert_close(grad, torch.tensor([[0.0, -r0 / 2, 0.0], [2 * r1 / 3, 2 * r1 / 3, 2 * r1 / 3]]) / 2)
    assert m["pg_clip_frac"] == pytest.approx(1 / 5)
    # row 1 pushed below -0.4 is held there: x = -0.6 counts as -0.4
    far = OLD2 + torch.tensor([[0.5, -0.5, 0.0], [-0.6, -0.2, 0.0]])
    value, _, _ = _loss_and_grad(geo_mean_loss, far, OLD2, ADV2, MASK2, clip_low=0.4, clip_high=0.4)
    assert value == pytest.approx((-r0 + 2 * math.exp(-0.6 / 3)) / 2)


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
    with pytest.raises(ConfigError, match="unknown method 'vapo'"):
        load_config(None, ["algorithm.method=vapo"])
    with pytest.raises(ConfigError, match="algorithm.advantage"):
        load_config(None, ["algorithm.advantage=gae"])


def test_help_config_shows_every_preset_expanded():
    text = format_help()
    for name, preset in METHODS.items():
        assert f"  {name}: " in text
    assert "algorithm.policy_loss='gspo', algorithm.clip_low=0.0003, algorithm.clip_high=0.0004" in text


# the presets of CISPO, SAPO, GMPO, GPG, DPPO, the Pass@k / OPO advantages, DAPO, REMAX and NTHR; TRL's bnpo, luspo
# and vespo
NEW_PRESETS = ("cispo", "sapo", "gmpo", "gpg", "dppo_tv", "dppo_kl", "grpo_passk", "opo", "dapo", "remax", "nthr",
               "bnpo", "luspo", "vespo")
# what a preset logs of its own every step
PRESET_METRICS = {"dapo": ("rollout/dynamic_sampling_rounds", "rollout/kept_group_frac", "reward/overlong_penalty_mean"),
                  "remax": ("time/baseline_rollout_s", "rollout/baseline_generated_tokens"),
                  "nthr": ("nthr/selected_token_frac", "nthr/incorrect_weight_mean"),
                  "llds_ma": ("llds/active_token_frac", "llds/lam_answer_effective"),
                  "nll_anchor": ("nll_anchor/loss", "nll_anchor/anchored_token_frac"),
                  "clip_cov": ("actor/cov_token_frac",), "vespo": ("actor/vespo_phi_mean",)}


@pytest.fixture(scope="module")
def world_retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


@pytest.mark.parametrize("name", list(METHODS))
def test_each_preset_trains_two_steps(tmp_path, tiny_world, world_retriever, monkeypatch, name):
    """Two training steps on the test world (about 5 s each) run every preset's registered policy loss and advantage
    estimator, and log finite actor metrics and the preset's own."""
    from conftest import on_world
    from searchr1_lld.algo import policy_loss
    from searchr1_lld.learner.trainer import Trainer
    from test_trainer import SMALL

    cfg = on_world(load_config(None, [*SMALL, f"algorithm.method={name}", "trainer.total_steps=2",
                                      f"trainer.output_dir={tmp_path}", "trainer.save_every=0"]), tiny_world)
    calls = []
    for table, key in ((policy_loss.POLICY_LOSSES, cfg.algorithm.policy_loss),
                       (advantages.ADVANTAGE_ESTIMATORS, cfg.algorithm.advantage)):
        def counted(*args, _fn=table[key], _key=key, **kw):
            calls.append(_key)
            return _fn(*args, **kw)
        monkeypatch.setitem(table, key, counted)
    result = Trainer(cfg, retriever=world_retriever).run(evaluate=False)
    assert result.steps == 2
    assert {cfg.algorithm.policy_loss, cfg.algorithm.advantage} <= set(calls)
    keys = ("actor/pg_loss", "actor/pg_clip_frac", "actor/approx_kl", "actor/grad_norm", "actor/entropy")
    logged = [h[k] for h in result.history for k in keys]
    assert len(logged) == 2 * len(keys) and all(math.isfinite(v) for v in logged), result.history
    own = [h[k] for h in result.history for k in PRESET_METRICS.get(name, ())]
    assert len(own) == 2 * len(PRESET_METRICS.get(name, ())) and all(math.isfinite(v) for v in own)


def test_help_config_and_errors_name_the_new_methods():
    text = format_help()
    for name in (*NEW_PRESETS, "geo_mean", "algorithm.sapo.tau_neg", "algorithm.dppo_tv.clip_ratio_c"):
        assert name in text, name
    for override, key in (("algorithm.method=cispoo", "algorithm.method"),
                          ("algorithm.policy_loss=cispoo", "algorithm.policy_loss"),
                          ("algorithm.advantage=passk", "algorithm.advantage")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        message = str(e.value)
        assert message.startswith(key) and "\n" not in message, message
        known = NEW_PRESETS if key == "algorithm.method" else (
            ("cispo", "sapo", "geo_mean", "gpg", "dppo_tv", "dppo_kl") if key == "algorithm.policy_loss"
            else ("grpo_passk", "opo", "gpg"))
        assert all(repr(n) in message for n in known), message
    with pytest.raises(ConfigError, match=r"algorithm.sapo.tau_neg: must be > 0"):
        load_config(None, ["algorithm.sapo.tau_neg=0"])
    with pytest.raises(ConfigError, match=r"algorithm.dppo_kl.clip_ratio_c: must be > 0"):
        load_config(None, ["algorithm.dppo_kl.clip_ratio_c=-1"])
    with pytest.raises(ConfigError, match=r"algorithm.clip_low: algorithm.method=cispo pins it to 10.0"):
        load_config(None, ["algorithm.method=cispo", "algorithm.clip_low=0.2"])


# ------------------------------------------------------------------ DAPO (dynamic sampling, overlong) and REMAX


def test_dapo_batch_filter_by_hand():
    from searchr1_lld.algo.batch_filters import get_batch_filter

    keep = get_batch_filter("nonzero_std")
    # groups 3 (both right: dropped), 8 (one right: kept), 2 (both wrong: dropped), 5 (graded, equal: dropped),
    # 6 (graded, unequal: kept), 9 (alone: kept, as verl keeps it)
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.25, 0.5])
    groups = torch.tensor([3, 3, 8, 8, 2, 2, 5, 5, 6, 6, 9])
    assert keep(rewards, groups).tolist() == [False, False, True, True, False, False, False, False, True, True, True]
    with pytest.raises(ValueError, match="unknown batch filter 'std'"):
        get_batch_filter("std")
    with pytest.raises(ValueError, match=r"must both be \[B\]"):
        keep(rewards, groups[:3])


def test_soft_overlong_punishment_by_hand():
    from searchr1_lld.algo.reward_shaping import get_reward_shaping

    overlong = get_reward_shaping("overlong")
    # generated tokens 3, 6, 7, 10, 12 (row 2 also holds 5 observation tokens, mask 0, which do not count);
    # L_max 10, L_cache 4: free up to 6, then -1/4 per token, -1 beyond 10; penalty factor 0.5
    mask = torch.zeros(5, 17)
    for i, n in enumerate((3, 6, 7, 10, 12)):
        mask[i, :n] = 1
    mask[2] = torch.tensor([1.0] * 4 + [0.0] * 5 + [1.0] * 3 + [0.0] * 5)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    shaped, m = overlong(rewards, mask, max_length=10, cache_length=4, penalty_factor=0.5)
    assert shaped.tolist() == pytest.approx([1.0, 0.0, 1 - 0.125, 1 - 0.5, -0.5])
    assert m["reward/overlong_frac"] == pytest.approx(3 / 5)
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-(0.125 + 0.5 + 0.5) / 5)
    assert get_reward_shaping("none")(rewards, mask)[0] is rewards
    for bad in ({"cache_length": 0}, {"cache_length": 11}, {"penalty_factor": -1.0}):
        with pytest.raises(ValueError, match="cache_length|penalty_factor"):
            overlong(rewards, mask, **{"max_length": 10, "cache_length": 4, **bad})


def test_remax_by_hand():
    remax = advantages.get_advantage_fn("remax")
    scores, groups = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])
    adv = remax(scores, groups, MASK, baselines=torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert adv.tolist() == [0.0, -1.0, 1.0, 0.0]
    assert advantages.needs_baselines("remax") and not advantages.needs_baselines("grpo")
    with pytest.raises(ValueError, match="'remax' needs baselines"):
        remax(scores, groups, MASK)
    with pytest.raises(ValueError, match=r"scores and baselines must both be \[B\]"):
        remax(scores, groups, MASK, baselines=torch.zeros(3))


def test_dapo_and_remax_presets_and_their_errors():
    dapo = load_config(None, ["algorithm.method=dapo"])
    alg = dapo.algorithm
    assert (alg.clip_low, alg.clip_high, alg.policy_loss, alg.loss_agg_mode) == (0.2, 0.28, "ppo_clip", "token-mean")
    assert (alg.dynamic_sampling.enabled, alg.dynamic_sampling.filter, alg.reward_shaping) == (
        True, "nonzero_std", "overlong")
    # L_max defaults to the generated-token budget (max_turns + 1) x max_tokens_per_turn, L_cache to a fifth of it
    assert alg.overlong.lengths(dapo.rollout) == ((4 + 1) * 500, 500)
    assert load_config(None, ["algorithm.method=remax"]).algorithm.advantage == "remax"
    for overrides, match in (
            (["algorithm.method=dapo", "algorithm.dynamic_sampling.enabled=false"],
             r"algorithm.dynamic_sampling.enabled: algorithm.method=dapo pins it to True"),
            (["algorithm.method=grpo", "algorithm.reward_shaping=overlong"],
             r"algorithm.reward_shaping: algorithm.method=grpo pins it to 'none'"),
            (["algorithm.dynamic_sampling.max_rounds=0"], r"algorithm.dynamic_sampling.max_rounds: must be >= 1"),
            (["algorithm.overlong.max_length=100", "algorithm.overlong.cache_length=101"],
             r"algorithm.overlong.cache_length: must be <= L_max \(100\)"),
            (["algorithm.overlong.penalty_factor=-1"], r"algorithm.overlong.penalty_factor: must be >= 0"),
            (["algorithm.reward_shaping=length"], r"algorithm.reward_shaping: must name a registered one"),
            (["algorithm.dynamic_sampling.filter=std"], r"algorithm.dynamic_sampling.filter: must name a registered")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, overrides)
