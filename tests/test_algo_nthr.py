"""NTHR (arXiv 2505.18830; searchr1_lld/algo/nthr.py, learner/nthr_weights.py): the scores, threshold, selection and
weights by hand on small tensors, the paper's special cases, the score as the inner product of output-head
gradients it is (autograd on a linear-softmax model), the response-vocabulary probabilities, the learner's hidden
states (padded and packed) against the model's own, a training run, and the config's errors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from searchr1_lld.algo import nthr
from searchr1_lld.algo.policy_loss import ppo_clip_loss
from searchr1_lld.config import ConfigError, load_config
from searchr1_lld.learner import nthr_weights, policy_logprobs
from searchr1_lld.learner.step import model_rows
from searchr1_lld.rollout.types import Trajectory, to_batch

from test_trainer import SMALL, _trainer, shared_retriever  # noqa: F401  (a module fixture)
from test_learner_packing import tiny_qwen2  # noqa: F401  (a module fixture)

# one group of three responses (row 0 correct, rows 1-2 incorrect), H = 2, C = 2 columns, T = 2
# (row 2's second token is off the response mask)
HIDDEN = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [5.0, 5.0]]])
ERRORS = torch.tensor([[[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.5, 0.0]], [[0.0, 1.0], [1.0, 1.0]]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
ADV = torch.tensor([1.0, -0.5, -0.5])
GROUPS = torch.tensor([7, 7, 7])


def test_scores_threshold_and_weights_by_hand():
    # M+ = sum over row 0's tokens of g h^T = (1,0)^T(1,0) + (1,1)^T(0,1) = [[1, 1], [0, 1]]; s = g^T M+ h
    # row 0: M+h = (1,0) -> 1; (1,1) -> 2.  row 1: (2,0) -> 2; (1,1) -> 0.5.  row 2: (2,1) -> 1; masked -> 0
    scores = nthr.nthr_scores(HIDDEN, ERRORS, ADV, GROUPS, MASK)
    assert scores.tolist() == [[1.0, 2.0], [2.0, 0.5], [1.0, 0.0]]
    # sbar+ of row 0 = 1.5; tau = beta * 1.5 for every row of the group
    assert nthr.nthr_thresholds(scores, ADV, GROUPS, MASK, beta=1.0).tolist() == [1.5] * 3
    tau = nthr.nthr_thresholds(scores, ADV, GROUPS, MASK, beta=0.5)
    assert tau.tolist() == [0.75] * 3
    # beta = 1: only row 1's first token (2 > 1.5); p = 1/3, eta = 2 |0.5 - 1/3| = 1/3
    w, sel = nthr.nthr_weights(HIDDEN, ERRORS, ADV, GROUPS, MASK, beta=1.0)
    assert sel.tolist() == [[False, False], [True, False], [False, False]]
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [1 / 3, 1.0], [1.0, 1.0]]))
    # beta = 0.5: row 2's first token too (1 > 0.75); row 1's second (0.5) stays; correct row 0 never selected
    w, sel = nthr.nthr_weights(HIDDEN, ERRORS, ADV, GROUPS, MASK, beta=0.5, eta_rule="constant", eta=0.0)
    assert sel.tolist() == [[False, False], [True, False], [True, False]]
    assert w.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 1.0]]
    # beta = -inf: every response-mask token of the incorrect responses; eta = 1 - p = 2/3, p = 1/3
    w, sel = nthr.nthr_weights(HIDDEN, ERRORS, ADV, GROUPS, MASK, beta=-math.inf, eta_rule="one_minus_p")
    assert sel.tolist() == [[False, False], [True, True], [True, False]]
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [2 / 3, 2 / 3], [2 / 3, 1.0]]))
    m = nthr.nthr_metrics(w, sel, ADV, MASK)
    assert m == pytest.approx({"nthr/selected_token_frac": 1.0, "nthr/incorrect_weight_mean": 2 / 3})
    # the selection is strict: a token exactly at tau is kept (Eq. 8: s > tau)
    assert not nthr.nthr_selection(scores, torch.full((3,), 2.0), ADV, MASK).any()


def test_groups_without_anchor_or_without_incorrect_response_keep_weight_one():
    """Two more groups beside the hand-computed one: group 8 has no correct response (no anchor: tau = +inf),
    group 9 only correct ones (nothing to select); each group's scores use only its own correct responses."""
    h = torch.cat([HIDDEN, torch.randn(4, 2, 2)])
    g = torch.cat([ERRORS, torch.randn(4, 2, 2)])
    mask = torch.cat([MASK, torch.ones(4, 2)])
    adv = torch.cat([ADV, torch.tensor([-1.0, -1.0, 1.0, 1.0])])
    groups = torch.tensor([7, 7, 7, 8, 8, 9, 9])
    scores = nthr.nthr_scores(h, g, adv, groups, mask)
    assert scores[:3].tolist() == [[1.0, 2.0], [2.0, 0.5], [1.0, 0.0]]  # unchanged by the other groups
    assert scores[3:5].abs().sum() == 0  # no anchor in group 8
    tau = nthr.nthr_thresholds(scores, adv, groups, mask, beta=1.0)
    assert tau[3:5].tolist() == [math.inf, math.inf]
    for beta in (1.0, 0.0, -math.inf):
        w, sel = nthr.nthr_weights(h, g, adv, groups, mask, beta=beta, eta_rule="constant", eta=0.0)
        assert (w[3:] == 1).all() and not sel[3:].any()
    # a batch of groups that are all correct or all incorrect: weights 1 everywhere, metrics 0 and 1
    w, sel = nthr.nthr_weights(h[3:], g[3:], adv[3:], groups[3:], mask[3:], beta=-math.inf)
    assert (w == 1).all()
    assert nthr.nthr_metrics(w, sel, torch.ones(4), mask[3:]) == {"nthr/selected_token_frac": 0.0,
                                                                  "nthr/incorrect_weight_mean": 1.0}


def test_eta_rules():
    p = torch.tensor([0.125, 0.5, 0.75])
    torch.testing.assert_close(nthr.get_eta_rule("two_abs_half_minus_p")(p, 0.0), torch.tensor([0.75, 0.0, 0.5]))
    torch.testing.assert_close(nthr.get_eta_rule("one_minus_p")(p, 0.0), torch.tensor([0.875, 0.5, 0.25]))
    torch.testing.assert_close(nthr.get_eta_rule("p")(p, 0.0), p)
    torch.testing.assert_close(nthr.get_eta_rule("constant")(p, 0.3), torch.full((3,), 0.3))
    with pytest.raises(ValueError, match="unknown NTHR eta rule 'half'"):
        nthr.get_eta_rule("half")
    # p is the group's share of A > 0 responses: 1 of 4 in group 1, 2 of 4 in group 2
    adv = torch.tensor([1.0, -1, -1, -1, 1, 1, -1, -1])
    groups = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    sel = torch.ones(8, 1, dtype=torch.bool)
    w = nthr.nthr_token_weights(sel, adv, groups)
    assert w[:, 0].tolist() == [0.5] * 4 + [0.0] * 4


def _linear_softmax_case(seed: int = 0):
    """A linear-softmax model (logits = W h, V = 7, H = 4) on fixed hidden states: two groups of two responses."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(4, 3, 4, generator=g, dtype=torch.float64)
    w = torch.randn(7, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    labels = torch.randint(0, 7, (4, 3), generator=g)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 1], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    return hidden, w, labels, mask, adv, groups


def test_the_score_is_the_inner_product_of_the_output_head_gradients():
    """s_t = < d/dW sum over the group's correct tokens of log pi,  d/dW log pi_t > exactly, for every token of the
    group (Eq. 7 on incorrect tokens); sbar+ of a correct response = < that sum's gradient, d/dW of the response's
    mean log pi >, so tau (beta = 1) is its minimum over the group's correct responses (Eq. 9)."""
    hidden, w, labels, mask, adv, groups = _linear_softmax_case()
    logp = torch.log_softmax(hidden @ w.T, -1).gather(-1, labels[..., None])[..., 0]  # [4, 3]
    probs = torch.softmax(hidden @ w.T, -1).detach()
    errors = nthr.prediction_errors(probs, labels, mask)
    scores = nthr.nthr_scores(hidden, errors, adv, groups, mask)
    tau = nthr.nthr_thresholds(scores, adv, groups, mask, beta=1.0)
    grad = lambda x: torch.autograd.grad(x, w, retain_graph=True)[0]  # noqa: E731
    want, gaps = torch.zeros(4, 3, dtype=torch.float64), []
    for gid in (0, 1):
        rows = (groups == gid).nonzero()[:, 0].tolist()
        anchors = [i for i in rows if adv[i] > 0]
        g_pos = grad(sum((logp[i] * mask[i]).sum() for i in anchors))
        for i in rows:
            for t in range(3):
                want[i, t] = float((g_pos * grad(logp[i, t])).sum()) if mask[i, t] else 0.0
        sbar = [float((g_pos * grad((logp[i] * mask[i]).sum() / mask[i].sum())).sum()) for i in anchors]
        gaps.append(abs(float(tau[rows[0]]) - min(sbar)))
        assert float(tau[rows[0]]) == pytest.approx(min(sbar), rel=1e-6)
    gap = float((scores.double() - want).abs().max())
    print(f"NTHR score vs autograd inner product of output-head gradients: max abs gap {gap:.2e} (scores up to "
          f"{float(want.abs().max()):.1f}, float32); tau vs min sbar+: {max(gaps):.2e}")
    torch.testing.assert_close(scores.double(), want, rtol=1e-6, atol=1e-6)
    assert (want[mask == 0] == 0).all() and (want[mask != 0] != 0).all()


def test_response_vocabulary_errors_restrict_the_softmax_to_the_responses_ids():
    """pi on V* (the ids of the response-mask tokens) is the full-vocabulary softmax's, not renormalised (App. 7.4);
    with a bias and a temperature; off the mask the errors are 0."""
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(2, 5, 6, generator=g), torch.randn(11, 6, generator=g)
    bias = torch.randn(11, generator=g)
    labels = torch.tensor([[3, 5, 3, 9, 0], [5, 1, 2, 2, 7]])
    mask = torch.tensor([[1.0, 1, 1, 0, 1], [1, 0, 1, 1, 1]])
    errors, cols = nthr.response_vocabulary_errors(hidden, weight, bias, labels, mask, temperature=0.7, chunk_size=3)
    assert cols.tolist() == [0, 2, 3, 5, 7]  # 9 and 1 sit off the mask
    full = torch.softmax((hidden @ weight.T + bias) / 0.7, -1)
    onehot = torch.nn.functional.one_hot(labels, 11).float()
    want = ((onehot - full)[..., cols]) * mask[..., None]
    torch.testing.assert_close(errors, want, rtol=1e-5, atol=1e-6)
    # when every id of the vocabulary occurs, the restricted scores are Eq. 7's over the whole vocabulary
    labels = torch.arange(10).view(2, 5)
    errors, cols = nthr.response_vocabulary_errors(hidden, weight[:10], bias[:10], labels, torch.ones(2, 5))
    assert cols.tolist() == list(range(10))
    full = nthr.prediction_errors(torch.softmax(hidden @ weight[:10].T + bias[:10], -1), labels, torch.ones(2, 5))
    args = (torch.tensor([1.0, -1.0]), torch.tensor([0, 0]), torch.ones(2, 5))
    torch.testing.assert_close(nthr.nthr_scores(hidden, errors, *args), nthr.nthr_scores(hidden, full, *args))


def test_no_gradient_flows_through_the_weights():
    h = HIDDEN.clone().requires_grad_(True)
    w, _ = nthr.nthr_weights(h, ERRORS.clone().requires_grad_(True), ADV, GROUPS, MASK)
    assert not w.requires_grad


def test_a_weight_on_ppo_clip_is_the_advantage_scaled():
    """The factor multiplies the token's PPO-clip term (token_weights), which is Alg. 1's eta * A: the same value
    and gradient, dual clip included."""
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 4, generator=g) * 3
    new = (old + 0.4 * torch.randn(3, 4, generator=g)).requires_grad_(True)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    adv = torch.tensor([1.2, -0.7, -0.7])
    w = torch.tensor([[1.0, 1, 1, 1], [0.25, 1, 0, 1], [1, 0.5, 1, 1]])
    for dual in (None, 3.0):
        a, _ = ppo_clip_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=dual, token_weights=w)
        b, _ = ppo_clip_loss(new, old, adv[:, None] * w, mask, clip_low=0.2, clip_high=0.2, dual_clip=dual)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(torch.autograd.grad(a, new)[0], torch.autograd.grad(b, new)[0])


def _traj(prompt, response, mask, group, reward):
    return Trajectory(row={"id": "x"}, group_id=group, prompt_ids=prompt, response_ids=response, response_mask=mask,
                      answer_mask=[0] * len(response), engine_logprobs=[0.0] * len(response), reward=reward)


def _fake_learner(model, pack: bool, budget: int = 24):
    cfg = load_config(None, ["algorithm.method=nthr", f"trainer.pack_sequences={str(pack).lower()}",
                             f"trainer.micro_batch_token_budget={budget}", "rollout.temperature=0.8",
                             "trainer.logprob_chunk_size=4", "algorithm.nthr.beta=0.5"])
    return SimpleNamespace(cfg=cfg, model=model, backend=SimpleNamespace(vocab_limit=60),
                           accelerator=SimpleNamespace(device=torch.device("cpu"), num_processes=1))


@pytest.mark.parametrize("pack", [False, True])
def test_the_learners_hidden_states_and_errors_are_the_models(tiny_qwen2, pack, monkeypatch):
    """The step's NTHR pass (learner.nthr_weights), padded rows or packed (a group's shared prompt laid out once, a
    tight token budget splitting groups over passes), hands algo.nthr the model's own final hidden states (the base
    model's last_hidden_state) and errors from its logits (the sampled vocabulary, the rollout temperature); a
    group with no correct response is not run."""
    g = torch.Generator().manual_seed(2)
    trajs = []
    for group, rewards in ((0, (1.0, 0.0, 0.0)), (1, (0.0, 0.0)), (2, (0.0, 1.0))):
        prompt = torch.randint(2, 60, (4,), generator=g).tolist()
        for reward in rewards:
            r = int(torch.randint(3, 8, (1,), generator=g))
            trajs.append(_traj(prompt, torch.randint(2, 60, (r,), generator=g).tolist(),
                               [int(j % 3 != 1) for j in range(r)], group, reward))
    batch = to_batch(trajs, pad_token_id=0)
    adv = torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, -1.0, 1.0])
    learner = _fake_learner(tiny_qwen2, pack)
    seen = []
    real = nthr.nthr_weights
    monkeypatch.setattr(nthr, "nthr_weights", lambda *a, **kw: seen.append((a, kw)) or real(*a, **kw))
    weights, metrics = nthr_weights.step_weights(learner, batch, adv,
                                                 lambda idx: model_rows(learner, tiny_qwen2, batch, idx))
    assert [a[3].tolist() for a, _ in seen] == [[0, 0, 0], [2, 2]] and metrics["nthr/mixed_groups"] == 2.0
    assert seen[0][1] == dict(beta=0.5, eta_rule="two_abs_half_minus_p", eta=0.0)
    assert weights.shape == batch.responses.shape and (weights[3:5] == 1).all()
    for (hidden, errors, _, _, mask), rows in zip((a for a, _ in seen), ([0, 1, 2], [5, 6])):
        for k, i in enumerate(rows):
            t = trajs[i]
            ids = torch.tensor([t.prompt_ids + t.response_ids[:-1]])
            with torch.no_grad():
                ref = tiny_qwen2.model(input_ids=ids).last_hidden_state[0, len(t.prompt_ids) - 1:]
                probs = torch.softmax(tiny_qwen2(input_ids=ids).logits[0, len(t.prompt_ids) - 1:, :60] / 0.8, -1)
            r, m = len(t.response_ids), mask[k, : len(t.response_ids)] != 0
            torch.testing.assert_close(hidden[k, :r][m], ref[m], rtol=1e-4, atol=1e-5)
            labels = batch.responses[rows][:, : mask.shape[1]][mask != 0]
            cols = torch.unique(labels)
            want = torch.nn.functional.one_hot(torch.tensor(t.response_ids), 60).float()[:, cols] - probs[:, cols]
            torch.testing.assert_close(errors[k, :r][m], want[m], rtol=1e-4, atol=1e-5)
    assert 0.0 <= metrics["nthr/selected_token_frac"] <= 1.0


def test_a_model_whose_head_cannot_be_read_is_refused(tiny_qwen2, monkeypatch):
    batch = to_batch([_traj([3, 4], [5, 6], [1, 1], 0, 1.0), _traj([3, 4], [7, 8], [1, 1], 0, 0.0)], pad_token_id=0)
    learner = _fake_learner(tiny_qwen2, False)
    monkeypatch.setattr(policy_logprobs, "fused_output_head", lambda model: None)
    with pytest.raises(RuntimeError, match="cannot be read .*ZeRO-3"):
        nthr_weights.step_weights(learner, batch, torch.tensor([1.0, -1.0]),
                                  lambda idx: model_rows(learner, tiny_qwen2, batch, idx))
    learner.cfg.algorithm.nthr.enabled = False  # off: nothing runs, no weights
    assert nthr_weights.step_weights(learner, batch, torch.tensor([1.0, -1.0]), lambda idx: {}) == (None, {})


def test_training_steps_log_nthr_and_weight_the_policy_loss(tmp_path, tiny_world, shared_retriever,  # noqa: F811
                                                            monkeypatch):
    """Two steps of the nthr preset on the test world, every group one correct and one wrong response: NTHR runs
    each step before the updates and its weights reach the policy loss as token_weights."""
    from searchr1_lld.algo import policy_loss

    cfg = load_config(None, [*SMALL, "algorithm.method=nthr", "algorithm.nthr.beta=-.inf", "trainer.total_steps=2",
                             f"trainer.output_dir={tmp_path}", "trainer.save_every=0"])
    seen = []
    real = policy_loss.POLICY_LOSSES["ppo_clip"]
    monkeypatch.setitem(policy_loss.POLICY_LOSSES, "ppo_clip",
                        lambda *a, **kw: seen.append(kw.get("token_weights")) or real(*a, **kw))
    result = _trainer(cfg, tiny_world, shared_retriever).run(evaluate=False)
    assert result.steps == 2
    for h in result.history:
        # one correct response of two: p = 1/2, eta = 0; beta = -inf selects every token of the wrong response
        assert h["nthr/mixed_groups"] == 2.0 and h["nthr/selected_token_frac"] == 1.0, h
        assert h["nthr/incorrect_weight_mean"] == 0.0 and math.isfinite(h["actor/pg_loss"])
    assert seen and all(w is not None for w in seen) and any(float(w.min()) == 0.0 for w in seen)


def test_config_errors_name_the_nthr_keys():
    for override, key in (("algorithm.nthr.beta=.inf", "algorithm.nthr.beta"),
                          ("algorithm.nthr.eta=1.5", "algorithm.nthr.eta"),
                          ("algorithm.nthr.eta_rule=half", "algorithm.nthr.eta_rule")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        assert str(e.value).startswith(key), str(e.value)
    with pytest.raises(ConfigError, match=r"algorithm.nthr.enabled: algorithm.method=grpo pins it to False"):
        load_config(None, ["algorithm.method=grpo", "algorithm.nthr.enabled=true"])
    cfg = load_config(None, ["algorithm.method=nthr", "algorithm.nthr.beta=-.inf"]).algorithm
    assert (cfg.nthr.enabled, cfg.nthr.beta, cfg.policy_loss, cfg.advantage, cfg.llds.enabled) == (
        True, -math.inf, "ppo_clip", "grpo", False)
