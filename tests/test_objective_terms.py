"""The terms of the objective by name (algo/terms.py): the built-in ones in the order they are summed, and a new
regulariser that reaches the loss and its gradient with one registered function and one config entry."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from searchr1_lld.algo import kl, terms
from searchr1_lld.algo.advantages import check_advantages
from searchr1_lld.algo.aggregation import aggregate
from searchr1_lld.algo.objective import objective
from searchr1_lld.config import AlgorithmConfig


def test_the_built_in_terms_are_registered_in_the_order_they_are_summed():
    assert list(terms.OBJECTIVE_TERMS)[:5] == ["policy_loss", "entropy", "kl", "llds", "nll_anchor"]
    with pytest.raises(ValueError, match="objective term 'kl' is already registered"):
        terms.register_term("kl")(lambda batch, spec: (None, {}))


@dataclass
class SquaredLogpConfig:
    coef: float = 0.0


@dataclass
class AlgorithmWithSquaredLogp(AlgorithmConfig):
    """The algorithm config plus the new term's entry ``algorithm.squared_logp`` (a real term adds it to
    AlgorithmConfig itself)."""

    squared_logp: SquaredLogpConfig = field(default_factory=SquaredLogpConfig)


def test_a_registered_regulariser_enters_the_loss_through_its_config_entry(monkeypatch):
    monkeypatch.setattr(terms, "OBJECTIVE_TERMS", dict(terms.OBJECTIVE_TERMS))

    @terms.register_term("squared_logp")
    def squared_logp(batch: terms.TermBatch, alg: terms.AlgorithmSettings):
        """L = coef * agg(logp_new^2, D)."""
        coef = alg.squared_logp.coef
        value = coef * aggregate(batch.logp_new.square(), batch.response_mask, alg.loss_agg_mode,
                                 denominator=batch.denominator)
        return value, {"squared_logp": float(value.detach())}

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.8], [-0.5, -0.4]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])

    def loss_and_grad(coef: float):
        spec = AlgorithmWithSquaredLogp(squared_logp=SquaredLogpConfig(coef=coef))
        loss, m = objective(spec, logp, old, adv, mask, mini_tokens=4.0, mini_responses=2.0)
        return float(loss.detach()), torch.autograd.grad(loss, logp)[0], m

    base, base_grad, base_m = loss_and_grad(0.0)
    value, grad, m = loss_and_grad(0.5)
    # by hand, D = N_tok = 4: 0.5 * (1 + 4 + 0.25) / 4, gradient 0.5 * 2 logp m / 4
    assert value - base == pytest.approx(0.5 * 5.25 / 4)
    assert m["squared_logp"] == pytest.approx(0.5 * 5.25 / 4) and base_m["squared_logp"] == 0.0
    torch.testing.assert_close(grad - base_grad, 0.5 * 2 * logp.detach() * mask / 4)
    assert {k: v for k, v in m.items() if k != "squared_logp"} == pytest.approx(
        {k: v for k, v in base_m.items() if k != "squared_logp"})


def test_a_registered_kl_estimator_is_a_kl_type():
    assert kl.KL_KINDS == ("k1", "abs", "k2", "mse", "low_var_kl", "k3")
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    try:
        kl.register_kl_estimator("k4")(lambda x: x**4)
        assert kl.kl_penalty(logp, ref, "k4").flatten().tolist() == pytest.approx([0.0625, 1.0])
    finally:
        kl.KL_ESTIMATORS.pop("k4")
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; registered: \['abs', 'k1'"):
        kl.kl_penalty(logp, ref, "k4")


def test_the_advantage_shape_check():
    mask = torch.ones(2, 3)
    check_advantages(torch.zeros(2), mask)
    check_advantages(torch.zeros(2, 3), mask)
    with pytest.raises(ValueError, match=r"advantages \[B\] has B=3 but response_mask has B=2"):
        check_advantages(torch.zeros(3), mask)
    with pytest.raises(ValueError, match=r"must be \[B\] or \[B, T\] like response_mask \(2, 3\); got \(2, 4\)"):
        check_advantages(torch.zeros(2, 4), mask)
