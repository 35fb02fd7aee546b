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


def _linear_vs_naive(b, t, h, v, chunk_size, temperature, bias, compute_entropy=True, seed=0, vocab_chunk=8192):
    from searchr1_lld.algo.logprobs import linear_logprobs_entropy

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g).requires_grad_(True)
    weight = (torch.randn(v, h, generator=g) / h**0.5 * 3).requires_grad_(True)
    bias_t = (0.5 * torch.randn(v, generator=g)).requires_grad_(True) if bias else None
    labels = torch.randint(0, v, (b, t), generator=g)
    w_logp, w_ent = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    out = []
    for fused in (True, False):
        for p in (hidden, weight, bias_t):
            if p is not None:
                p.grad = None
        if fused:
            logp, ent = linear_logprobs_entropy(hidden, weight, labels, bias=bias_t, chunk_size=chunk_size,
                                                vocab_chunk_size=vocab_chunk, temperature=temperature,
                                                compute_entropy=compute_entropy)
        else:
            logits = torch.nn.functional.linear(hidden, weight, bias_t)
            logp, ent = naive_logprobs_entropy(logits, labels, temperature=temperature, compute_entropy=compute_entropy)
        loss = (logp * w_logp).sum() + ((ent * w_ent).sum() if compute_entropy else 0.0)
        loss.backward()
        out.append((logp.detach(), None if ent is None else ent.detach(), hidden.grad.clone(), weight.grad.clone(),
                    None if bias_t is None else bias_t.grad.clone()))
    return out


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 64])  # 5 and 4 do not divide b * t = 14; 64 > b * t
@pytest.mark.parametrize("vocab_chunk", [8192, 10, 1])  # one tile; 6 tiles, the last partial (V = 53); one per column
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_logprobs_equal_naive_values_and_gradients(chunk_size, vocab_chunk, temperature, bias):
    fused, naive = _linear_vs_naive(2, 7, 16, 53, chunk_size, temperature, bias, vocab_chunk=vocab_chunk)
    for a, r, name in zip(fused, naive, ("logp", "entropy", "grad hidden", "grad weight", "grad bias")):
        if r is None:
            assert a is None
            continue
        torch.testing.assert_close(a, r, atol=1e-5, rtol=0, msg=name)
        assert float(r.abs().sum()) > 0, name


def test_linear_logprobs_logp_only_and_tied_weight():
    # compute_entropy=False, and the LM-head weight also used as an embedding (tied): gradients add up
    from searchr1_lld.algo.logprobs import linear_logprobs_entropy

    g = torch.Generator().manual_seed(3)
    emb = torch.randn(41, 8, generator=g).requires_grad_(True)
    ids = torch.randint(0, 41, (3, 5), generator=g)
    labels = torch.randint(0, 41, (3, 5), generator=g)
    grads = []
    for fused in (True, False):
        emb.grad = None
        hidden = torch.tanh(emb[ids])  # a toy "model" on the tied embedding
        if fused:
            logp, ent = linear_logprobs_entropy(hidden, emb, labels, chunk_size=4, vocab_chunk_size=16,
                                                compute_entropy=False)
            assert ent is None
        else:
            logp, _ = naive_logprobs_entropy(hidden @ emb.t(), labels, compute_entropy=False)
        logp.sum().backward()
        grads.append(emb.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=0)


def test_linear_logprobs_chunk_boundaries_matter():
    # guard: a kernel that dropped the last partial chunk of rows or of vocabulary columns would break these
    fused, naive = _linear_vs_naive(1, 9, 6, 17, 4, 1.0, False, vocab_chunk=5)
    torch.testing.assert_close(fused[0][:, 8], naive[0][:, 8], atol=1e-5, rtol=0)
    torch.testing.assert_close(fused[2][:, 8], naive[2][:, 8], atol=1e-5, rtol=0)
    assert float(naive[2][:, 8].abs().sum()) > 0


def test_linear_logprobs_bad_input():
    from searchr1_lld.algo.logprobs import linear_logprobs_entropy

    with pytest.raises(ValueError, match="weight must be"):
        linear_logprobs_entropy(torch.zeros(1, 2, 4), torch.zeros(5, 3), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="labels must lie"):
        linear_logprobs_entropy(torch.zeros(1, 2, 4), torch.zeros(5, 4), torch.full((1, 2), 5))


def test_linear_logprobs_large_logits_are_stable():
    # the online logsumexp over vocabulary tiles must not overflow when logits are large and the max moves late
    fused, naive = _linear_vs_naive(1, 3, 4, 40, 2, 1.0, True, vocab_chunk=7, seed=5)
    from searchr1_lld.algo.logprobs import linear_logprobs_entropy

    hidden = torch.ones(1, 2, 2) * 30
    weight = torch.tensor([[1.0, 1.0]] * 5 + [[3.0, 3.0]] * 5)  # logits 60 in the first tile, 180 in the second
    logp, ent = linear_logprobs_entropy(hidden, weight, torch.tensor([[0, 7]]), vocab_chunk_size=5)
    ref_logp, ref_ent = naive_logprobs_entropy(torch.nn.functional.linear(hidden, weight), torch.tensor([[0, 7]]))
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused[0], naive[0], atol=1e-5, rtol=0)


def test_tile_shape_by_device():
    from searchr1_lld.algo.logprobs import CUDA_TILE_BYTES, tile_shape

    assert tile_shape(151936, "cpu") == (256, 8192) and tile_shape(53, "cpu") == (256, 53)
    # CUDA: whole vocabulary; rows = 256 MiB / (4 B x 151,936) = 441.7 -> 384 (a multiple of 64)
    assert CUDA_TILE_BYTES == 256 * 2**20 and tile_shape(151936, "cuda") == (384, 151936)
    assert tile_shape(151936, "cuda", tile_bytes=2**30) == (1728, 151936)  # 1766.9 -> 1728
    assert tile_shape(10**9, "cuda") == (64, 10**9)  # at least 64 rows
    with pytest.raises(ValueError, match="vocab"):
        tile_shape(0, "cuda")


def test_default_tiles_equal_naive():
    """chunk sizes left to the device (None): the CPU tile, the same values and gradients as the reference."""
    from searchr1_lld.algo.logprobs import linear_logprobs_entropy

    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 300, 8, generator=g, dtype=torch.float64).requires_grad_(True)  # 600 rows: 3 row tiles
    weight = torch.randn(9000, 8, generator=g, dtype=torch.float64).requires_grad_(True)  # 2 vocabulary tiles
    labels = torch.randint(0, 9000, (2, 300), generator=g)
    logp, ent = linear_logprobs_entropy(hidden, weight, labels)
    (logp.sum() + 0.3 * ent.sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_logp, ref_ent = naive_logprobs_entropy(torch.nn.functional.linear(hidden, weight), labels)
    (ref_logp.sum() + 0.3 * ref_ent.sum()).backward()
    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[0], hidden.grad, atol=5e-5, rtol=0)  # fp32 tiles
    torch.testing.assert_close(grads[1], weight.grad, atol=5e-5, rtol=0)
