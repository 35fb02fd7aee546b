"""Every kind of the objective is a registry the config reads: the LLDS gates, LLDS-MA's answer-span modes and
adaptive rules, the loss scales and the KL estimators are registered like the losses, config validation names the
registered ones, ``--help-config`` lists them, and a kind registered by a user's module is accepted and listed."""

from __future__ import annotations

import importlib

import pytest

from searchr1_lld.algo import kl, llds, registry
from searchr1_lld.config import ConfigError, format_help, load_config

objective = importlib.import_module("searchr1_lld.algo.objective")  # the module (the package exports its function)

KINDS = {"llds.gate": ("span", ["none", "response", "action"]),
         "llds.ma": ("partial", ["off", "fixed", "adaptive"]),
         "llds.ma_adaptive_rule": ("linear", ["code", "paper"]),
         "loss_scale": ("sequence-mean", ["mini-batch-token-mean", "micro-batch-mean"]),
         "kl_type": ("k4", ["k1", "abs", "k2", "mse", "low_var_kl", "k3"])}


def test_the_retriever_mode_is_its_registry_too():
    with pytest.raises(ConfigError, match=r"^retriever.mode: must name a registered mode \['inprocess', 'http'\] "
                                          r"\(got 'grpc'\)$"):
        load_config(None, ["retriever.mode=grpc"])
    assert "  retriever.mode (inprocess|http, default 'inprocess')" in format_help()


@pytest.mark.parametrize("key", list(KINDS))
def test_an_unknown_kind_is_one_line_naming_the_registered_ones(key):
    bad, known = KINDS[key]
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"algorithm.{key}={bad}"])
    assert str(err.value) == f"algorithm.{key}: must name a registered one {known} (got {bad!r})"
    assert f"  algorithm.{key} ({'|'.join(known)}, default " in format_help()


def test_a_gate_registered_by_a_users_module_is_accepted_listed_and_run(monkeypatch):
    import torch

    monkeypatch.setattr(llds, "GATES", dict(llds.GATES))
    llds.register_gate("first_token")(lambda on, d, m, starts, tau: on & starts)
    cfg = load_config(None, ["algorithm.llds.gate=first_token"])
    assert cfg.algorithm.llds.gate == "first_token"
    assert "algorithm.llds.gate (none|response|action|first_token," in format_help()
    d = torch.tensor([[0.5, 0.5, 0.0]])
    g = llds.llds_gate(d, torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([1.0]), "first_token", 0.0)
    assert g.tolist() == [[True, False, False]]


def test_the_loss_scales_and_kl_estimators_are_the_tables_the_objective_runs():
    assert list(objective.LOSS_SCALES) == KINDS["loss_scale"][1]
    assert list(kl.KL_ESTIMATORS) == KINDS["kl_type"][1]
    with pytest.raises(ValueError, match=r"unknown loss scale 'sequence-mean'; registered: "):
        registry.lookup(objective.LOSS_SCALES, "loss scale", "sequence-mean")
