"""A fake generation backend for tests: it "samples" token sequences given in advance.

``scripts`` is either
- a list with one entry per ``generate`` call, each a list with one token-id list per prompt of that call, or
- a callable ``(call_index, prompt_index, prompt_ids) -> list[int]``.

Like a real engine it cuts each scripted sequence right after the first stop string / eos (when built with a
tokenizer) and at ``max_new_tokens``, and reports ``finish_reason`` accordingly. Log-probs are deterministic fake
values (``-0.01 * (k + 1)`` for the k-th token of the call's output) or None with ``logprobs=False``.
Every call is recorded in ``calls`` (prompts and arguments, the per-request ``seeds`` among them) so tests can check
what the agent loop sent;
:class:`ScriptedStreamBackend` adds the request-level API (``add_request`` / ``step``,
:class:`~searchr1_lld.rollout.backends.base.RequestStreamBackend`, for the continuous scheduler) with the callable
form, called with the request's index among all requests and prompt index 0: a request that produces k tokens
finishes in the k-th ``step`` after it entered (an empty one in the first), as on an engine that samples one token
per running request per iteration; each request is recorded in ``requests``, and ``steps`` counts the iterations.
``load_weights`` records what was streamed in ``loaded``; ``sleep``/``wake_up`` only flip the state (base.py).
"""

from __future__ import annotations

import time
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
        seeds: Optional[Sequence[int]] = None,
    ) -> list[GenerationOutput]:
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy, seeds)
        self.check_awake()
        call = len(self.calls)
        self.calls.append(
            dict(prompts=[list(p) for p in prompts], max_new_tokens=max_new_tokens, stop_strings=list(stop_strings),
                 temperature=temperature, top_p=top_p, greedy=greedy, seeds=None if seeds is None else list(seeds))
        )
        detector = self._detector(stop_strings)
        return [self._output(self._script(call, i, list(prompt)), detector, max_new_tokens)
                for i, prompt in enumerate(prompts)]

    def _detector(self, stop_strings: list[str]) -> Optional[StopDetector]:
        if self.tokenizer is None:
            return None
        return StopDetector(self.tokenizer, stop_strings, eos_token_ids(self.tokenizer))

    def _output(self, ids: list[int], detector: Optional[StopDetector], max_new_tokens: int) -> GenerationOutput:
        """The scripted ids as an engine returns them: cut after a stop and at ``max_new_tokens``."""
        stopped = False
        if detector is not None:
            ids, stopped = detector.cut(ids)
        if len(ids) > max_new_tokens:
            ids, stopped = ids[:max_new_tokens], False
        finish = "stop" if stopped else "length"
        if not ids:
            finish = "stop"  # an engine that emitted nothing stopped immediately
        lps: Optional[list[float]] = [-0.01 * (k + 1) for k in range(len(ids))] if self.logprobs else None
        return GenerationOutput(ids, lps, finish)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Record the streamed weights (copies: a ZeRO-3 stream frees each gathered tensor after the call)."""
        self.loaded.append([(name, t.detach().clone()) for name, t in named_tensors])


class ScriptedStreamBackend(ScriptedBackend):
    """The scripted backend with the request-level API (module docstring); ``generate`` still works, so the two
    schedulers can run on one script."""

    def __init__(self, scripts: Script, tokenizer: Optional[Tokenizer] = None, *, logprobs: bool = True,
                 step_s: float = 0.0) -> None:
        """``step_s``: seconds each ``step`` sleeps, as an engine iteration takes time (other threads run)."""
        super().__init__(scripts, tokenizer, logprobs=logprobs)
        self.step_s = step_s
        self.requests: list[dict[str, Any]] = []  # one entry per add_request
        self.steps = 0
        self._running: dict[str, tuple[int, GenerationOutput]] = {}  # request id -> (steps left, its output)

    def add_request(self, request_id: str, prompt: list[int], *, max_new_tokens: int, stop_strings: list[str],
                    temperature: float, top_p: float, greedy: bool, seed: Optional[int] = None) -> None:
        self.check_generate_args([prompt], max_new_tokens, temperature, top_p, greedy)
        self.check_awake()
        if not callable(self.scripts):
            raise TypeError("ScriptedBackend.add_request needs a callable script (request index, 0, prompt) -> ids")
        if request_id in self._running:
            raise ValueError(f"request id {request_id!r} is already running")
        self.requests.append(dict(request_id=request_id, prompt=list(prompt), max_new_tokens=max_new_tokens,
                                  stop_strings=list(stop_strings), greedy=greedy, entered_at_step=self.steps,
                                  seed=seed))
        out = self._output(self._script(len(self.requests) - 1, 0, list(prompt)), self._detector(stop_strings),
                           max_new_tokens)
        self._running[request_id] = (max(1, len(out.token_ids)), out)

    def step(self) -> list[tuple[str, GenerationOutput]]:
        self.check_awake()
        self.steps += 1
        if self.step_s:
            time.sleep(self.step_s)
        finished = []
        for request_id, (left, out) in list(self._running.items()):
            if left <= 1:
                finished.append((request_id, out))
                del self._running[request_id]
            else:
                self._running[request_id] = (left - 1, out)
        return finished

    def has_unfinished_requests(self) -> bool:
        return bool(self._running)

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._running.pop(request_id, None)
