"""algorithm.loss_scale: the authors' micro-batch-mean and the mini-batch token mean, on hand-built uneven micro-batches
(value and gradient by hand), and micro-batch-mean == the mean of each micro-batch run as its own mini-batch."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.learner import batching
from searchr1_lld.algo import aggregation
from algorithm_settings import algorithm
from searchr1_lld.algo.objective import loss_denominators, mini_batch_denominators, objective
from searchr1_lld.config import ConfigError, load_config
from test_algo_objective import _batch as objective_batch

# micro-batch A = response 0 (3 tokens), micro-batch B = responses 1 and 2 (1 token each): 5 tokens, K = 2
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -1.0, 2.0])
LOGP_OLD = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5]])
LOGP_NEW = torch.tensor([[-1.0, -1.0, -1.5], [-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5]])
MICRO = ([0], [1, 2])


def _accumulate(scale: str) -> tuple[float, torch.Tensor]:
    """Sum over the micro-batches of the objective's value and its gradient w.r.t. logp_new [3, 3]."""
    spec = algorithm(llds_lam=1.0, llds_gate="none", loss_scale=scale)
    n_tok, n_resp = mini_batch_denominators(MASK)
    theta = LOGP_NEW.clone().requires_grad_(True)
    total = 0.0
    for rows in MICRO:
        idx = torch.as_tensor(rows)
        loss, _ = objective(spec, theta[idx], LOGP_OLD[idx], ADV[idx], MASK[idx], mini_tokens=n_tok,
                            mini_responses=n_resp, micro_batches=len(MICRO))
        loss.backward()
        total += float(loss.detach())
    return total, theta.grad


def test_hand_computed_value_and_gradient_of_both_scales():
    # per-token terms: PPO-clip (eps 0.2), ratio r = exp(new - old); LLDS (gate none, lam 1) on responses with A >= 0
    r = math.exp(-0.5)  # response 0, token 2: r = 0.61 < 0.8, A > 0 -> the unclipped branch -A r is the minimum
    sum_a = -1.0 - 1.0 - r + 0.5  # micro-batch A: pg -1, -1, -r and the LLDS penalty max(0, -1 - (-1.5)) = 0.5
    sum_b = 1.0 - 2.0  # micro-batch B: -A on one token each; response 2 has d = 0
    # d/dlogp_new per token: pg -A r, LLDS -1 where the penalty is active
    g_num = torch.tensor([[-1.0, -1.0, -r - 1.0], [1.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])

    value, grad = _accumulate("micro-batch-mean")  # the authors': (mean_A + mean_B) / 2
    assert value == pytest.approx((sum_a / 3 + sum_b / 2) / 2, rel=1e-6)
    expected = g_num.clone()
    expected[0] /= 3 * 2
    expected[1:] /= 2 * 2
    torch.testing.assert_close(grad, expected)

    value, grad = _accumulate("mini-batch-token-mean")  # this project's: (sum_A + sum_B) / 5
    assert value == pytest.approx((sum_a + sum_b) / 5, rel=1e-6)
    torch.testing.assert_close(grad, g_num / 5)


def _batch():
    """test_algo_objective's batch (uneven lengths, an empty response, a hole), without its answer mask."""
    return objective_batch()[:5]


def _loss(spec, theta, rows, logp_old, logp_ref, adv, mask, n_tok, n_resp, k):
    idx = torch.as_tensor(rows)
    logp_new = torch.nn.functional.logsigmoid(theta[idx])
    entropy = -logp_new.exp() * logp_new
    loss, _ = objective(spec, logp_new, logp_old[idx], adv[idx], mask[idx], mini_tokens=n_tok, mini_responses=n_resp,
                        logp_ref=logp_ref[idx], entropy=entropy, micro_batches=k)
    return loss


@pytest.mark.parametrize("agg_mode", list(aggregation.AGG_MODES))
def test_micro_batch_mean_is_the_mean_of_each_micro_batch_as_its_own_mini_batch(agg_mode):
    theta, logp_old, logp_ref, adv, mask = _batch()
    kw = dict(loss_agg_mode=agg_mode, kl_coef=0.3, entropy_coef=0.05, llds_lam=0.5, llds_gate="action")
    micro = ([4, 1], [0, 3, 6], [2, 5])
    n_tok, n_resp = mini_batch_denominators(mask)
    authors = algorithm(**kw, loss_scale="micro-batch-mean")
    acc = sum(torch.autograd.grad(_loss(authors, theta, rows, logp_old, logp_ref, adv, mask, n_tok, n_resp,
                                        len(micro)), theta)[0] for rows in micro)
    own = algorithm(**kw, loss_scale="mini-batch-token-mean")
    ref = torch.zeros_like(theta)
    for rows in micro:  # each micro-batch alone is a mini-batch: its own token mean, then / K
        sub_tok, sub_resp = mini_batch_denominators(mask[torch.as_tensor(rows)])
        ref += torch.autograd.grad(_loss(own, theta, rows, logp_old, logp_ref, adv, mask, sub_tok, sub_resp, 1),
                                   theta)[0] / len(micro)
    torch.testing.assert_close(acc, ref, rtol=1e-5, atol=1e-7)
    whole = torch.autograd.grad(_loss(own, theta, list(range(7)), logp_old, logp_ref, adv, mask, n_tok, n_resp, 1),
                                theta)[0]
    assert not torch.allclose(acc, whole, rtol=1e-3, atol=1e-6)  # uneven micro-batches: the two scales differ


def test_denominators_and_errors():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    spec = algorithm(loss_scale="micro-batch-mean")
    assert loss_denominators(spec, mask, mini_tokens=10.0, mini_responses=4.0, micro_batches=3) == (6.0, 6.0)
    assert loss_denominators(algorithm(), mask, mini_tokens=10.0, mini_responses=4.0, micro_batches=3) == (10.0, 10.0)
    seq = algorithm(loss_agg_mode="seq-mean-token-mean", loss_scale="micro-batch-mean")
    assert loss_denominators(seq, mask, mini_tokens=10.0, mini_responses=4.0, micro_batches=3) == (3.0, 6.0)
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="loss scale"):
        objective(algorithm(loss_scale="sum"), z, z, torch.zeros(2), mask, mini_tokens=2.0, mini_responses=1.0)
    with pytest.raises(ValueError, match="micro_batches"):
        objective(spec, z, z, torch.zeros(2), mask, mini_tokens=2.0, mini_responses=1.0, micro_batches=0)


def test_micro_batches_by_count_cut_in_order():
    assert batching.micro_batches_by_count([5, 2, 7, 1, 0, 3], 2) == [[5, 2], [7, 1], [0, 3]]
    plan = batching.plan_updates([3] * 8, 4, 1, 10_000, torch.Generator().manual_seed(0), rows_per_micro=2)
    assert [len(mb) for mini in plan for mb in mini] == [2, 2, 2, 2]
    assert sorted(i for mini in plan for mb in mini for i in mb) == list(range(8))


def test_config_keys():
    cfg = load_config("configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml")
    assert cfg.algorithm.loss_scale == "micro-batch-mean"
    assert cfg.trainer.micro_batch_size == 16  # the authors' 64 per micro-batch over 4 GPUs
    assert load_config("configs/paper/qwen2.5-7b-instruct_nq_llds.yaml").trainer.micro_batch_size == 16
    with pytest.raises(ConfigError, match="algorithm.loss_scale"):
        load_config("configs/tiny.yaml", ["algorithm.loss_scale=token-sum"])
    with pytest.raises(ConfigError, match="trainer.micro_batch_size"):
        load_config("configs/tiny.yaml", ["trainer.micro_batch_size=3"]).validate()


@pytest.mark.parametrize("agg_mode", list(aggregation.AGG_MODES))
def test_a_micro_batch_run_in_several_passes_gives_the_same_gradient(agg_mode):
    theta, logp_old, logp_ref, adv, mask = _batch()
    spec = algorithm(loss_agg_mode=agg_mode, kl_coef=0.3, entropy_coef=0.05, llds_lam=0.5, llds_gate="action",
                         loss_scale="micro-batch-mean")
    n_tok, n_resp = mini_batch_denominators(mask)

    def grad(rows, counts=None):
        idx = torch.as_tensor(rows)
        logp_new = torch.nn.functional.logsigmoid(theta[idx])
        loss, _ = objective(spec, logp_new, logp_old[idx], adv[idx], mask[idx], mini_tokens=n_tok,
                            mini_responses=n_resp, logp_ref=logp_ref[idx], entropy=-logp_new.exp() * logp_new,
                            micro_batches=2, micro_batch_counts=counts)
        return torch.autograd.grad(loss, theta)[0]

    whole = grad([0, 3, 6, 4])  # micro-batch 1 of 2 in one forward pass
    counts = mini_batch_denominators(mask[torch.as_tensor([0, 3, 6, 4])])
    torch.testing.assert_close(grad([0, 3], counts) + grad([6, 4], counts), whole, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(grad([0, 3]) + grad([6, 4]), whole, rtol=1e-3, atol=1e-6)  # each pass its own mean


def test_micro_batches_of_a_count_run_in_passes_within_the_token_budget():
    lengths = [100, 300, 200, 400, 100, 100, 300, 200]
    plan = batching.plan_updates(lengths, 8, 1, 600, torch.Generator().manual_seed(1), rows_per_micro=4)
    (passes,) = plan
    groups = batching.micro_batch_of_passes(passes, 4)
    assert groups == sorted(groups) and set(groups) == {0, 1}
    for g in (0, 1):  # each micro-batch: 4 rows, in passes whose padded size fits the budget
        rows = [i for p, gi in zip(passes, groups) if gi == g for i in p]
        assert len(rows) == 4
    assert all(len(p) * max(lengths[i] for i in p) <= 600 for p in passes)
    assert len(passes) > 2
