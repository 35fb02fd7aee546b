"""Token log-probs (and entropies) of responses under a causal LM, without materialising its ``[B, T, V]`` logits.

For a Hugging Face ``*ForCausalLM`` whose output head is a plain ``nn.Linear`` (Qwen2, Llama, SmolLM, ...): the model
runs through its wrapper as usual (DDP / DeepSpeed engine / accelerate: their hooks and gradient bookkeeping stay in
charge), a forward pre-hook on the output head takes the final hidden states ``[B, T, H]`` and hands the head an
empty ``[B, 0, H]`` slice, and :func:`searchr1_lld.algo.logprobs.linear_logprobs_entropy` computes the log-probs
from the hidden states and the head's weight chunk by chunk (logits recomputed in backward). Tied embeddings: the
head's weight *is* the embedding matrix, so its gradient adds to the embedding's as it should.

Falls back to the logits path (model logits -> :func:`~searchr1_lld.algo.logprobs.chunked_logprobs_entropy`) when
the model has no such head, when the config post-processes logits (logit scaling / soft-capping), and under
DeepSpeed ZeRO-3: there the head's weight is a partitioned parameter, gathered only inside the head's own forward,
so it cannot be read outside it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, linear_logprobs_entropy

# config fields of HF models whose logits are not just the head's output (the fused path would be wrong there)
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def fused_output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output head when log-probs can be computed from its input, else None (module docstring)."""
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):  # DDP, DeepSpeed engine
        inner = inner.module
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear:
        return None
    if hasattr(head.weight, "ds_id"):  # DeepSpeed ZeRO-3 partitioned parameter
        return None
    config = getattr(inner, "config", None)
    if any(getattr(config, k, None) not in (None, 1, 1.0) for k in _LOGIT_POSTPROCESSING):
        return None
    return head


def sampled_vocabulary(head: torch.nn.Linear, vocab_limit: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of the LM head's weight (and bias) that the rollout engine samples from: the first ``vocab_limit``
    (the tokenizer's ids; the embedding rows past them are padding the engine masks with a logit bias of -inf), or
    all of them for None. Views: the gradient reaches those rows of the parameter."""
    if vocab_limit is None:
        return head.weight, head.bias
    return head.weight[:vocab_limit], (head.bias[:vocab_limit] if head.bias is not None else None)


@contextlib.contextmanager
def _capture_head_input(head: torch.nn.Module):
    """Within the block, the head's input is recorded in the yielded dict and replaced by an empty slice."""
    captured: dict[str, torch.Tensor] = {}

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...]):
        hidden = args[0]
        captured["hidden"] = hidden
        return (hidden[..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(pre_hook)
    try:
        yield captured
    finally:
        handle.remove()


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor,
    start: int,
    *,
    chunk_size: int | None,
    temperature: float,
    compute_entropy: bool,
    fused: bool = True,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits[:, start:, :vocab_limit] / temperature) at ``labels`` ``[B, T']`` (and the entropy), fp32.

    ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, L]`` go to the model; positions ``start..L-1`` predict
    ``labels``. ``fused=False`` (or a model without a plain head, or ZeRO-3) takes the logits path. ``chunk_size``: rows
    of a log-prob tile (None = sized to the device, algo.logprobs.tile_shape). ``vocab_limit``: the softmax runs over
    the ids below it only, as the rollout engine's does (:func:`sampled_vocabulary`); None: every row of the head.
    """
    head = fused_output_head(model) if fused else None
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    if head is None:
        logits = model(**kwargs).logits[:, start:, :vocab_limit]
        return chunked_logprobs_entropy(logits, labels, chunk_size=chunk_size, temperature=temperature,
                                        compute_entropy=compute_entropy)
    with _capture_head_input(head) as captured:
        model(**kwargs)
    hidden = captured.get("hidden")
    if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != input_ids.shape:
        raise RuntimeError(
            f"the output head of {type(model).__name__} did not see the final hidden states [B, L, H] "
            f"(got {None if hidden is None else tuple(hidden.shape)}); pass fused=False for this model")
    weight, bias = sampled_vocabulary(head, vocab_limit)
    return linear_logprobs_entropy(hidden[:, start:], weight, labels, bias=bias, chunk_size=chunk_size,
                                   temperature=temperature, compute_entropy=compute_entropy)


# --------------------------------------------------------------------------------------------------------------------
# packed sequences: several responses in one row, no padding (learner.batching.pack_rows builds the inputs)
# --------------------------------------------------------------------------------------------------------------------

# the attention implementation of a packed forward on sdpa models: scaled-dot-product attention per sequence
PACKED_SDPA = "sdpa_packed"
# implementations whose attention already follows the sequence boundaries of cu_seq_lens_q / cu_seq_lens_k
_NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
# the same flash attention from the kernels hub: transformers switches ``flash_attention_N`` to these when flash-attn
# is not installed and the ``kernels`` package is (transformers' FLASH_ATTN_KERNEL_FALLBACK; a name may carry
# ``@revision`` or ``:function``); they run through the same varlen code path
_HUB_FLASH_KERNELS = ("kernels-community/flash-attn2", "kernels-community/flash-attn3",
                      "kernels-community/vllm-flash-attn3", "kernels-community/aiter-flash-attn",
                      "kernels-community/flash-attn4")


def follows_sequence_boundaries(impl: str | None) -> bool:
    """Whether the attention implementation ``impl`` runs packed forwards as it is (flash attention, local or from
    the kernels hub)."""
    if not impl:
        return False
    return impl in _NATIVE_VARLEN or impl.split("@")[0].split(":")[0] in _HUB_FLASH_KERNELS


def _packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except for a packed forward (``cu_seq_lens_q`` given: query, key, value
    ``[1, heads, N, d]`` holding the sequences ``cu_seq_lens_q[i]:cu_seq_lens_q[i+1]`` back to back): causal attention
    within each sequence, one ``scaled_dot_product_attention`` per sequence, so the cost is sum_i L_i^2 rather than
    the N^2 of a block-diagonal mask. Returns ``[1, N, heads, d]`` as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # deferred: transformers

    segments = kwargs.pop("packed_segments", None)
    if segments is not None:
        return _segmented_attention(query, key, value, segments, dropout, scaling), None
    packed_mask = isinstance(attention_mask, torch.Tensor) and attention_mask.numel() == 0  # _packed_sdpa_mask's
    if cu_seq_lens_q is None:
        if packed_mask:
            raise ValueError("packed sequences (positions restarting within a row) need their boundaries: pass "
                             "cu_seq_lens_q (policy_logprobs.packed_response_logprobs)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"a packed forward holds its sequences in one row; got a batch of {query.shape[0]}")
    bounds = cu_seq_lens_q.tolist()
    gqa = key.shape[1] != query.shape[1]
    out = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout, scale=scaling, is_causal=True,
        enable_gqa=gqa) for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _segmented_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: torch.Tensor,
                         dropout: float, scaling: float | None) -> torch.Tensor:
    """Attention of a packed forward whose rows share prompts (batching.pack_rows with share_prompts): query
    ``[1, heads, N, d]``, key and value ``[1, kv_heads, N, d]``; ``segments`` ``[S, 4]``: each row's prompt start,
    prompt length, response start and response length, a prompt laid out once, before the first response that
    follows it. Each prompt attends causally to itself; each response to its prompt and causally to itself (response
    token j sees the prompt and response tokens 0..j). Returns ``[1, N, heads, d]``.

    Every piece depends on its own prompt and response only, so a row's result does not depend on the rows packed
    with it (the learner's log-probs before an update equal the update's first forward to the bit)."""
    gqa = key.shape[1] != query.shape[1]
    attend = lambda q, k, v, **kw: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, dropout_p=dropout, scale=scaling, enable_gqa=gqa, **kw)
    pieces, laid_out = [], set()
    for ps, p, rs, m in segments.tolist():
        if ps not in laid_out:
            laid_out.add(ps)
            pieces.append(attend(query[:, :, ps : ps + p], key[:, :, ps : ps + p], value[:, :, ps : ps + p],
                                 is_causal=True))
        if m:
            keys = torch.cat([key[:, :, ps : ps + p], key[:, :, rs : rs + m]], dim=2)
            values = torch.cat([value[:, :, ps : ps + p], value[:, :, rs : rs + m]], dim=2)
            positions = torch.arange(p + m, device=query.device)
            visible = positions[None, :] <= positions[p:, None]  # response token j sees positions 0 .. p + j
            pieces.append(attend(query[:, :, rs : rs + m], keys, values, attn_mask=visible))
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous()


def _packed_sdpa_mask(*args: Any, attention_mask: torch.Tensor | None = None, allow_is_causal_skip: bool = True,
                      **kwargs: Any) -> torch.Tensor | None:
    """sdpa's mask, except for packed sequences (no attention mask, and transformers found positions restarting
    within a row, so it may not skip the mask): an empty tensor in place of the ``[1, 1, N, N]`` block-diagonal mask,
    which the packed attention never reads (it follows cu_seq_lens_q) and refuses without cu_seq_lens_q."""
    from transformers.masking_utils import sdpa_mask  # deferred: transformers

    if attention_mask is None and not allow_is_causal_skip:
        return torch.empty(0, dtype=torch.bool)
    return sdpa_mask(*args, attention_mask=attention_mask, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def use_packed_attention(model: torch.nn.Module) -> bool:
    """Give an sdpa model (transformers) the packed attention (:func:`_packed_sdpa_attention`, registered once); True
    when ``model`` runs packed forwards (sdpa switched, or a flash-attention implementation, varlen already). Any
    other implementation is a ValueError naming it: packing is asked for and would otherwise be off without a word."""
    from transformers import AttentionInterface  # deferred: transformers
    from transformers.masking_utils import AttentionMaskInterface  # deferred: transformers

    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if follows_sequence_boundaries(impl) or impl == PACKED_SDPA:
        return True
    if impl != "sdpa" or not callable(getattr(model, "set_attn_implementation", None)):
        raise ValueError(f"trainer.pack_sequences: {type(model).__name__} runs {impl!r} attention, which cannot run "
                         "packed forwards; set model.attn_implementation to sdpa or a flash-attention implementation "
                         "(flash_attention_2, or kernels-community/flash-attn2 from the kernels hub), or "
                         "trainer.pack_sequences=false")
    AttentionInterface.register(PACKED_SDPA, _packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_sdpa_mask)
    model.set_attn_implementation(PACKED_SDPA)
    return True


def _attention_implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation of ``model`` (plain, DDP or DeepSpeed engine) per its config."""
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
    return getattr(getattr(inner, "config", None), "_attn_implementation", None)


def runs_packed(model: torch.nn.Module) -> bool:
    """Whether ``model`` (plain, DDP or DeepSpeed engine) runs packed forwards (:func:`use_packed_attention`)."""
    impl = _attention_implementation(model)
    return impl == PACKED_SDPA or follows_sequence_boundaries(impl)


def shares_prompts(model: torch.nn.Module) -> bool:
    """Whether ``model``'s packed forwards can lay out a prompt once for several rows (the packed sdpa attention;
    flash-attention's varlen kernels follow cu_seq_lens only)."""
    return _attention_implementation(model) == PACKED_SDPA


def packed_response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seq_lens: torch.Tensor | None,
    logit_index: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int | None,
    temperature: float,
    compute_entropy: bool,
    fused: bool = True,
    segments: torch.Tensor | None = None,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits[..., :vocab_limit] / temperature) at ``labels`` ``[M]`` (and the entropy ``[M]``), fp32, of
    a packed forward (``vocab_limit``: :func:`response_logprobs`'s).

    ``input_ids``, ``position_ids`` ``[1, N]``: sequences back to back, positions restarting at 0 at each;
    ``cu_seq_lens`` ``[S + 1]`` int32: their boundaries; ``logit_index`` ``[M]``: the positions whose logits predict
    ``labels``. No attention mask: the attention (:func:`use_packed_attention`) follows ``cu_seq_lens``, or, for rows
    that share prompts (``segments`` ``[S, 4]`` from batching.pack_rows; cu_seq_lens None), the segments (only with
    the packed sdpa attention, :func:`shares_prompts`).
    """
    kwargs = packed_forward_kwargs(model, input_ids, position_ids, cu_seq_lens, segments)
    head = fused_output_head(model) if fused else None
    if head is None:
        logits = model(**kwargs).logits[:, logit_index, :vocab_limit]
        lp, ent = chunked_logprobs_entropy(logits, labels[None], chunk_size=chunk_size, temperature=temperature,
                                           compute_entropy=compute_entropy)
    else:
        with _capture_head_input(head) as captured:
            model(**kwargs)
        hidden = captured.get("hidden")
        if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != input_ids.shape:
            raise RuntimeError(f"the output head of {type(model).__name__} did not see the final hidden states "
                               f"[1, N, H]; pass fused=False for this model")
        weight, bias = sampled_vocabulary(head, vocab_limit)
        lp, ent = linear_logprobs_entropy(hidden[:, logit_index], weight, labels[None], bias=bias,
                                          chunk_size=chunk_size, temperature=temperature,
                                          compute_entropy=compute_entropy)
    return lp[0], (ent[0] if ent is not None else None)


def packed_forward_kwargs(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                          cu_seq_lens: torch.Tensor | None, segments: torch.Tensor | None) -> dict[str, Any]:
    """The keyword arguments of ``model``'s packed forward (:func:`packed_response_logprobs`' inputs); a
    RuntimeError when ``model`` cannot run it."""
    if not runs_packed(model):
        raise RuntimeError(f"{type(model).__name__} does not run packed forwards (policy_logprobs.use_packed_attention)")
    if segments is not None:
        if not shares_prompts(model):
            raise RuntimeError(f"rows that share prompts need the packed sdpa attention; {type(model).__name__} "
                               "runs another (pack its rows without share_prompts)")
        return dict(input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False,
                    packed_segments=segments)
    longest = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
    return dict(input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False,
                cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=longest, max_length_k=longest)


def final_hidden_states(model: torch.nn.Module, **kwargs: Any) -> tuple[torch.Tensor, torch.nn.Linear]:
    """(the final hidden states ``[B, L, H]`` of ``model(**kwargs)``, the output head): the head's input, captured
    as the fused log-prob path does (the head itself runs on an empty slice, so no logits exist). A RuntimeError when
    the head cannot be read outside its forward (:func:`fused_output_head`: no plain ``nn.Linear`` head, logit
    post-processing, DeepSpeed ZeRO-3)."""
    head = fused_output_head(model)
    if head is None:
        raise RuntimeError(f"the final hidden states and the output head of {type(model).__name__} cannot be read "
                           "(no plain nn.Linear head, logit post-processing in its config, or DeepSpeed ZeRO-3 "
                           "partitioning the head)")
    with _capture_head_input(head) as captured:
        model(**kwargs)
    hidden = captured.get("hidden")
    if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != kwargs["input_ids"].shape:
        raise RuntimeError(f"the output head of {type(model).__name__} did not see the final hidden states "
                           f"[B, L, H] (got {None if hidden is None else tuple(hidden.shape)})")
    return hidden, head
