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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits[:, start:] / temperature) at ``labels`` ``[B, T']`` (and the entropy), fp32.

    ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, L]`` go to the model; positions ``start..L-1`` predict
    ``labels``. ``fused=False`` (or a model without a plain head, or ZeRO-3) takes the logits path. ``chunk_size``: rows
    of a log-prob tile (None = sized to the device, algo.logprobs.tile_shape).
    """
    head = fused_output_head(model) if fused else None
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    if head is None:
        logits = model(**kwargs).logits[:, start:]
        return chunked_logprobs_entropy(logits, labels, chunk_size=chunk_size, temperature=temperature,
                                        compute_entropy=compute_entropy)
    with _capture_head_input(head) as captured:
        model(**kwargs)
    hidden = captured.get("hidden")
    if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != input_ids.shape:
        raise RuntimeError(
            f"the output head of {type(model).__name__} did not see the final hidden states [B, L, H] "
            f"(got {None if hidden is None else tuple(hidden.shape)}); pass fused=False for this model")
    return linear_logprobs_entropy(hidden[:, start:], head.weight, labels, bias=head.bias, chunk_size=chunk_size,
                                   temperature=temperature, compute_entropy=compute_entropy)
