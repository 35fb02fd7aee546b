"""TRL's remaining GRPO loss types and two of its options, by hand: VESPO's Gamma-weighted loss, the top-entropy token
selection (TRL's top_entropy_quantile) and the masking of responses cut off by a length limit (TRL's
mask_truncated_completions), each on small tensors computed by hand, each option on a two-step train of the test
world, and the errors on bad settings. (tests/test_methods_vs_trl.py compares the same functions with TRL's own.)"""

from __future__ import annotations

import math

import pytest
import torch

from searchr1_lld.algo.logprob_losses import vespo_loss
from searchr1_lld.algo.objective import objective
from searchr1_lld.algo.token_selection import mask_responses, top_entropy_mask
from searchr1_lld.config import ConfigError, load_config
from searchr1_lld.rollout.types import Trajectory, to_batch

# two responses of 2 and 3 tokens; A = [1, -2]; x = logp_new - logp_old = [[0.5, -0.5], [0.1, -0.2, 0]]
MASK2 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV2 = torch.tensor([1.0, -2.0])
NEW2 = torch.tensor([[-0.5, -2.5, -9.0], [-0.4, -1.2, -3.0]])
OLD2 = NEW2 - torch.tensor([[0.5, -0.5, 0.0], [0.1, -0.2, 0.0]])


def _loss_and_grad(fn, logp_new, *args, **kw):
    x = logp_new.clone().requires_grad_(True)
    loss, metrics = fn(x, *args, **kw)
    return float(loss.detach()), torch.autograd.grad(loss, x)[0], metrics


def test_vespo_by_hand():
    # row 0: log W = 0.5 - 0.5 = 0, W = 1, A >= 0: phi = e^3 * 1^2 * e^-3 = 1
    # row 1: log W = 0.1 - 0.2 + 0 = -0.1, A < 0 (k 3, lambda 2): phi = exp(2 - 0.3 - 2 e^-0.1)
    phi1 = math.exp(2 + 3 * -0.1 - 2 * math.exp(-0.1))
    value, grad, m = _loss_and_grad(vespo_loss, NEW2, OLD2, ADV2, MASK2)
    # l = -phi A logp_new, token-mean over 5 tokens
    assert value == pytest.approx((0.5 + 2.5 + 2 * phi1 * (-0.4 - 1.2 - 3.0)) / 5)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.0, 0.0], [2 * phi1, 2 * phi1, 2 * phi1]]) / 5)
    assert m["vespo_phi_mean"] == pytest.approx((2 * 1.0 + 3 * phi1) / 5) and m["pg_clip_frac"] == 0.0
    # a response whose likelihood rose far (log W = 3, W = e^3, A > 0: k 2, lambda 3) is nearly switched off:
    # phi = exp(3 + 2 * 3 - 3 e^3) ~ 1.5e-22; one that fell far (log W = -3, A > 0) too: exp(3 - 6 - 3 e^-3)
    far = OLD2 + torch.tensor([[1.5, 1.5, 0.0], [-1.0, -1.0, -1.0]])
    _, grad, _ = _loss_and_grad(vespo_loss, far, OLD2, torch.tensor([1.0, 1.0]), MASK2, k_pos=2.0, lambda_pos=3.0)
    assert float(grad[0, 0]) == pytest.approx(-math.exp(3 + 6 - 3 * math.exp(3)) / 5, rel=1e-4)
    assert float(grad[1, 0]) == pytest.approx(-math.exp(3 - 6 - 3 * math.exp(-3)) / 5, rel=1e-5)
    with pytest.raises(ValueError, match="lambda_neg"):
        vespo_loss(NEW2, OLD2, ADV2, MASK2, lambda_neg=0.0)
    with pytest.raises(ValueError, match="k_pos and k_neg must be >= 0"):
        vespo_loss(NEW2, OLD2, ADV2, MASK2, k_pos=-1.0)


# four responses of 2, 1, 3, 2 tokens; padding entropies 9 never count
MASK4 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ENT4 = torch.tensor([[0.1, 2.0, 9.0], [1.5, 9.0, 9.0], [0.5, 3.0, 1.0], [0.2, 0.4, 9.0]])


def test_top_entropy_mask_by_hand():
    # the 8 response entropies sorted: 0.1 0.2 0.4 0.5 1.0 1.5 2.0 3.0; the 1 - rho quantile interpolates linearly
    # at position (1 - rho) * 7: rho 0.25 -> 5.25 -> 1.5 + 0.25 * 0.5 = 1.625 keeps 2.0 and 3.0
    assert top_entropy_mask(ENT4, MASK4, 0.25).nonzero().tolist() == [[0, 1], [2, 1]]
    # rho 0.5 -> 3.5 -> 0.75 keeps 1.0, 1.5, 2.0, 3.0; rho 0 keeps the largest alone; rho 1 every response token
    assert top_entropy_mask(ENT4, MASK4, 0.5).nonzero().tolist() == [[0, 1], [1, 0], [2, 1], [2, 2]]
    assert top_entropy_mask(ENT4, MASK4, 0.0).nonzero().tolist() == [[2, 1]]
    assert torch.equal(top_entropy_mask(ENT4, MASK4, 1.0), MASK4.bool())
    assert not top_entropy_mask(ENT4, torch.zeros_like(MASK4), 0.5).any()
    with pytest.raises(ValueError, match=r"quantile must be in \[0, 1\]"):
        top_entropy_mask(ENT4, MASK4, 1.5)
    with pytest.raises(ValueError, match="entropy and response_mask"):
        top_entropy_mask(ENT4[:, :2], MASK4, 0.5)


def _alg(*overrides: str):
    return load_config(None, ["algorithm.llds.enabled=false", "algorithm.kl_coef=0", *overrides]).algorithm


def test_the_policy_loss_trains_only_the_selected_tokens_over_the_full_denominator():
    # ratio 1 (logp_new = logp_old): PPO-clip l = -A on every token. rho 0.25 selects (0, 1) and (2, 1); the token
    # mean still divides by all 8 response tokens: L = (-A_0 - A_2) / 8, gradient -A / 8 on those two tokens only
    adv = torch.tensor([1.0, -1.0, 3.0, 2.0])
    logp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, m = objective(_alg("algorithm.top_entropy_quantile=0.25"), logp, logp.detach(), adv, MASK4, mini_tokens=8,
                        mini_responses=4, entropy=ENT4)
    assert float(loss) == pytest.approx((-1.0 - 3.0) / 8)
    (g,) = torch.autograd.grad(loss, logp)
    expected = torch.zeros(4, 3)
    expected[0, 1], expected[2, 1] = -1.0 / 8, -3.0 / 8
    torch.testing.assert_close(g, expected)
    assert m["top_entropy_kept_frac"] == pytest.approx(2 / 8)
    # with rollout-correction weights the two multiply: w(2, 1) = 0.5 halves that token's term
    tw = torch.ones(4, 3)
    tw[2, 1] = 0.5
    loss, _ = objective(_alg("algorithm.top_entropy_quantile=0.25"), logp, logp.detach(), adv, MASK4, mini_tokens=8,
                        mini_responses=4, entropy=ENT4, token_weights=tw)
    assert float(loss) == pytest.approx((-1.0 - 1.5) / 8)
    # rho = 1 (the default) is the plain loss and logs no selection
    loss, m = objective(_alg(), logp, logp.detach(), adv, MASK4, mini_tokens=8, mini_responses=4, entropy=ENT4)
    assert float(loss) == pytest.approx(-(2 * 1 - 1 + 3 * 3 + 2 * 2) / 8) and "top_entropy_kept_frac" not in m
    with pytest.raises(ValueError, match="top_entropy_quantile=0.25 needs the token entropies"):
        objective(_alg("algorithm.top_entropy_quantile=0.25"), logp, logp.detach(), adv, MASK4, mini_tokens=8,
                  mini_responses=4)


def _traj(finish: str, truncated: bool = False) -> Trajectory:
    return Trajectory(row={"id": finish}, group_id=0, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                      response_mask=[1, 0, 1], answer_mask=[0, 0, 0], engine_logprobs=[0.0, 0.0, 0.0],
                      finish_reason=finish, truncated=truncated)


def test_truncated_responses_lose_their_mask_by_hand():
    from searchr1_lld.instruments.monitor import rollout_metrics
    from searchr1_lld.learner.step import truncation_masked

    trajs = [_traj("answer"), _traj("length"), _traj("truncated", truncated=True), _traj("max_turns")]
    # cut by a length limit: the total budget (truncated) or the final turn's token cap (length); an answer, or a
    # final turn the model ended itself (max_turns), is not
    assert [t.cut_by_length for t in trajs] == [False, True, True, False]
    batch = to_batch(trajs, pad_token_id=0)
    assert batch.cut_by_length.tolist() == [False, True, True, False]
    masked = truncation_masked(batch, True)
    assert masked.response_mask.tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0], [1, 0, 1]]
    assert torch.equal(masked.responses, batch.responses) and batch.response_mask.sum() == 8  # the rest untouched
    assert truncation_masked(batch, False) is batch
    assert rollout_metrics(trajs)["rollout/truncated_frac"] == 0.5
    assert mask_responses(MASK4, torch.tensor([True, False, False, True])).sum(1).tolist() == [0, 1, 3, 0]
    with pytest.raises(ValueError, match=r"need response_mask \[B, T\] and cut \[B\]"):
        mask_responses(MASK4, torch.tensor([True, False]))


def test_bad_settings_are_errors_naming_the_key():
    for override, message in (("algorithm.top_entropy_quantile=1.5", "algorithm.top_entropy_quantile: must be in "),
                              ("algorithm.top_entropy_quantile=-0.1", "algorithm.top_entropy_quantile: must be in "),
                              ("algorithm.vespo.lambda_pos=0", "algorithm.vespo.lambda_pos: must be > 0"),
                              ("algorithm.vespo.k_neg=-1", "algorithm.vespo.k_neg: must be >= 0"),
                              ("algorithm.mask_truncated_responses=maybe", "algorithm.mask_truncated_responses")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(ConfigError, match="algorithm.top_entropy_quantile: must be 1 with algorithm.policy_loss=geo"):
        load_config(None, ["algorithm.method=gmpo", "algorithm.top_entropy_quantile=0.2"])
    with pytest.raises(ConfigError, match=r"algorithm.loss_scale: algorithm.method=bnpo pins it to 'micro-batch-mean'"):
        load_config(None, ["algorithm.method=bnpo", "algorithm.loss_scale=mini-batch-token-mean"])


# ---------------------------------------------------------------------------------------------------------------------
# the two options on a two-step train of the test world
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def _train(tmp_path, tiny_world, retriever, monkeypatch, *overrides: str, cut_first_group: bool = False):
    """Two steps of the test world; every group one correct and one wrong response (set by hand, as the untrained
    policy rarely answers right); ``cut_first_group``: the first group's responses marked as cut by the final turn's
    token cap. Returns (history, [[trajectories, the batch of each micro-batch of the update, ...]] per step)."""
    from conftest import on_world
    from searchr1_lld.learner import step as step_module
    from searchr1_lld.learner.trainer import Trainer
    from test_trainer import SMALL

    cfg = on_world(load_config(None, [*SMALL, "trainer.total_steps=2", f"trainer.output_dir={tmp_path}",
                                      "trainer.save_every=0", *overrides]), tiny_world)
    trainer = Trainer(cfg, retriever=retriever)
    real_rollout, real_micro_step = trainer.learner.rollout, step_module.micro_step
    seen: list[list] = []

    def rollout(rows, **kw):
        trajs = real_rollout(rows, **kw)
        if not kw.get("greedy"):
            for i, t in enumerate(trajs):
                t.reward = float(i % 2 == 0)
                if cut_first_group:
                    t.finish_reason = "length" if t.group_id == 0 else "answer"
            seen.append([trajs])
        return trajs

    def micro_step(learner, batch, *args, **kw):  # what each forward/backward of the update trains on
        seen[-1].append(batch)
        return real_micro_step(learner, batch, *args, **kw)

    trainer.learner.rollout = rollout
    monkeypatch.setattr(step_module, "micro_step", micro_step)
    result = trainer.run(evaluate=False)
    assert result.steps == 2 and len(seen) == 2
    return result.history, seen


@pytest.mark.parametrize("on", [True, False])
def test_truncated_responses_masked_on_a_two_step_train(tmp_path, tiny_world, world_retriever, monkeypatch, on):
    """With the option the update trains on a mask whose rows of the cut responses are 0 and whose other rows are
    the rollout's; without it, on the rollout's mask. rollout/truncated_frac is logged either way."""
    history, seen = _train(tmp_path, tiny_world, world_retriever, monkeypatch,
                           f"algorithm.mask_truncated_responses={str(on).lower()}", cut_first_group=True)
    for h, (trajs, *batches) in zip(history, seen):
        cut = torch.tensor([t.cut_by_length for t in trajs])
        assert cut.tolist() == [True, True, False, False] and h["rollout/truncated_frac"] == 0.5
        full = to_batch(trajs, 0).response_mask
        assert full[cut].sum() > 0  # the cut responses have generated tokens to leave out
        expected = mask_responses(full, cut) if on else full
        assert batches and all(torch.equal(b.response_mask, expected) for b in batches)
        assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"])


def test_top_entropy_selection_on_a_two_step_train(tmp_path, tiny_world, world_retriever, monkeypatch):
    """rho = 0.2: the policy loss runs with the selection (about a fifth of each forward pass's response tokens, the
    share logged as actor/top_entropy_kept_frac) and the step's metrics stay finite."""
    from searchr1_lld.algo import token_selection

    calls = []
    real = token_selection.top_entropy_mask

    def counted(entropy, mask, quantile):
        selected = real(entropy, mask, quantile)
        calls.append((quantile, int(selected.sum()), int((mask != 0).sum())))
        return selected

    monkeypatch.setattr(token_selection, "top_entropy_mask", counted)
    history, _ = _train(tmp_path, tiny_world, world_retriever, monkeypatch, "algorithm.top_entropy_quantile=0.2")
    assert calls and all(q == 0.2 and 0 < kept < n for q, kept, n in calls)
    kept = sum(k for _, k, _ in calls) / sum(n for _, _, n in calls)
    for h in history:
        assert 0.1 <= h["actor/top_entropy_kept_frac"] <= 0.3, h["actor/top_entropy_kept_frac"]
        assert all(math.isfinite(h[k]) for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"))
    print(f"top-entropy rho=0.2 on the test world: {kept:.3f} of the response tokens kept over {len(calls)} passes")
