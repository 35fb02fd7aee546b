"""Chunked log-prob / entropy kernel against the naive full log-softmax: values and gradients."""

import pytest
import torch

from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy


@pytest.mark.parametrize("chunk_size", [1, 5, 256])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_equals_naive_fp32(chunk_size, temperature):
    g = torch.Generator().manual_seed(chunk_size)
    logits = (3 * torch.randn(3, 7, 97, generator=g)).requires_grad_(True)
    labels = torch.randint(0, 97, (3, 7), generator=g)
    w_logp, w_ent = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)

    logp, ent = chunked_logprobs_entropy(logits, labels, chunk_size=chunk_size, temperature=temperature)
    (logp * w_logp + ent * w_ent).sum().backward()
    grad_chunked, logits.grad = logits.grad.clone(), None

    logp_ref, ent_ref = naive_logprobs_entropy(logits, labels, temperature=temperature)
    (logp_ref * w_logp + ent_ref * w_ent).sum().backward()

    assert logp.dtype == torch.float32 and logp.shape == (3, 7)
    torch.testing.assert_close(logp, logp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_chunked, logits.grad, atol=1e-5, rtol=0)


def test_chunked_logp_only_and_bf16_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 33, generator=g).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 33, (2, 4), generator=g)
    logp, ent = chunked_logprobs_entropy(logits, labels, chunk_size=3, compute_entropy=False)
    assert ent is None
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    grad_chunked, logits.grad = logits.grad.clone(), None
    logp_ref, _ = naive_logprobs_entropy(logits, labels, compute_entropy=False)
    logp_ref.sum().backward()
    torch.testing.assert_close(logp, logp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_chunked, logits.grad)


def test_chunked_does_not_modify_fp32_input():
    logits = torch.randn(2, 3, 11, requires_grad=True)
    before = logits.detach().clone()
    logp, ent = chunked_logprobs_entropy(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=2)
    (logp.sum() + ent.sum()).backward()
    assert torch.equal(logits.detach(), before)


def test_entropy_of_uniform_and_logp_of_peaked():
    logits = torch.zeros(1, 2, 8)
    logits[0, 1, 3] = 100.0
    logp, ent = chunked_logprobs_entropy(logits, torch.tensor([[0, 3]]))
    assert logp[0, 0].item() == pytest.approx(-torch.log(torch.tensor(8.0)).item(), abs=1e-6)
    assert ent[0, 0].item() == pytest.approx(torch.log(torch.tensor(8.0)).item(), abs=1e-6)
    assert logp[0, 1].item() == pytest.approx(0.0, abs=1e-6) and ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_chunked_rejects_bad_input():
    logits = torch.randn(1, 2, 5)
    with pytest.raises(ValueError, match="labels"):
        chunked_logprobs_entropy(logits, torch.tensor([[0, 5]]))
    with pytest.raises(ValueError):
        chunked_logprobs_entropy(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs_entropy(logits, torch.tensor([[0, 1]]), temperature=0.0)
