"""The C kernel of the LLDS term (searchr1_lld/kernels/llds_cpu.c) against its torch formulation and by hand."""

import pytest
import torch

from searchr1_lld import kernels
from searchr1_lld.algo import llds


def _update(use_kernel, monkeypatch, neg_d, mask, adv, grad, **kw):
    """(grad - w inv_den, L_LLDS, stats) by algo.llds.llds_update, with the C kernel or (monkeypatched away) the torch
    formulation; ``grad`` is not modified (a copy is)."""
    calls = []
    with monkeypatch.context() as mp:
        if use_kernel:
            real = kernels.llds_update
            mp.setattr(kernels, "llds_update", lambda *a, **k: calls.append(1) or real(*a, **k))
        else:
            mp.setattr(kernels, "llds_update", lambda *a, **k: None)
        grad = grad.clone()
        stats = llds.llds_update(neg_d, mask, adv, grad, **kw)
    assert not use_kernel or calls
    return grad, stats[-1], stats


def test_the_kernel_builds_here():
    # CI has a C compiler: the kernel must really be built and used, not silently replaced by the torch path
    assert kernels.load("llds_cpu") is not None
    assert list(kernels.cache_dir().glob("llds_cpu-*.so"))


def test_kernel_hand_computed(monkeypatch):
    # one response: spans [0, 2) (d = 1.0, -0.5: sum 0.5, gated) and [3, 5) (d = -0.5, 0.2: sum -0.3, not gated)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]]) != 0
    d = torch.tensor([[1.0, -0.5, 9.0, -0.5, 0.2, 9.0]])
    grad, loss, stats = _update(True, monkeypatch, -d, mask, torch.tensor([0.5]), torch.full((1, 6), 0.5),
                                gate="action", lam=0.2, tau=0.0, answer_mask=None, lam_answer=None, inv_den=0.25)
    # only token 0 is penalised: w = 0.2 there; L = 0.2 * 1.0 / 4; grad = 0.5 - 0.2 / 4 at token 0, 0.5 elsewhere
    assert float(loss) == pytest.approx(0.05, abs=1e-7)
    assert grad[0].tolist() == pytest.approx([0.45, 0.5, 0.5, 0.5, 0.5, 0.5], abs=1e-7)
    expected = {"active_token_frac": 0.25, "gated_responses": 1, "preserved_responses": 1, "gated_actions": 1,
                "total_actions": 2, "mean_penalty": 1.2 / 4, "mean_displacement": 0.2 / 4, "loss": 0.05}
    assert dict(zip(llds.STAT_NAMES, stats.tolist())) == pytest.approx(expected, abs=1e-7)


def _batch(seed, b=9, t=37, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.7  # many short spans, some of length 1
    mask[0] = False  # an empty response
    mask[1] = True  # one span covering the row, first and last token included
    mask[2, ::2] = True
    mask[2, 1::2] = False  # spans of length 1 only
    neg_d = 0.5 * torch.randn(b, t, generator=g)
    neg_d[3] = 0.0  # no displacement: nothing gated, nothing penalised
    adv = torch.randn(b, generator=g)
    adv[1] = 0.3
    if token_adv:
        adv = adv[:, None] * mask
        adv[4, :5] = -1.0  # a row whose token advantages are not all of one sign: not in P when a masked one is < 0
    answer = torch.rand(b, t, generator=g) < 0.2
    grad = torch.randn(b, t, generator=g) / 100
    return neg_d, mask, adv.contiguous(), answer, grad


@pytest.mark.parametrize("gate", llds.GATES)
@pytest.mark.parametrize("tau", [0.0, 0.2])
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("lam_answer", [None, 0.05, 0.0])
def test_kernel_equals_the_torch_formulation(monkeypatch, gate, tau, token_adv, lam_answer):
    neg_d, mask, adv, answer, grad = _batch(seed=len(gate) + int(10 * tau), token_adv=token_adv)
    kw = dict(gate=gate, lam=0.3, tau=tau, answer_mask=answer if lam_answer is not None else None,
              lam_answer=lam_answer, inv_den=1 / 123.0)
    k_grad, k_loss, k_stats = _update(True, monkeypatch, neg_d, mask, adv, grad, **kw)
    t_grad, t_loss, t_stats = _update(False, monkeypatch, neg_d, mask, adv, grad, **kw)
    torch.testing.assert_close(k_grad, t_grad, rtol=0, atol=1e-6)
    assert float(k_loss) == pytest.approx(float(t_loss), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(k_stats, t_stats, rtol=1e-6, atol=1e-6)
    assert float(t_stats[0]) > 0  # the LLDS term is really exercised
    assert not torch.equal(k_grad, grad)


def test_kernel_not_used_where_it_does_not_apply():
    neg_d, mask, adv, _, grad = _batch(seed=1)
    kw = dict(gate=2, lam=0.3, tau=0.0, answer_mask=None, c_answer=None, inv_den=0.01)
    assert kernels.llds_update(neg_d, mask, adv, grad.clone(), **kw) is not None
    assert kernels.llds_update(neg_d.double(), mask, adv.double(), grad.double(), **kw) is None
    assert kernels.llds_update(neg_d.t().contiguous().t(), mask, adv, grad, **kw) is None  # not contiguous
    assert kernels.llds_update(neg_d, mask.float(), adv, grad, **kw) is None  # mask not bool


def test_without_a_compiler_the_torch_path_runs_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "_LOADED", {})
    monkeypatch.setattr(kernels, "_LLDS_FN", None)
    monkeypatch.setenv("SEARCHR1_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="using the torch formulation"):
        assert kernels.load("llds_cpu") is None
    neg_d, mask, adv, _, grad = _batch(seed=2)
    kw = dict(gate="action", lam=0.3, tau=0.0, answer_mask=None, lam_answer=None, inv_den=0.01)
    assert kernels.llds_update(neg_d, mask, adv, grad.clone(), gate=2, lam=0.3, tau=0.0, answer_mask=None, c_answer=None,
                               inv_den=0.01) is None
    by_torch = grad.clone()
    stats = llds.llds_update(neg_d, mask, adv, by_torch, **kw)
    assert not list(tmp_path.glob("*.so")) and float(stats[0]) > 0 and not torch.equal(by_torch, grad)


def test_kernel_rejects_mismatched_shapes():
    # the C code trusts its shapes: a mismatch must be an error, never an out-of-bounds read
    neg_d, mask, adv, _, grad = _batch(seed=3)
    kw = dict(gate=2, lam=0.3, tau=0.0, answer_mask=None, c_answer=None, inv_den=0.01)
    with pytest.raises(ValueError, match="must be"):
        kernels.llds_update(neg_d, mask[:, :-1].contiguous(), adv, grad, **kw)
    with pytest.raises(ValueError, match="must be"):
        kernels.llds_update(neg_d, mask, adv[:-1].contiguous(), grad, **kw)
    with pytest.raises(ValueError, match="must be"):
        kernels.llds_update(neg_d, mask, adv, grad[:, :-1].contiguous(), **kw)
    with pytest.raises(ValueError, match="must be"):
        kernels.llds_update(neg_d, mask, adv, grad, **{**kw, "answer_mask": mask[:-1], "c_answer": 0.1})
