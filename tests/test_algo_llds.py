"""LLDS on hand-computed tensors: gates, tau, answer masking (MA), empty masks, gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1_lld.algo.advantages import broadcast_to_tokens
from searchr1_lld.algo.llds import adaptive_lam_answer, llds_can_act, llds_gate, llds_loss, per_response_advantage

# One response with two action spans separated by an observation and a padding tail:
#   mask   1     1     0     1     1     0
#   d      1.0  -0.5   (9)  -0.5   0.2   (9)     span0 sum = +0.5 (gate on), span1 sum = -0.3 (gate off)
MASK = torch.tensor([[1, 1, 0, 1, 1, 0]])
D = torch.tensor([[1.0, -0.5, 9.0, -0.5, 0.2, 9.0]])  # 9.0 outside the mask must never count


def _logps(d: torch.Tensor):
    logp_old = torch.zeros_like(d)
    logp_new = (logp_old - d).clone().requires_grad_(True)
    return logp_new, logp_old


@pytest.mark.parametrize(
    "gate,tau,expected_num",
    [
        ("none", 0.0, 1.0 + 0.2),  # every positive d on masked tokens
        ("response", 0.0, 1.0 + 0.2),  # response sum 1.0 - 0.5 - 0.5 + 0.2 = 0.2 > 0
        ("response", 0.3, 0.0),  # 0.2 <= 0.3
        ("action", 0.0, 1.0),  # only span0 (sum 0.5) is gated; span1 (-0.3) is not, its 0.2 is not penalised
        ("action", 0.5, 0.0),  # 0.5 is not > 0.5
        ("action", 0.4, 1.0),
    ],
)
def test_llds_gates_hand_computed(gate, tau, expected_num):
    logp_new, logp_old = _logps(D)
    loss, metrics = llds_loss(logp_new, logp_old, torch.tensor([1.0]), MASK, gate=gate, lam=0.2, tau=tau)
    assert loss.item() == pytest.approx(0.2 * expected_num / 4, abs=1e-7)
    assert metrics["llds/total_actions"] == 2.0
    assert metrics["llds/loss"] == pytest.approx(loss.item())


def test_llds_action_metrics_and_gate():
    logp_new, logp_old = _logps(D)
    _, metrics = llds_loss(logp_new, logp_old, torch.tensor([0.5]), MASK, gate="action")
    assert metrics["llds/gated_actions"] == 1.0
    assert metrics["llds/gated_responses"] == 1.0
    assert metrics["llds/active_token_frac"] == pytest.approx(1 / 4)  # only token 0 has g c p > 0
    assert metrics["llds/mean_penalty"] == pytest.approx((1.0 + 0.2) / 4)
    g = llds_gate(D, MASK, torch.tensor([0.5]), "action", 0.0)
    assert g.tolist() == [[True, True, False, False, False, False]]


def test_llds_negative_advantage_is_not_preserved():
    logp_new, logp_old = _logps(D)
    loss, metrics = llds_loss(logp_new, logp_old, torch.tensor([-0.1]), MASK, gate="none")
    assert loss.item() == 0.0
    assert metrics["llds/preserved_responses"] == 0.0
    # A = 0 is in the preserving set (A >= 0)
    loss0, _ = llds_loss(logp_new, logp_old, torch.tensor([0.0]), MASK, gate="none", lam=1.0)
    assert loss0.item() == pytest.approx(1.2 / 4)


def test_llds_token_broadcast_advantages_equal_per_response():
    d = torch.tensor([[0.3, 0.1, 0.0, 0.2], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    adv = torch.tensor([0.7, -0.7])
    logp_new, logp_old = _logps(d)
    a, _ = llds_loss(logp_new, logp_old, adv, mask, gate="response")
    b, _ = llds_loss(logp_new, logp_old, broadcast_to_tokens(adv, mask), mask, gate="response")
    assert a.item() == pytest.approx(b.item())
    assert a.item() == pytest.approx(0.2 * (0.1 + 0.0 + 0.2) / 5)


def test_llds_answer_mask_coefficient():
    d = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 1, 1]])
    answer = torch.tensor([[0, 0, 1, 1]])
    logp_new, logp_old = _logps(d)
    full, _ = llds_loss(logp_new, logp_old, torch.tensor([1.0]), mask, lam=0.2)
    masked, m = llds_loss(logp_new, logp_old, torch.tensor([1.0]), mask, lam=0.2, answer_mask=answer, lam_answer=0.0)
    half, _ = llds_loss(logp_new, logp_old, torch.tensor([1.0]), mask, lam=0.2, answer_mask=answer, lam_answer=0.1)
    bigger, _ = llds_loss(logp_new, logp_old, torch.tensor([1.0]), mask, lam=0.2, answer_mask=answer, lam_answer=5.0)
    assert full.item() == pytest.approx(0.2 * 2.0 / 4)
    assert masked.item() == pytest.approx(0.2 * 1.0 / 4)  # answer tokens fully masked
    assert m["llds/active_token_frac"] == pytest.approx(0.5)
    assert half.item() == pytest.approx((0.2 * 1.0 + 0.1 * 1.0) / 4)
    assert bigger.item() == pytest.approx(full.item())  # min(lam_answer, lam)
    with pytest.raises(ValueError, match="answer_mask"):
        llds_loss(logp_new, logp_old, torch.tensor([1.0]), mask, lam_answer=0.1)


def test_llds_empty_mask_is_zero_with_graph():
    logp_new, logp_old = _logps(torch.ones(2, 3))
    loss, metrics = llds_loss(logp_new, logp_old, torch.tensor([1.0, 1.0]), torch.zeros(2, 3), gate="action")
    assert loss.item() == 0.0 and not torch.isnan(loss)
    loss.backward()
    assert torch.equal(logp_new.grad, torch.zeros(2, 3))
    assert metrics["llds/total_actions"] == 0.0 and metrics["llds/active_token_frac"] == 0.0


def test_llds_noop_when_policy_unchanged():
    logp = torch.randn(3, 5)
    logp_new = logp.clone().requires_grad_(True)
    loss, metrics = llds_loss(logp_new, logp, torch.ones(3), torch.ones(3, 5), gate="none")
    loss.backward()
    assert loss.item() == 0.0 and metrics["llds/active_token_frac"] == 0.0
    assert torch.equal(logp_new.grad, torch.zeros(3, 5))


def test_llds_gradient_only_where_gated_and_lowered():
    logp_new, logp_old = _logps(D)
    loss, _ = llds_loss(logp_new, logp_old, torch.tensor([1.0]), MASK, gate="action", lam=0.2)
    loss.backward()
    expected = torch.zeros(1, 6)
    expected[0, 0] = -0.2 / 4  # token 0: gated span, likelihood fell; token 4: fell but its span is ungated
    assert torch.allclose(logp_new.grad, expected)
    assert logp_old.grad is None


def test_llds_gradient_step_raises_penalised_logp():
    torch.manual_seed(0)
    theta = torch.randn(4, 8, requires_grad=True)
    logp_old = torch.log_softmax(torch.randn(4, 8), -1).detach()
    mask = torch.ones(4, 8)
    mask[:, 5] = 0
    adv = torch.tensor([1.0, 0.5, 0.0, 2.0])
    logp_new = logp_old + theta - 0.5  # shifted down so many tokens have d > 0
    loss, _ = llds_loss(logp_new, logp_old, adv, mask, gate="none", lam=1.0)
    loss.backward()
    penalised = ((logp_old - logp_new.detach()) > 0) & (mask > 0)
    assert penalised.any()
    with torch.no_grad():
        stepped = logp_old + (theta - 0.1 * theta.grad) - 0.5
    assert torch.all(stepped[penalised] > logp_new.detach()[penalised])
    assert torch.equal(stepped[~penalised], logp_new.detach()[~penalised])


def test_llds_rejects_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="gate"):
        llds_loss(x, x, torch.ones(2), torch.ones(2, 3), gate="span")
    with pytest.raises(ValueError, match="lam"):
        llds_loss(x, x, torch.ones(2), torch.ones(2, 3), lam=-0.1)
    with pytest.raises(ValueError):
        llds_loss(x, x, torch.ones(3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        llds_loss(x, x[:, :2], torch.ones(2), torch.ones(2, 3))


def test_adaptive_lam_answer():
    assert adaptive_lam_answer(0.2, 0.5) == 0.0
    assert adaptive_lam_answer(0.2, 1.0) == 0.0
    assert adaptive_lam_answer(0.2, 2.5) == pytest.approx(0.3)
    # the paper's text: lam_answer * min(V / 2, 1)
    assert adaptive_lam_answer(0.2, 1.0, "paper") == pytest.approx(0.1)
    assert adaptive_lam_answer(0.2, 2.5, "paper") == pytest.approx(0.2)
    assert adaptive_lam_answer(0.2, 0.0, "paper") == 0.0
    with pytest.raises(ValueError, match="rule"):
        adaptive_lam_answer(0.2, 1.0, "other")


def _reference_llds(d, mask, adv, gate, lam, tau):
    """Loop-based reference straight from the docs/design.md formula."""
    num, den = 0.0, 0.0
    for i in range(d.shape[0]):
        row_m = mask[i].tolist()
        den += sum(row_m)
        if adv[i] < 0:
            continue
        spans, start = [], None
        for t, v in enumerate(row_m + [0]):
            if v and start is None:
                start = t
            if not v and start is not None:
                spans.append((start, t))
                start = None
        resp_sum = sum(d[i, t].item() for t in range(d.shape[1]) if row_m[t])
        for s, e in spans:
            span_sum = sum(d[i, t].item() for t in range(s, e))
            for t in range(s, e):
                on = {"none": True, "response": resp_sum > tau, "action": span_sum > tau}[gate]
                if on:
                    num += lam * max(0.0, d[i, t].item())
    return num / den if den else 0.0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 10),
    st.sampled_from(["none", "response", "action"]),
    st.floats(0.0, 0.5),
    st.integers(0, 2**16),
)
def test_llds_matches_loop_reference(b, t, gate, tau, seed):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=g) > 0.3).long()
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    logp_new, logp_old = _logps(d)
    loss, _ = llds_loss(logp_new, logp_old, adv, mask, gate=gate, lam=0.3, tau=tau)
    assert loss.item() == pytest.approx(_reference_llds(d, mask, adv, gate, 0.3, tau), abs=1e-9)


def test_per_response_advantage_and_denominator():
    adv = torch.tensor([[0.0, 0.4, 0.4], [0.0, 0.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 1, 0]])
    assert per_response_advantage(adv, mask).tolist() == pytest.approx([0.4, 0.0, -1.0])
    assert per_response_advantage(torch.tensor([1.0, 2.0, 3.0]), mask).tolist() == [1.0, 2.0, 3.0]
    logp_new, logp_old = _logps(torch.full((3, 3), 0.5))
    loss, _ = llds_loss(logp_new, logp_old, adv, mask, gate="none", lam=1.0, denominator=10)
    assert loss.item() == pytest.approx(0.5 * 2 / 10)  # row 0 only (row 2 has A < 0, row 1 has no tokens)


def test_llds_can_act():
    assert not llds_can_act(1, 1)
    assert llds_can_act(1, 2) and llds_can_act(2, 1)
    with pytest.raises(ValueError):
        llds_can_act(0, 1)


@pytest.mark.parametrize("gate", ["none", "response", "action"])
def test_gate_equals_a_python_loop_over_spans(gate):
    from searchr1_lld.algo.spans import action_span_list

    g = torch.Generator().manual_seed(11)
    mask = (torch.rand(9, 23, generator=g) < 0.7).float()
    mask[2] = 0  # an empty response
    mask[3] = 1  # one span over the whole row
    d = torch.randn(9, 23, generator=g)
    adv = torch.randn(9, generator=g)
    tau = 0.1
    want = torch.zeros(9, 23, dtype=torch.bool)
    for i in range(9):
        if adv[i] < 0:
            continue
        row_sum = float((d[i] * mask[i]).sum())
        for s, e in action_span_list([int(x) for x in mask[i].tolist()]):
            total = {"none": tau + 1, "response": row_sum, "action": float(d[i, s:e].sum())}[gate]
            want[i, s:e] = total > tau
    got = llds_gate(d, mask, adv, gate, tau)
    assert torch.equal(got, want)
    assert want.any() and not want.all()
