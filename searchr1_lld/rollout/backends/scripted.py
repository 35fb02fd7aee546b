"""A fake generation backend for tests: it "samples" token sequences given in advance.

``scripts`` is either
- a list with one entry per ``generate`` call, each a list with one token-id list per prompt of that call, or
- a callable ``(call_index, prompt_index, prompt_ids) -> list[int]``.

Like a real engine it cuts each scripted sequence right after the first stop string / eos (when built with a
tokenizer) and at ``max_new_tokens``, and reports ``finish_reason`` accordingly. Log-probs are deterministic fake
values (``-0.01 * (k + 1)`` for the k-th token of the call's output) or None with ``logprobs=False``.
Every call is recorded in ``calls`` (prompts and arguments) so tests can check what the agent loop sent;
``load_weights`` records what was streamed in ``loaded``; ``sleep``/``wake_up`` only flip the state (base.py).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput, StopDetector, eos_token_ids

Script = Union[Sequence[Sequence[Sequence[int]]], Callable[[int, int, list[int]], Sequence[int]]]


class ScriptedBackend(BackendBase):
    def __init__(self, scripts: Script, tokenizer: Optional[Tokenizer] = None, *, logprobs: bool = True) -> None:
        self.scripts = scripts
        self.tokenizer = tokenizer
        self.logprobs = logprobs
        self.calls: list[dict[str, Any]] = []
        self.loaded: list[list[tuple[str, torch.Tensor]]] = []  # one list of (name, tensor) per load_weights call

    def _script(self, call: int, i: int, prompt: list[int]) -> list[int]:
        if callable(self.scripts):
            return [int(t) for t in self.scripts(call, i, prompt)]
        if call >= len(self.scripts):
            raise IndexError(f"ScriptedBackend: no script for call {call} (have {len(self.scripts)})")
        per_call = self.scripts[call]
        if i >= len(per_call):
            raise IndexError(f"ScriptedBackend: call {call} got {i + 1}+ prompts but the script has {len(per_call)}")
        return [int(t) for t in per_call[i]]

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        stop_strings: list[str],
        temperature: float,
        top_p: float,
        greedy: bool,
    ) -> list[GenerationOutput]:
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy)
        self.check_awake()
        call = len(self.calls)
        self.calls.append(
            dict(prompts=[list(p) for p in prompts], max_new_tokens=max_new_tokens, stop_strings=list(stop_strings),
                 temperature=temperature, top_p=top_p, greedy=greedy)
        )
        detector = None
        if self.tokenizer is not None:
            detector = StopDetector(self.tokenizer, stop_strings, eos_token_ids(self.tokenizer))
        outputs = []
        for i, prompt in enumerate(prompts):
            ids = self._script(call, i, list(prompt))
            stopped = False
            if detector is not None:
                ids, stopped = detector.cut(ids)
            if len(ids) > max_new_tokens:
                ids, stopped = ids[:max_new_tokens], False
            finish = "stop" if stopped else "length"
            if not ids:
                finish = "stop"  # an engine that emitted nothing stopped immediately
            lps: Optional[list[float]] = [-0.01 * (k + 1) for k in range(len(ids))] if self.logprobs else None
            outputs.append(GenerationOutput(ids, lps, finish))
        return outputs

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Record the streamed weights (copies: a ZeRO-3 stream frees each gathered tensor after the call)."""
        self.loaded.append([(name, t.detach().clone()) for name, t in named_tensors])
