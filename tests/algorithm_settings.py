"""The algorithm settings an objective test passes: ``AlgorithmConfig`` with the terms off unless a test names them."""

from __future__ import annotations

import dataclasses

from searchr1_lld.config import AlgorithmConfig, LLDSConfig


def algorithm(*, llds_lam: float = 0.0, llds_gate: str = "action", llds_tau: float = 0.0,
              lam_answer: float | None = None, kl_coef: float = 0.0, **fields) -> AlgorithmConfig:
    """AlgorithmConfig with no KL unless ``kl_coef`` and LLDS on only when ``llds_lam`` > 0 (the config's defaults
    turn both on); ``lam_answer``: LLDS-MA fixed at that coefficient; ``fields``: any other AlgorithmConfig field."""
    return AlgorithmConfig(kl_coef=kl_coef, **fields, llds=LLDSConfig(
        enabled=llds_lam > 0, lam=llds_lam, gate=llds_gate, tau=llds_tau,
        ma="off" if lam_answer is None else "fixed", lam_answer=0.2 if lam_answer is None else lam_answer))


def with_lam_answer(alg: AlgorithmConfig, lam_answer: float | None) -> AlgorithmConfig:
    """``alg`` with LLDS-MA fixed at ``lam_answer`` (None: MA off)."""
    ma = {"ma": "off"} if lam_answer is None else {"ma": "fixed", "lam_answer": lam_answer}
    return dataclasses.replace(alg, llds=dataclasses.replace(alg.llds, **ma))
