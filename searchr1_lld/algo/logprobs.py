"""Token log-probabilities and entropies from logits, without materialising the full fp32 log-softmax.

For logits z ``[B, T, V]``, labels y ``[B, T]`` and temperature tau, with x = float32(z) / tau:

    logp[b, t]    = x[b, t, y[b, t]] - logsumexp_v x[b, t, v]
    entropy[b, t] = -sum_v p[b, t, v] log p[b, t, v],   log p = x - logsumexp_v x

``chunked_logprobs_entropy`` flattens the B*T rows and processes ``chunk_size`` rows at a time in fp32, in the forward
AND in the backward pass: a custom ``torch.autograd.Function`` keeps only the input logits (already alive in the
caller's graph), the labels and the per-row logsumexp ``[B*T]``, and recomputes the softmax per chunk in backward:

    d logp / d x      = onehot(y) - p
    d entropy / d x   = -p * (log p + entropy)
    d / d z           = (g_logp * (onehot(y) - p) + g_entropy * (-p * (log p + entropy))) / tau

so peak extra memory is one chunk of fp32 work (a few ``chunk_size x V`` buffers) plus the gradient of the logits
(same size and dtype as the logits, unavoidable when logits are an input). ``naive_logprobs_entropy`` is the plain
reference (full ``[B, T, V]`` fp32 log-softmax). benchmarks/bench_logprob_memory.py measures both (and a
``torch.utils.checkpoint`` per-chunk variant, which is worse: slicing's backward allocates full-size gradients).

``linear_logprobs_entropy`` goes one step earlier and never builds the logits at all (as Cut Cross-Entropy and
verl's fused kernels): from the final hidden states h ``[B, T, H]`` and the LM head (W ``[V, H]``, optional bias b
``[V]``), z = h W^T + b is computed in tiles of ``chunk_size`` rows x ``vocab_chunk_size`` vocabulary columns. The
forward keeps, per row, an online logsumexp (running max m, s = sum_v e^{x-m}) and u = sum_v e^{x-m} (x - m), so that

    lse = m + log s,   logp = x[y] - lse,   entropy = log s - u / s

and the backward recomputes each tile, where with G = dL/dz of the tile (the formula above, fp32):

    dL/dh = sum over tiles of G W_tile,   dL/dW_tile += G^T h,   dL/db_tile += G (rows summed)

so the only tensors with a vocabulary dimension are two fp32 tiles and dL/dW ``[V, H]`` (the parameter's own
gradient, accumulated in fp32). Tied embeddings need nothing special: W is the embedding matrix and its gradient adds
to the embedding's.

Tile shape (:func:`tile_shape`, used when the caller gives none): on CPU 256 rows x 8,192 vocabulary columns, the
tile whose peak memory benchmarks/bench_logprob_memory.py measures (on a 2-core CPU, forward + backward of 512 rows at
V = 151,936, H = 256: 7-8 s with it, 6-10 s with whole-vocabulary tiles of 128-512 rows, no clear gain). On CUDA
the whole vocabulary per tile and as many rows as fit a fixed fp32 tile budget (``CUDA_TILE_BYTES``): a 256 x 8,192
tile costs 10-15 kernel launches for ~0.1 ms of matrix work, so a 16k-token micro-batch over a 151,936-word vocabulary
(~1,200 tiles, forward and backward) is launch-bound; whole-vocabulary tiles of ~400 rows make it ~40 tiles of
bandwidth-bound work. The CUDA budget is not yet measured on a GPU (benchmarks/gpu_check.py measures it and a sweep
around it).
"""

from __future__ import annotations

import torch


# fp32 bytes of one [rows, vocabulary] buffer of a CUDA tile (a tile's forward and backward hold ~3 such buffers)
CUDA_TILE_BYTES = 256 * 2**20
CPU_TILE = (256, 8192)  # rows, vocabulary columns


def tile_shape(vocab: int, device_type: str, *, tile_bytes: int = CUDA_TILE_BYTES) -> tuple[int, int]:
    """(rows, vocabulary columns) of one tile on a ``device_type`` device (module docstring): CPU ``CPU_TILE``;
    CUDA the whole vocabulary and rows = tile_bytes / (4 vocab), rounded down to a multiple of 64 (at least 64)."""
    if vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {vocab}")
    if device_type != "cuda":
        return CPU_TILE[0], min(CPU_TILE[1], vocab)
    rows = tile_bytes // (4 * vocab) // 64 * 64
    return max(rows, 64), vocab


def _check(logits: torch.Tensor, labels: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"expected logits [B, T, V] and labels [B, T]; got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[-1]):
        raise ValueError(f"labels must lie in [0, V={logits.shape[-1]}); got range [{int(labels.min())}, {int(labels.max())}]")


def naive_logprobs_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, compute_entropy: bool = True, chunk_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference: full fp32 log-softmax over ``[B, T, V]`` (formulas in the module docstring). ``chunk_size`` unused."""
    _check(logits, labels, temperature, max(chunk_size, 1))
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, labels.long()[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
    return logp, entropy


def _fresh_fp32(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32(chunk) / temperature in a new buffer (safe to modify in place)."""
    if chunk.dtype == torch.float32:
        return chunk / temperature if temperature != 1.0 else chunk.clone()
    x = chunk.float()
    return x.div_(temperature) if temperature != 1.0 else x


class _ChunkedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits2d: torch.Tensor, labels1d: torch.Tensor, temperature: float, chunk_size: int, compute_entropy: bool):
        n = logits2d.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits2d.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits2d.device)
        entropy = torch.empty(n, dtype=torch.float32, device=logits2d.device) if compute_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            x = logits2d[s:e].float()  # may alias the input when it is fp32: never modified in place here
            if temperature != 1.0:
                x = x / temperature
            chunk_lse = torch.logsumexp(x, dim=-1)
            lse[s:e] = chunk_lse
            logp[s:e] = x.gather(-1, labels1d[s:e, None]).squeeze(-1) - chunk_lse
            if compute_entropy:
                logp_chunk = x - chunk_lse[:, None]  # shifted first: no cancellation between lse and sum p x
                entropy[s:e] = -torch.exp(logp_chunk).mul_(logp_chunk).sum(-1)
                del logp_chunk
            del x
        ctx.save_for_backward(logits2d, labels1d, lse, entropy if compute_entropy else lse)
        ctx.temperature, ctx.chunk_size, ctx.compute_entropy = temperature, chunk_size, compute_entropy
        if compute_entropy:
            return logp, entropy
        return logp, None

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits2d, labels1d, lse, entropy = ctx.saved_tensors
        tau, chunk_size = ctx.temperature, ctx.chunk_size
        use_entropy = ctx.compute_entropy and grad_entropy is not None
        grad_logits = torch.empty_like(logits2d)
        n = logits2d.shape[0]
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            logp_all = _fresh_fp32(logits2d[s:e], tau).sub_(lse[s:e, None])  # log p, a private buffer
            write_in_place = grad_logits.dtype == torch.float32  # compute straight into the output slice
            p = torch.exp(logp_all, out=grad_logits[s:e]) if write_in_place else torch.exp(logp_all)
            # g = g_logp * (onehot - p) + g_ent * (-p * (log p + H))
            if use_entropy:
                logp_all.add_(entropy[s:e, None]).mul_(-grad_entropy[s:e, None])  # -(log p + H) * g_ent, in place
                if grad_logp is not None:
                    logp_all.sub_(grad_logp[s:e, None])
                g = p.mul_(logp_all)  # p * (-(log p + H) g_ent - g_logp)
            else:
                g = p.mul_(-grad_logp[s:e, None]) if grad_logp is not None else p.zero_()
            if grad_logp is not None:
                g.scatter_add_(-1, labels1d[s:e, None], grad_logp[s:e, None].to(g.dtype))
            if tau != 1.0:
                g.div_(tau)
            if not write_in_place:
                grad_logits[s:e] = g
            del logp_all, p, g  # free the chunk buffer before the next one is allocated
        return grad_logits, None, None, None, None


def chunked_logprobs_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-prob ``[B, T]`` (fp32) and entropy ``[B, T]`` (fp32, or None), chunked over the B*T rows in forward
    and backward (module docstring; ``chunk_size`` None = the rows of :func:`tile_shape`). Equal to
    :func:`naive_logprobs_entropy` up to float rounding, gradients too."""
    if chunk_size is None:
        chunk_size = tile_shape(logits.shape[-1], logits.device.type)[0]
    _check(logits, labels, temperature, chunk_size)
    b, t, v = logits.shape
    logits2d = logits.reshape(b * t, v)
    labels1d = labels.reshape(b * t).long()
    logp, entropy = _ChunkedLogprobEntropy.apply(logits2d, labels1d, float(temperature), int(chunk_size), bool(compute_entropy))
    return logp.view(b, t), (entropy.view(b, t) if entropy is not None else None)


class _LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden2d, weight, bias, labels1d, temperature: float, chunk_size: int, vocab_chunk: int,
                compute_entropy: bool):
        n, v = hidden2d.shape[0], weight.shape[0]
        dev = hidden2d.device
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        logp = torch.empty(n, dtype=torch.float32, device=dev)
        entropy = torch.empty(n, dtype=torch.float32, device=dev) if compute_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            labels = labels1d[s:e]
            label_logit = torch.zeros(e - s, dtype=torch.float32, device=dev)
            run_max = s_sum = u_sum = None  # online: max m, s = sum e^{x-m}, u = sum e^{x-m} (x-m)
            for v0 in range(0, v, vocab_chunk):
                v1 = min(v0 + vocab_chunk, v)
                x = _chunk_logits(hidden2d[s:e], weight[v0:v1], None if bias is None else bias[v0:v1], temperature)
                _add_label_logit(label_logit, x, labels, v0, v1)
                new_max = x.amax(dim=-1) if run_max is None else torch.maximum(run_max, x.amax(dim=-1))
                y = x.sub_(new_max[:, None])  # x - m', in place
                ey = torch.exp(y)
                blk_s, blk_u = ey.sum(-1), ey.mul_(y).sum(-1) if compute_entropy else None
                if run_max is None:
                    s_sum, u_sum = blk_s, blk_u
                else:
                    scale = torch.exp(run_max - new_max)
                    if compute_entropy:
                        u_sum = scale * (u_sum + (run_max - new_max) * s_sum) + blk_u
                    s_sum = scale * s_sum + blk_s
                run_max = new_max
                del x, y, ey
            lse[s:e] = run_max + torch.log(s_sum)
            logp[s:e] = label_logit - lse[s:e]
            if compute_entropy:
                entropy[s:e] = torch.log(s_sum) - u_sum / s_sum  # H = log s - u / s
        ctx.save_for_backward(hidden2d, weight, bias, labels1d, lse, entropy if compute_entropy else lse)
        ctx.temperature, ctx.chunk_size, ctx.vocab_chunk, ctx.compute_entropy = temperature, chunk_size, vocab_chunk, compute_entropy
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden2d, weight, bias, labels1d, lse, entropy = ctx.saved_tensors
        tau, chunk_size, vocab_chunk = ctx.temperature, ctx.chunk_size, ctx.vocab_chunk
        use_entropy = ctx.compute_entropy and grad_entropy is not None
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden2d) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        n, v = hidden2d.shape[0], weight.shape[0]
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            h_chunk = hidden2d[s:e].to(weight.dtype)
            gh = torch.zeros(e - s, hidden2d.shape[1], dtype=torch.float32, device=hidden2d.device) if need_h else None
            for v0 in range(0, v, vocab_chunk):
                v1 = min(v0 + vocab_chunk, v)
                w_blk = weight[v0:v1]
                logp_all = _chunk_logits(h_chunk, w_blk, None if bias is None else bias[v0:v1], tau).sub_(lse[s:e, None])
                g = torch.exp(logp_all)  # p
                # G = (g_logp * (onehot - p) + g_ent * (-p * (log p + H))) / tau
                if use_entropy:
                    logp_all.add_(entropy[s:e, None]).mul_(-grad_entropy[s:e, None])
                    if grad_logp is not None:
                        logp_all.sub_(grad_logp[s:e, None])
                    g.mul_(logp_all)
                elif grad_logp is not None:
                    g.mul_(-grad_logp[s:e, None])
                else:
                    g.zero_()
                del logp_all
                if grad_logp is not None:
                    _add_label_logit(None, g, labels1d[s:e], v0, v1, add=grad_logp[s:e])
                if tau != 1.0:
                    g.div_(tau)
                with torch.autocast(device_type=g.device.type, enabled=False):
                    if need_h:
                        gh.add_((g.to(weight.dtype) @ w_blk).float())
                    if need_w:
                        grad_w[v0:v1].addmm_(g.t(), h_chunk.float())
                if need_b:
                    grad_b[v0:v1].add_(g.sum(0))
                del g
            if need_h:
                grad_h[s:e] = gh.to(grad_h.dtype)
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None, None)


def _chunk_logits(hidden_chunk: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """float32(h W^T + b) / temperature for one tile, in a new buffer. The product runs in the weight's dtype with
    autocast off, so that the backward's recomputation is bit-identical to the forward's."""
    with torch.autocast(device_type=hidden_chunk.device.type, enabled=False):
        z = torch.nn.functional.linear(hidden_chunk.to(weight.dtype), weight, bias)
    x = z if z.dtype == torch.float32 else z.float()
    return x.div_(temperature) if temperature != 1.0 else x


def _add_label_logit(out: torch.Tensor | None, block: torch.Tensor, labels: torch.Tensor, v0: int, v1: int,
                     add: torch.Tensor | None = None) -> None:
    """For the rows whose label lies in vocabulary columns [v0, v1) of ``block`` ``[c, v1 - v0]``: out += the
    label's entry (``add`` None), or block[label] += add."""
    idx = labels - v0
    inside = (idx >= 0) & (idx < v1 - v0)
    idx = torch.where(inside, idx, 0)[:, None]
    if add is None:
        out.add_(torch.where(inside, block.gather(-1, idx).squeeze(-1), 0.0))
    else:
        block.scatter_add_(-1, idx, torch.where(inside, add, 0.0)[:, None].to(block.dtype))


def linear_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-prob ``[B, T]`` and entropy ``[B, T]`` (fp32; entropy None unless asked) of the logits
    z = hidden W^T + bias (hidden ``[B, T, H]``, weight ``[V, H]``, bias ``[V]``), divided by ``temperature``,
    without ever materialising ``[B, T, V]`` (module docstring). Gradients flow to hidden, weight and bias; equal
    to ``naive_logprobs_entropy(F.linear(hidden, weight, bias), labels)`` up to float rounding. ``chunk_size`` (rows)
    and ``vocab_chunk_size`` (columns) of a tile: None = :func:`tile_shape` for the device of ``hidden``."""
    if hidden.dim() != 3 or labels.shape != hidden.shape[:2]:
        raise ValueError(f"expected hidden [B, T, H] and labels [B, T]; got {tuple(hidden.shape)} and {tuple(labels.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"weight must be [V, H={hidden.shape[2]}]; got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [V={weight.shape[0]}]; got {tuple(bias.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    auto_rows, auto_cols = tile_shape(max(weight.shape[0], 1), hidden.device.type)
    chunk_size = auto_rows if chunk_size is None else chunk_size
    vocab_chunk_size = auto_cols if vocab_chunk_size is None else vocab_chunk_size
    if chunk_size < 1 or vocab_chunk_size < 1:
        raise ValueError(f"chunk_size and vocab_chunk_size must be >= 1, got {chunk_size}, {vocab_chunk_size}")
    v = weight.shape[0]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= v):
        raise ValueError(f"labels must lie in [0, V={v}); got range [{int(labels.min())}, {int(labels.max())}]")
    b, t, h = hidden.shape
    logp, entropy = _LinearLogprobEntropy.apply(hidden.reshape(b * t, h), weight, bias, labels.reshape(b * t).long(),
                                                float(temperature), int(chunk_size), int(vocab_chunk_size),
                                                bool(compute_entropy))
    return logp.view(b, t), (entropy.view(b, t) if entropy is not None else None)
