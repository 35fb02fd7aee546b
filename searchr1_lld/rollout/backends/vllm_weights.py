"""The learner's weights on their way into a vLLM engine, and the check that the engine took every one.

vLLM's in-place reload hands each streamed ``(name, tensor)`` to the engine model's own ``load_weights``, which
renames it (the model's ``hf_to_vllm_mapper``: Qwen2's ``q_proj``/``k_proj``/``v_proj`` rows go into one
``qkv_proj``, ``gate_proj``/``up_proj`` into ``gate_up_proj``) and only logs a name it does not load (a tied
``lm_head.weight`` is one); after a level-2 sleep a parameter that nothing filled holds garbage. So after each load
the engine model's own parameters are read (:func:`engine_view`, run on the worker through ``LLM.apply_model``) and
compared with what was streamed (:func:`engine_mismatches`): every streamed name lands on a parameter the engine
holds, every parameter the engine holds is filled, and the rows streamed into each one add up to its shape (an
embedding may be padded up to vLLM's vocabulary padding).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Iterator

import torch

# vLLM pads an embedding's rows (and a tied or untied LM head's) up to a multiple of this
# (vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE; tests/test_vllm_contract.py
# reads it from the pinned release).
VOCAB_PADDING = 64


def model_parameter_names(model_path: str, trust_remote_code: bool = False) -> set[str]:
    """The parameter names of the HF model in ``model_path`` (local dir or hub id), as the learner's
    ``named_parameters()`` yields them (tied weights once): the model is built from its config on the meta device,
    no weights are read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return {name for name, _ in model.named_parameters()}


class WeightStream:
    """The learner's ``(name, tensor)`` pairs on their way into the engine: each tensor cast to the engine's dtype
    (no per-parameter conversion inside vLLM, half the bytes for an fp32 learner and a bf16 engine), each name and
    shape recorded for :meth:`check_complete` and :func:`engine_mismatches`."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> None:
        self.named_tensors, self.dtype = named_tensors, dtype
        self.shapes: dict[str, tuple[int, ...]] = {}

    @property
    def names(self) -> set[str]:
        return set(self.shapes)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.named_tensors:
            self.shapes[name] = tuple(tensor.shape)
            yield name, (tensor if tensor.dtype == self.dtype or not tensor.is_floating_point()
                         else tensor.to(self.dtype))

    def check_complete(self, expected: set[str]) -> None:
        missing = sorted(expected - self.names)
        if missing:
            raise RuntimeError(f"load_weights did not receive {len(missing)} of the engine model's {len(expected)} "
                               f"parameters: {_shown(missing)}; the engine now holds stale or unloaded values for them")


def _shown(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


def engine_view(model: torch.nn.Module, streamed: list[str]) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """Run on the engine's worker (``LLM.apply_model``): the parameters the engine model holds (name -> shape) and,
    for each streamed name, the parameter its ``load_weights`` puts it in (the model's ``hf_to_vllm_mapper``;
    ``None``: the mapper drops it). Names and shapes only, nothing large leaves the worker."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    held = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return held, {name: mapper.map_name(name) if mapper is not None else name for name in streamed}


def _stacked(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape of tensors stacked along dim 0 into one parameter (one tensor: its own); None if they cannot be."""
    if len(shapes) == 1:
        return shapes[0]
    if not all(shapes) or len({s[1:] for s in shapes}) != 1:
        return None
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def _fits(held: tuple[int, ...], shape: tuple[int, ...] | None) -> bool:
    """Whether a parameter of shape ``held`` takes a tensor of ``shape``: the same, or its rows padded up to a
    multiple of :data:`VOCAB_PADDING` (vLLM's embeddings and LM heads)."""
    if shape is None or held == shape:
        return held == shape
    return bool(shape) and held[1:] == shape[1:] and held[0] == -(-shape[0] // VOCAB_PADDING) * VOCAB_PADDING


def engine_mismatches(streamed: dict[str, tuple[int, ...]], mapped: dict[str, Any],
                      held: dict[str, tuple[int, ...]]) -> list[str]:
    """What the engine model holds against what was streamed into it (:func:`engine_view`'s ``held`` and
    ``mapped``): one line per problem, empty when every streamed tensor landed on a parameter the engine holds, every
    held parameter was filled, and each held parameter's shape is the streamed tensors that went into it (stacked
    along dim 0: q/k/v into qkv_proj)."""
    into: dict[str, list[str]] = defaultdict(list)
    for name in streamed:
        if mapped.get(name) in held:
            into[mapped[name]].append(name)
    problems = []
    skipped = sorted(n for n in streamed if mapped.get(n) not in held)
    if skipped:
        problems.append(f"streamed but not held by the engine model (vLLM skipped them): {_shown(skipped)}")
    unfilled = sorted(set(held) - set(into))
    if unfilled:
        problems.append(f"held by the engine model but not filled by the stream: {_shown(unfilled)}")
    for target, sources in sorted(into.items()):
        shapes = [streamed[s] for s in sources]
        if not _fits(held[target], _stacked(shapes)):
            given = " + ".join(f"{s} {shape}" for s, shape in zip(sources, shapes))
            problems.append(f"{target} has shape {held[target]} in the engine, the stream gave {given}")
    return problems


def check_engine_holds(streamed: dict[str, tuple[int, ...]], view: tuple[dict[str, tuple[int, ...]], dict[str, Any]]
                       ) -> None:
    """RuntimeError naming the names when the engine model (``view``: :func:`engine_view`'s result) does not hold
    exactly what was ``streamed`` (name -> shape; :func:`engine_mismatches`)."""
    held, mapped = view
    problems = engine_mismatches(streamed, mapped, held)
    if problems:
        raise RuntimeError("the engine model does not hold what load_weights streamed into it; its weights are "
                           "now partly stale or unloaded:\n  " + "\n  ".join(problems))
