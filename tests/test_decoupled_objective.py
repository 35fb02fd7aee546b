"""The decoupled objective of trainer.staleness >= 1 on small tensors, against a hand computation: the engine's
behaviour log-probs, the learner's proximal log-probs (its recompute before the update: logp_old), the clip around
the proximal policy, the rollout correction's weight pi_prox / pi_behav, LLDS's d against the proximal policy."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.algo.objective import objective
from searchr1_lld.config import load_config
from searchr1_lld.learner.step import correction_weights
from searchr1_lld.rollout.types import Trajectory, to_batch

L = math.log


def test_the_decoupled_loss_matches_a_hand_computation():
    cfg = load_config(None, [
        "trainer.staleness=1", "trainer.placement.kind=split", "algorithm.rollout_correction.preset=decoupled_token_is",
        "algorithm.llds.gate=none", "algorithm.llds.lam=0.5", "algorithm.kl_coef=0", "algorithm.entropy_coef=0",
        "algorithm.clip_eps=0.2"]).validate()
    behaviour = [[L(.5), L(.25)], [L(.4), L(.5)]]  # the engine's, an older version's
    proximal = torch.tensor([[L(.6), L(.2)], [L(.4), L(.25)]])  # the learner's recompute before its update
    new = torch.tensor([[L(.5), L(.3)], [L(.5), L(.25)]], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])
    trajs = [Trajectory(row={"id": str(i)}, group_id=0, prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
                        answer_mask=[0, 0], engine_logprobs=b, policy_version=0) for i, b in enumerate(behaviour)]
    batch = to_batch(trajs, pad_token_id=0)

    weights, train_batch, stats = correction_weights(cfg.algorithm.rollout_correction, batch, proximal)
    # w = min(pi_prox / pi_behav, 2): 0.6/0.5, 0.2/0.25, 0.4/0.4, 0.25/0.5
    assert torch.allclose(weights, torch.tensor([[1.2, 0.8], [1.0, 0.5]]))
    assert torch.equal(train_batch.response_mask, batch.response_mask)  # no rejection rule
    loss, metrics = objective(cfg.algorithm, new, proximal, advantages, train_batch.response_mask, mini_tokens=4.0,
                              mini_responses=2.0, token_weights=weights)
    # r = pi_new / pi_prox: 0.5/0.6, 0.3/0.2 | 0.5/0.4, 0.25/0.25; per token max(-A r, -A clip(r, 0.8, 1.2)):
    #   A = +1: -0.8333.., -1.2 (clipped) | A = -1: 1.25 (unclipped: the larger), 1.0
    # weighted: 1.2 x -0.8333.. = -1.0, 0.8 x -1.2 = -0.96, 1.0 x 1.25, 0.5 x 1.0; token mean over 4 tokens
    pg = (-1.0 - 0.96 + 1.25 + 0.5) / 4
    # LLDS: d = logp_prox - logp_new on the response with A >= 0: log(0.6/0.5) > 0, log(0.2/0.3) < 0 -> penalty
    # max(0, d) = log 1.2 on its first token only; lam x sum / 4 tokens
    llds = 0.5 * L(1.2) / 4
    assert metrics["pg_loss"] == pytest.approx(pg, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(pg + llds, abs=1e-6)
    # against the behaviour policy instead, the same numbers give another loss: the clip and d are the proximal's
    behind, _ = objective(cfg.algorithm, new, torch.tensor(behaviour), advantages, train_batch.response_mask,
                          mini_tokens=4.0, mini_responses=2.0, token_weights=None)
    assert float(behind.detach()) != pytest.approx(pg + llds, abs=1e-3)
    assert stats["rollout/tis_weight_max"] == pytest.approx(1.2)
