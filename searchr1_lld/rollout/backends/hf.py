"""Transformers generation backend: batched sampling with a KV cache, written over ``model(...)``.

One engine call = the prompts split into batches of ``batch_size`` (longest first, so each batch pads little), each
batch LEFT-padded and prefilled once, then decoded token by token with the cache. A sequence leaves the batch as soon
as it emits eos or completes a stop string (its rows are dropped from the cache), so finished sequences cost nothing.

Sampling (pure function :func:`sample_next_token`, the log-prob convention of backends/base.py):

    logp_all = log_softmax(logits / temperature)               # [B, V]
    token    ~ top-p(softmax(logits / temperature))            # or argmax when greedy
    logprob  = logp_all[token]                                 # temperature := 1 when greedy
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

import torch

from searchr1_lld.inference import evaluating
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput, StopDetector, eos_token_ids

if TYPE_CHECKING:
    from transformers import DynamicCache
    from transformers.modeling_outputs import CausalLMOutputWithPast


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter. probs: [B, V] (rows sum to 1) -> keep mask [B, V] (bool).

    keep[b, v] = 1 iff the total probability of the tokens ranked strictly above v (ties broken by sort order) is
    < top_p; the most likely token is always kept.
    """
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted)
    return keep.scatter(-1, order, keep_sorted)


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [B, V] (any float dtype) -> (tokens [B] long, logprobs [B] float32)."""
    logits = logits.float()
    if greedy:
        logp_all = torch.log_softmax(logits, dim=-1)
        tokens = torch.argmax(logits, dim=-1)
    else:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        probs = logp_all.exp()
        if top_p < 1.0:
            probs = torch.where(top_p_mask(probs, top_p), probs, torch.zeros_like(probs))
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``cache`` (transformers >= 5.x names it so and drops
    ``past_key_values`` in 5.40) or ``past_key_values`` (the name before; the project supports transformers >= 4.51).

    A wrapper whose forward passes ``**kwargs`` on (a PEFT model, a test harness) is looked through: the keyword is
    that of the module it wraps (its ``module``, ``base_model`` or ``model`` attribute)."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for attr in ("module", "base_model", "model"):
            inner = getattr(model, attr, None)
            if isinstance(inner, torch.nn.Module) and inner is not model:
                return cache_keyword(inner)
    raise TypeError(f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values` (nor wraps a module "
                    "that does): cannot decode with a KV cache")


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts LEFT-padded to the longest: (input_ids [B, L] long, attention_mask [B, L] long, 1 on prompt tokens)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        input_ids[b, L - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention_mask[b, L - len(p) :] = 1
    return input_ids, attention_mask


@dataclass
class _DecodeRecord:
    """What one batch has sampled so far: the ids and log-probs of each of its B sequences, each one's finish
    reason, and ``alive``: the batch row of each cache row still decoding."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[str]
    alive: list[int]

    @classmethod
    def empty(cls, batch_size: int) -> _DecodeRecord:
        return cls([[] for _ in range(batch_size)], [[] for _ in range(batch_size)], ["length"] * batch_size,
                   list(range(batch_size)))

    def add(self, tokens: list[int], logprobs: list[float], detector: StopDetector) -> list[int]:
        """Append one step's token and log-prob to each alive sequence (``tokens[j]`` for cache row j); a sequence
        that completes a stop string or emits eos finishes with "stop". Returns the cache rows that go on."""
        keep: list[int] = []
        for j, (b, tok, lp) in enumerate(zip(self.alive, tokens, logprobs)):
            self.tokens[b].append(tok)
            self.logprobs[b].append(lp)
            if detector.is_stop(self.tokens[b]):
                self.finish[b] = "stop"
            else:
                keep.append(j)
        return keep

    def outputs(self) -> list[GenerationOutput]:
        return [GenerationOutput(t, lp, f) for t, lp, f in zip(self.tokens, self.logprobs, self.finish)]


class HFBackend(BackendBase):
    """Generation with a transformers causal LM (CPU or GPU), the learner's own module or a copy of it."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, batch_size: int = 64, seed: Optional[int] = None,
                 shares_learner_weights: bool = False) -> None:
        """``shares_learner_weights``: ``model`` is the learner's own module (the trainer's CPU / small-GPU set-up),
        so :meth:`load_weights` has nothing to do. ``sleep``/``wake_up`` are no-ops beyond the state check: the
        module's memory belongs to the learner (or, for a separate copy, stays put: the HF path is for small models)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.shares_learner_weights = shares_learner_weights
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self._generator: Optional[torch.Generator] = None
        self.eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        self.cache_keyword = cache_keyword(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _rng(self) -> Optional[torch.Generator]:
        if self.seed is None:
            return None
        if self._generator is None or self._generator.device != self.device:
            self._generator = torch.Generator(device=self.device)
            self._generator.manual_seed(self.seed)
        return self._generator

    # ------------------------------------------------------------------------------------------------------------
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
        detector = StopDetector(self.tokenizer, stop_strings, self.eos_ids)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        outputs: list[Optional[GenerationOutput]] = [None] * len(prompts)
        with evaluating(self.model):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch_out = self._generate_batch(
                    [prompts[i] for i in chunk], max_new_tokens, detector, temperature, top_p, greedy
                )
                for i, out in zip(chunk, batch_out):
                    outputs[i] = out
        return outputs  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        detector: StopDetector,
        temperature: float,
        top_p: float,
        greedy: bool,
    ) -> list[GenerationOutput]:
        """One batch: a left-padded prefill, then one token per step for the sequences still running (the cache
        rows of a sequence that stopped are dropped)."""
        from transformers import DynamicCache

        device = self.device
        input_ids, attention_mask = left_pad(prompts, self.pad_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        out = self._forward(input_ids, attention_mask, position_ids, cache, logits_to_keep=1)
        next_pos = position_ids[:, -1] + 1  # [B]
        record = _DecodeRecord.empty(len(prompts))
        rng = self._rng()
        for step in range(max_new_tokens):
            tokens, logps = sample_next_token(
                out.logits[:, -1, :], temperature=temperature, top_p=top_p, greedy=greedy, generator=rng
            )
            keep = record.add(tokens.tolist(), logps.tolist(), detector)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(record.alive):
                idx = torch.tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(idx)
                tokens, attention_mask, next_pos = tokens[idx], attention_mask[idx], next_pos[idx]
                record.alive = [record.alive[j] for j in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(record.alive), 1))], dim=1)
            out = self._forward(tokens[:, None], attention_mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return record.outputs()

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: DynamicCache, **kwargs: int) -> CausalLMOutputWithPast:
        """``model(...)`` over ``input_ids`` [B, L] with the KV cache ``cache`` (extended in place); the model's
        output (``.logits`` [B, L or 1, V])."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_keyword: cache},
            **kwargs,
        )

    # ------------------------------------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each ``(name, tensor)`` into the engine module, one at a time (contract in backends/base.py).

        When the backend generates with the learner's own module (``shares_learner_weights``) the weights are
        already current: nothing is read from the iterator (so a ZeRO-3 learner gathers nothing). Otherwise every
        parameter of the engine module must arrive exactly once with its shape; anything else is an error.
        """
        if self.shares_learner_weights:
            return
        target = dict(self.model.named_parameters())  # tied weights appear once, as in the learner
        seen: set[str] = set()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in target:
                    raise KeyError(f"load_weights: the engine has no parameter {name!r}")
                if name in seen:
                    raise ValueError(f"load_weights: {name!r} sent twice")
                param = target[name]
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, engine {tuple(param.shape)}")
                param.copy_(tensor.to(device=param.device, dtype=param.dtype))
                seen.add(name)
        missing = sorted(set(target) - seen)
        if missing:
            raise ValueError(f"load_weights: {len(missing)} engine parameters not sent, e.g. {missing[:5]}")
