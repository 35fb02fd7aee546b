"""Policy losses by name: the registry in algo/policy_loss.py is the only place the objective looks a loss up."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.algo import policy_loss
from algorithm_settings import algorithm
from searchr1_lld.algo.objective import objective
from searchr1_lld.config import ConfigError, load_config


def test_builtin_losses_are_registered_by_name():
    assert policy_loss.get_policy_loss_fn("ppo_clip") is policy_loss.ppo_clip_loss
    assert policy_loss.get_policy_loss_fn("gspo") is policy_loss.gspo_loss
    with pytest.raises(ValueError, match=r"unknown policy loss 'nope'; registered: \['cispo', 'clip_cov', 'dppo_kl', 'dppo_tv', "
                                         r"'geo_mean', 'gpg', 'gspo', 'kl_cov', 'ppo_clip', 'reinforce', 'sapo', 'vespo'\]"):
        policy_loss.get_policy_loss_fn("nope")
    with pytest.raises(ValueError, match="already registered"):
        policy_loss.register_policy_loss("ppo_clip")(lambda *a, **k: None)


def test_a_new_loss_reaches_the_objective_and_the_config_without_other_edits(monkeypatch):
    """Registering a loss is all it takes: the objective calls it and the config accepts its name."""
    monkeypatch.setattr(policy_loss, "POLICY_LOSSES", dict(policy_loss.POLICY_LOSSES))
    calls = []

    @policy_loss.register_policy_loss("minus_logp")
    def minus_logp(logp_new, logp_old, advantages, response_mask, **kw):  # -A * logp (REINFORCE), token-mean
        calls.append(sorted(kw))
        loss = -(advantages[:, None] * logp_new * response_mask).sum() / response_mask.sum()
        return loss, {"pg_loss": float(loss.detach()), "pg_clip_frac": 0.0, "approx_kl": 0.0}

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = objective(algorithm(policy_loss="minus_logp"), logp, logp.detach(), adv, mask,
                        mini_tokens=3.0, mini_responses=2.0)
    # by hand: -(1 * (-1 - 2) + (-2) * (-0.5)) / 3 = -(-3 + 1) / 3 = 2/3
    assert loss.item() == pytest.approx(2 / 3) and m["pg_loss"] == pytest.approx(2 / 3)
    assert calls == [["agg_mode", "clip_high", "clip_low", "dual_clip"]]
    assert load_config(None, ["algorithm.policy_loss=minus_logp"]).algorithm.policy_loss == "minus_logp"
    with pytest.raises(ConfigError, match="algorithm.policy_loss"):
        load_config(None, ["algorithm.policy_loss=not_registered"])


def test_the_objective_runs_the_loss_registered_under_the_configured_name(monkeypatch):
    """The default config's policy loss is looked up in the registry on every call: whatever is registered under
    that name is the loss (and gradient) the objective returns, the default PPO-clip included."""
    spec = load_config(None, []).algorithm
    assert spec.policy_loss == "ppo_clip"
    real = policy_loss.get_policy_loss_fn(spec.policy_loss)
    calls = []

    def tripled(logp_new, logp_old, advantages, response_mask, **kw):
        calls.append(logp_new.requires_grad)
        loss, metrics = real(logp_new, logp_old, advantages, response_mask, **kw)
        return 3 * loss, {**metrics, "pg_loss": 3 * metrics["pg_loss"]}

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.8], [-0.5, -0.4]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    plain = algorithm(policy_loss=spec.policy_loss, clip_low=spec.clip_low, clip_high=spec.clip_high)

    def loss_and_grad():
        loss, m = objective(plain, logp, old, adv, mask, mini_tokens=3.0, mini_responses=2.0)
        return float(loss.detach()), torch.autograd.grad(loss, logp)[0], m

    base, base_grad, base_m = loss_and_grad()
    monkeypatch.setitem(policy_loss.POLICY_LOSSES, spec.policy_loss, tripled)
    value, grad, m = loss_and_grad()
    assert calls == [True]
    assert value == pytest.approx(3 * base) and m["pg_loss"] == pytest.approx(3 * base_m["pg_loss"])
    torch.testing.assert_close(grad, 3 * base_grad)
    assert float(base_grad.abs().sum()) > 0
