"""The transformers backend's decoding for small Llama-family models: a KV cache written in place, prefixes reused.

``model(...)`` with transformers' ``DynamicCache`` costs a small model far more than its arithmetic: every decode
step concatenates the cache (a copy of all of it), repeats the key/value heads for grouped-query attention (another
copy), builds a mask, and every turn of a multi-turn rollout prefills its whole left-padded context again. For the
tiny world's 2-layer policy that overhead was most of a rollout. :class:`KVDecoder` runs the same model's own modules
(embedding, RMSNorm, q/k/v/o projections, rotary embedding, MLP, head) over its own cache:

- the cache holds ``[rows, kv_heads, capacity, head_dim]`` keys and values per layer, each row's tokens from position
  0 (no padding); a decode step writes one position per row in place and attends over the rows' valid positions,
  grouped-query heads by a reshape (no repeated keys);
- a prefill takes each row's new tokens back to back (no padding), attention per row over its cached prefix and its
  new tokens;
- a prompt identical to an earlier one of the same call is not prefilled again (its keys and values are copied), and
  a prompt that extends a sequence the previous call generated (the next turn of a trajectory: its context, its
  output, the observation) prefills only the tokens after what that call cached, as long as the weights did not
  change in between (:func:`weights_version`).

Supported: the model types in :data:`KV_DECODE_MODEL_TYPES` (decoder layers of RMSNorm, rotary q/k/v/o attention with
grouped-query heads and full causal attention, RMSNorm, MLP), on the CPU (the sandbox's small policies; GPU runs
generate with vLLM, and on a GPU ``model(...)`` prefills a batch in one call). :func:`unsupported_reason` says why
another model is not; the backend then decodes with ``model(...)`` (rollout/backends/hf.py).

Arithmetic: every module is the model's own, so projections, norms and the head compute what ``model(...)`` does;
attention is computed here (scaled dot product, softmax in fp32), so logits agree with the ``model(...)`` path to float
rounding (tests/test_kv_decode.py checks greedy outputs and sampled log-probs of both paths).

transformers internals: the modules above are reached by name (``model.model.{embed_tokens, rotary_emb, layers,
norm}``, each layer's ``input_layernorm``, ``self_attn.{q,k,v,o}_proj, scaling, head_dim``, ``mlp``,
``post_attention_layernorm``, the modeling module's ``apply_rotary_pos_emb``); no release bound is set on them, a guard
test does it instead: for every type in :data:`KV_DECODE_MODEL_TYPES`, on the installed transformers, the fast path
is taken and each decoder layer's output is what this decomposition computes (tests/test_kv_decode.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

# model_type of the transformers models whose decoder layers this module runs
KV_DECODE_MODEL_TYPES = ("qwen2", "llama", "mistral")
# bytes of cached keys/values kept from one engine call for the next (beyond that, the next call prefills anew)
PREFIX_STORE_BYTES = 1 << 30


def unsupported_reason(model: torch.nn.Module) -> Optional[str]:
    """None when :class:`KVDecoder` can run ``model``; else why not (one line)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in KV_DECODE_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {KV_DECODE_MODEL_TYPES}"
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return f"{type(model).__name__} has no .model with embed_tokens, layers, norm and rotary_emb"
    if type(model.get_output_embeddings()) is not torch.nn.Linear:
        return "the output head is not a plain nn.Linear"
    if getattr(sys.modules.get(type(model).__module__), "apply_rotary_pos_emb", None) is None:
        return f"{type(model).__module__} has no apply_rotary_pos_emb"
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling", "head_dim")):
            return "a decoder layer's attention is not q/k/v/o projections with scaling and head_dim"
        if getattr(attn, "sliding_window", None):
            return "sliding-window attention"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "query/key norms in attention"
    if any(getattr(p, "ds_id", None) is not None for p in model.parameters()):
        return "DeepSpeed ZeRO-3 partitioned parameters"
    device = model.get_output_embeddings().weight.device
    if device.type != "cpu":  # measured on CPUs only; on a GPU, model(...) batches its prefill in one call
        return f"the model is on {device}, not the CPU"
    return None


def weights_version(model: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    """A value that changes whenever a parameter of ``model`` is modified in place (an optimiser step, a weight load:
    torch's per-tensor version counters) or given new storage."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


@dataclass
class KVCache:
    """Keys and values of ``rows`` sequences: per layer ``[rows, kv_heads, capacity, head_dim]``, row r's valid
    positions ``0 .. length[r] - 1``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: torch.Tensor  # [rows] long

    @classmethod
    def empty(cls, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
              device: torch.device) -> KVCache:
        shape = (rows, kv_heads, capacity, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   torch.zeros(rows, dtype=torch.long, device=device))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def select(self, rows: torch.Tensor) -> KVCache:
        """A new cache of rows ``rows`` (in that order)."""
        return KVCache([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values],
                       self.length[rows].clone())

    def copy_row(self, dst: int, src: "KVCache", src_row: int, n: int) -> None:
        """Positions 0..n-1 of ``src``'s row ``src_row`` into row ``dst`` (its length becomes n)."""
        for mine, theirs in zip(self.keys + self.values, src.keys + src.values):
            mine[dst, :, :n] = theirs[src_row, :, :n]
        self.length[dst] = n


@dataclass
class PrefixStore:
    """Cached sequences of one engine call, for the next: ``entries[n][tuple of n token ids] = (cache, row)``."""

    version: tuple[tuple[int, int], ...] = ()
    entries: dict[int, dict[tuple[int, ...], tuple[KVCache, int]]] = field(default_factory=dict)
    nbytes: int = 0

    def add(self, tokens: list[int], cache: KVCache, row: int) -> None:
        n = len(tokens)
        if n:
            self.entries.setdefault(n, {})[tuple(tokens)] = (cache, row)

    def longest_prefix(self, prompt: list[int]) -> Optional[tuple[int, KVCache, int]]:
        """(n, cache, row) of the longest stored sequence that is a proper prefix of ``prompt``, or None."""
        for n in sorted(self.entries, reverse=True):
            if n < len(prompt):
                hit = self.entries[n].get(tuple(prompt[:n]))
                if hit is not None:
                    return n, hit[0], hit[1]
        return None


class KVDecoder:
    """Prefill and decode steps of a supported model (:func:`unsupported_reason` is None) over a :class:`KVCache`."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"KVDecoder cannot run {type(model).__name__}: {reason}")
        self.model = model
        self.inner = model.model
        self.head = model.get_output_embeddings()
        self.rope: Callable[..., Any] = sys.modules[type(model).__module__].apply_rotary_pos_emb
        attn = self.inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim

    def new_cache(self, rows: int, capacity: int) -> KVCache:
        p = self.head.weight
        return KVCache.empty(len(self.inner.layers), rows, self.kv_heads, capacity, self.head_dim, p.dtype, p.device)

    # ---------------------------------------------------------------------------------------------------------------
    def prefill(self, cache: KVCache, rows: list[int], new_tokens: list[list[int]]) -> torch.Tensor:
        """Append ``new_tokens[i]`` (at least one each) to cache row ``rows[i]``; returns the logits ``[len(rows), V]``
        that follow each row's last token."""
        dev = cache.length.device
        start = cache.length[rows].tolist()
        counts = [len(t) for t in new_tokens]
        ids = torch.tensor([t for toks in new_tokens for t in toks], dtype=torch.long, device=dev)
        pos = torch.cat([torch.arange(s, s + n, device=dev) for s, n in zip(start, counts)])
        row_of = torch.repeat_interleave(torch.tensor(rows, device=dev), torch.tensor(counts, device=dev))
        hidden = self.inner.embed_tokens(ids)[None]  # [1, N, H]
        cos_sin = self.inner.rotary_emb(hidden, pos[None])
        bounds = [0]
        for n in counts:
            bounds.append(bounds[-1] + n)
        for li, layer in enumerate(self.inner.layers):
            q, k, v = self._qkv(layer, hidden, cos_sin)  # [1, heads | kv_heads, N, d]
            cache.keys[li][row_of, :, pos] = k[0].transpose(0, 1)
            cache.values[li][row_of, :, pos] = v[0].transpose(0, 1)
            out = [self._prefill_attention(layer.self_attn, q[:, :, a:b], cache, li, r, s, b - a)
                   for r, s, a, b in zip(rows, start, bounds[:-1], bounds[1:])]
            hidden = self._finish_layer(layer, hidden, torch.cat(out, dim=2))
        cache.length[rows] += torch.tensor(counts, device=dev)
        last = torch.tensor(bounds[1:], device=dev) - 1
        return self.head(self.inner.norm(hidden[:, last]))[0]

    def decode(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per cache row (``tokens`` ``[rows]``); returns the next logits ``[rows, V]``."""
        rows = tokens.shape[0]
        pos = cache.length.clone()
        hidden = self.inner.embed_tokens(tokens)[:, None]  # [R, 1, H]
        cos_sin = self.inner.rotary_emb(hidden, pos[:, None])
        top = int(pos.max()) + 1
        masked = torch.arange(top, device=pos.device)[None, :] > pos[:, None]  # [R, top]: beyond the row's end
        bias = torch.zeros(masked.shape, dtype=torch.float32, device=pos.device).masked_fill_(masked, float("-inf"))
        every_row = torch.arange(rows, device=pos.device)
        group = self.heads // self.kv_heads
        for li, layer in enumerate(self.inner.layers):
            q, k, v = self._qkv(layer, hidden, cos_sin)  # q [R, heads, 1, d], k/v [R, kv_heads, 1, d]
            cache.keys[li][every_row, :, pos] = k[:, :, 0]
            cache.values[li][every_row, :, pos] = v[:, :, 0]
            keys, values = cache.keys[li][:, :, :top], cache.values[li][:, :, :top]
            qg = q.reshape(rows, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * layer.self_attn.scaling  # [R, kv, g, top]
            probs = torch.softmax(scores + bias[:, None, None, :], dim=-1).to(values.dtype)
            attn = torch.matmul(probs, values).reshape(rows, self.heads, 1, self.head_dim)
            hidden = self._finish_layer(layer, hidden, attn)
        cache.length += 1
        return self.head(self.inner.norm(hidden[:, -1]))

    # ---------------------------------------------------------------------------------------------------------------
    def _qkv(self, layer: torch.nn.Module, hidden: torch.Tensor,
             cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's rotated query ``[B, heads, L, d]``, key and value ``[B, kv_heads, L, d]`` of ``hidden``
        ``[B, L, H]``, as its attention module computes them."""
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = self.rope(q, k, *cos_sin)
        return q, k, v

    def _prefill_attention(self, attn: torch.nn.Module, q: torch.Tensor, cache: KVCache, layer_index: int, row: int,
                           start: int, n: int) -> torch.Tensor:
        """Attention of a row's ``n`` new queries ``[1, heads, n, d]`` over its ``start + n`` cached positions (causal:
        new token i sees positions 0 .. start + i)."""
        keys = cache.keys[layer_index][row : row + 1, :, : start + n]
        values = cache.values[layer_index][row : row + 1, :, : start + n]
        mask = None
        if start:
            positions = torch.arange(start + n, device=q.device)
            mask = positions[None, :] <= positions[start:, None]  # new token i sees positions 0 .. start + i
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=not start and n > 1, scale=attn.scaling,
            enable_gqa=self.heads != self.kv_heads)

    @staticmethod
    def _finish_layer(layer: torch.nn.Module, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP block of ``layer``; ``attn`` ``[B, heads, L, d]``, ``hidden``
        ``[B, L, H]``."""
        b, length = hidden.shape[:2]
        hidden = hidden + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, length, -1))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))
