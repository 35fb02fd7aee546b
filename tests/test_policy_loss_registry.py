"""Policy losses by name: the registry in algo/policy_loss.py is the only place the objective looks a loss up."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.algo import policy_loss
from searchr1_lld.algo.objective import ObjectiveSpec, objective
from searchr1_lld.config import ConfigError, load_config


def test_builtin_losses_are_registered_by_name():
    assert policy_loss.get_policy_loss_fn("ppo_clip") is policy_loss.ppo_clip_loss
    assert policy_loss.get_policy_loss_fn("gspo") is policy_loss.gspo_loss
    with pytest.raises(ValueError, match=r"unknown policy loss 'nope'; registered: \['gspo', 'ppo_clip'"):
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
    loss, m = objective(ObjectiveSpec(policy_loss="minus_logp"), logp, logp.detach(), adv, mask,
                        mini_tokens=3.0, mini_responses=2.0)
    # by hand: -(1 * (-1 - 2) + (-2) * (-0.5)) / 3 = -(-3 + 1) / 3 = 2/3
    assert loss.item() == pytest.approx(2 / 3) and m["pg_loss"] == pytest.approx(2 / 3)
    assert calls == [["agg_mode", "clip_high", "clip_low", "dual_clip"]]
    assert load_config(None, ["algorithm.policy_loss=minus_logp"]).algorithm.policy_loss == "minus_logp"
    with pytest.raises(ConfigError, match="algorithm.policy_loss"):
        load_config(None, ["algorithm.policy_loss=not_registered"])
