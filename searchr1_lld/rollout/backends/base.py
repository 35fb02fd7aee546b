"""The generation backend contract (docs/architecture.md) and the stop-string detector the backends share.

A backend turns token-id prompts into sampled continuations. It returns exactly the sampled ids, cut right after the
token that completed a stop string (or after eos), with the sampling log-prob of each token:

    logprob[t] = log_softmax(logits_t / temperature)[token_t]      (temperature := 1.0 when greedy)

top-p only restricts *which* token is drawn; it does not renormalise the reported log-prob (the learner recomputes
the same quantity from a forward pass, so the two stay comparable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Protocol, Sequence, runtime_checkable

import torch

from searchr1_lld.protocols import Tokenizer


@dataclass
class GenerationOutput:
    token_ids: list[int]  # exactly what was sampled, cut right after the stop-string / eos token
    logprobs: Optional[list[float]]  # sampling log-prob of each token (None if the backend cannot report them)
    finish_reason: str  # "stop" (stop string or eos) | "length"

    def __post_init__(self) -> None:
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")


@runtime_checkable
class GenerationBackend(Protocol):
    """The engine contract the trainer and the evaluator drive (and the only way they touch an engine).

    One training step calls, on every rank and in this order::

        generate(...)            # rollout (possibly several calls: one per agent turn)
        sleep()                  # hand accelerator memory back for the update phase
        load_weights(named)      # stream the updated weights in, one (name, tensor) at a time
        wake_up()                # take the memory back before the next rollout

    - ``load_weights`` consumes an iterator of ``(hf_parameter_name, full_tensor)`` pairs one at a time (a ZeRO-3
      learner yields each tensor while its module is gathered, so the engine must not keep a reference to the
      iterator or the tensors after copying). Tied weights appear once (under the name the learner owns).
    - ``sleep``/``wake_up`` are idempotent; a backend without memory to hand back implements them as no-ops.
    - ``generate`` while asleep is an error: the trainer must call ``wake_up`` first.
    - ``vocab_limit``: the engine samples only ids below it and its log-probs are a softmax over them (None: every
      row of the model's head); the learner's log-probs use the same softmax.
    - ``eos_ids`` (optional; :class:`BackendBase` has it): the ids the engine stops on (the tokenizer's eos and the
      model's generation-config eos ids; None or absent: the tokenizer's alone); the agent loop counts a turn that
      ends in one as an eos stop.
    - ``seeds`` (``generate``) / ``seed`` (``add_request``): one sampling seed per request, derived by the agent
      loop from the step's seed, the trajectory and its turn, so that a request samples the same tokens from the
      same logits whatever the engine ran before or beside it (the continuous scheduler adds requests in the order
      their searches return). None: the engine's own generator. An engine that samples a whole call from one
      generator, re-seeded every step, and is driven turn by turn in a fixed order (HF) may ignore them; greedy
      calls need none.
    """

    vocab_limit: Optional[int]

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
    ) -> list[GenerationOutput]: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@runtime_checkable
class RequestStreamBackend(Protocol):
    """An engine's request-level API, what the continuous scheduler (rollout/continuous.py) drives: requests enter
    one at a time, the engine advances all running requests by one decode iteration per :meth:`step`, and each
    request comes back as soon as it has finished, in any order. A finished request's output follows the same
    contract as :meth:`GenerationBackend.generate`'s (the sampled ids, cut after the stop string or eos).

    - ``add_request(request_id, prompt, ...)``: ``request_id`` is unique among the unfinished requests; the sampling
      arguments are :meth:`GenerationBackend.generate`'s, per request (``seed``: this request's of ``seeds``).
    - ``step()``: one engine iteration; returns ``[(request_id, GenerationOutput)]`` of the requests that finished
      in it (often none).
    - ``has_unfinished_requests()``: whether a request is waiting or running.
    - ``abort_requests(request_ids)``: drop unfinished requests (a rollout that failed midway leaves none behind).
    """

    def add_request(self, request_id: str, prompt: list[int], *, max_new_tokens: int, stop_strings: list[str],
                    temperature: float, top_p: float, greedy: bool, seed: Optional[int] = None) -> None: ...

    def step(self) -> list[tuple[str, GenerationOutput]]: ...

    def has_unfinished_requests(self) -> bool: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...


class BackendBase:
    """Shared argument checks and the sleep bookkeeping (no-op memory hooks unless a backend overrides them)."""

    asleep: bool = False
    # the engine samples only ids below this (the embedding rows past the tokenizer are padding it masks), and its
    # log-probs are a softmax over them; None: every row of the model's head. The learner's softmax follows it.
    vocab_limit: Optional[int] = None
    eos_ids: Optional[set[int]] = None  # the ids it stops on; None: the tokenizer's eos

    def sleep(self) -> None:
        """Default: nothing to hand back (the engine shares the learner's memory or has none); only the state flips."""
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False

    def check_awake(self) -> None:
        if self.asleep:
            raise RuntimeError(f"{type(self).__name__}.generate called while asleep: call wake_up() first "
                               "(order: generate -> sleep -> load_weights -> wake_up)")

    @staticmethod
    def check_generate_args(prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, top_p: float,
                            greedy: bool, seeds: Optional[Sequence[int]] = None) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {temperature}); pass greedy=True instead")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")


def eos_token_ids(tokenizer: Tokenizer, model_config: Optional[object] = None) -> set[int]:
    """All ids that end generation: the tokenizer's eos plus the model's generation-config eos (may be a list);
    ``model_config``: anything with an ``eos_token_id`` (a transformers ``GenerationConfig``), or None."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(model_config, "eos_token_id", None)):
        if value is None:
            continue
        ids.update([int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)])
    return ids


class StopDetector:
    """Decides, token by token, whether a sequence just completed a stop string or emitted eos.

    Stop strings are matched on decoded text (never on re-encoded ids). Cheap path: a stop string can only be
    completed by a token whose own text contains the string's last character; only then the last few tokens are
    decoded and searched. Since the check runs after every token, an occurrence found in the tail window must have
    been completed by the newest token.
    """

    def __init__(self, tokenizer: Tokenizer, stop_strings: Iterable[str], eos_ids: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.eos_ids = set(int(i) for i in eos_ids)
        self._last_chars = {s[-1] for s in self.stop_strings}
        # a tail of W tokens covers any stop string when every token decodes to >= 1 character; +4 for safety
        self._window = max((len(s) for s in self.stop_strings), default=0) + 4
        self._candidate: dict[int, bool] = {}

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _is_candidate(self, token_id: int) -> bool:
        hit = self._candidate.get(token_id)
        if hit is None:
            piece = self._decode([token_id])
            # undecodable partial bytes show as U+FFFD: be conservative and check those too
            hit = any(c in piece for c in self._last_chars) or "\ufffd" in piece
            self._candidate[token_id] = hit
        return hit

    def is_stop(self, ids: Sequence[int]) -> bool:
        """True if the last token of ``ids`` is eos or completes one of the stop strings."""
        if not ids:
            return False
        last = int(ids[-1])
        if last in self.eos_ids:
            return True
        if not self.stop_strings or not self._is_candidate(last):
            return False
        tail = self._decode(ids[-self._window :])
        return any(s in tail for s in self.stop_strings)

    def cut(self, ids: Sequence[int]) -> tuple[list[int], bool]:
        """Cut ``ids`` right after the first stop (scan as a sampler would). Returns (ids, stopped)."""
        for t in range(len(ids)):
            if self.is_stop(ids[: t + 1]):
                return list(ids[: t + 1]), True
        return list(ids), False
