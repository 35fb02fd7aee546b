"""Transformers generation backend: batched sampling with a KV cache, written over ``model(...)``.

One engine call = the prompts split into batches of ``batch_size`` (longest first, so each batch pads little), each
batch prefilled once, then decoded token by token with a KV cache. A sequence leaves the batch as soon as it emits eos
or completes a stop string, so finished sequences cost (almost) nothing. Two decoders, the same samples:

- Llama-family models (Qwen2, Llama, Mistral; ``kv_decode.unsupported_reason`` is None): :class:`KVDecoder`
  (kv_decode.py), the model's own modules over a cache written in place, no padding, and the prefixes of the previous
  call (a trajectory's earlier turns) and duplicate prompts (a GRPO group's) not prefilled again;
- any other causal LM, or ``fast_decode=False``: ``model(...)`` with transformers' ``DynamicCache``, the batch
  LEFT-padded, finished rows dropped from the cache at once (a one-time warning says why a model takes this path).

Both draw the same random numbers in the same order (one :func:`sample_next_token` call per decode step over the
running sequences, in batch order), so their samples differ only where float rounding of the logits flips a draw.

Sampling (pure function :func:`sample_next_token`, the log-prob convention of backends/base.py):

    logp_all = log_softmax(logits / temperature)               # [B, V]
    token    ~ top-p(softmax(logits / temperature))            # or argmax when greedy
    logprob  = logp_all[token]                                 # temperature := 1 when greedy
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import torch

from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput, StopDetector, eos_token_ids
from searchr1_lld.rollout.backends.kv_decode import (PREFIX_STORE_BYTES, KVCache, KVDecoder, PrefixStore,
                                                     unsupported_reason, weights_version)

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
                 shares_learner_weights: bool = False, fast_decode: bool = True) -> None:
        """``shares_learner_weights``: ``model`` is the learner's own module (the trainer's CPU / small-GPU set-up),
        so :meth:`load_weights` has nothing to do. ``sleep``/``wake_up`` are no-ops beyond the state check (and
        ``sleep`` drops the cached prefixes): the module's memory belongs to the learner (or, for a separate copy,
        stays put: the HF path is for small models). ``fast_decode``: decode with :class:`KVDecoder` when the model
        is one it runs (module docstring); False = always ``model(...)``."""
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
        self.kv_decoder: Optional[KVDecoder] = None
        self._stores = (PrefixStore(), PrefixStore())  # (the previous call's sequences, this call's)
        if fast_decode:
            reason = unsupported_reason(model)
            if reason is None:
                self.kv_decoder = KVDecoder(model)
            else:
                warnings.warn(f"the hf backend decodes {type(model).__name__} with model(...) and a DynamicCache, the "
                              f"slower path: {reason}", stacklevel=2)

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
        seeds: Optional[Sequence[int]] = None,
    ) -> list[GenerationOutput]:
        """``seeds`` are checked and not used: a call samples from one generator (``seed``, else the global one,
        which the trainer re-seeds every step) and the turn-batched loop calls in a fixed order."""
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy, seeds)
        self.check_awake()
        detector = StopDetector(self.tokenizer, stop_strings, self.eos_ids)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        outputs: list[Optional[GenerationOutput]] = [None] * len(prompts)
        generate_batch = self._generate_batch if self.kv_decoder is None else self._generate_batch_kv
        with evaluating(self.model):
            if self.kv_decoder is not None:
                self._begin_prefix_store()
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch_out = generate_batch(
                    [prompts[i] for i in chunk], max_new_tokens, detector, temperature, top_p, greedy
                )
                for i, out in zip(chunk, batch_out):
                    outputs[i] = out
            if self.kv_decoder is not None:
                self._end_prefix_store()
        return outputs  # type: ignore[return-value]

    def sleep(self) -> None:
        super().sleep()
        self._stores = (PrefixStore(), PrefixStore())  # the weights will change: the cached prefixes are stale

    # ------------------------------------------------------------------------------------------------------------
    def _begin_prefix_store(self) -> None:
        """The previous call's sequences to reuse (none when the weights changed since), an empty store for this
        call's."""
        previous, version = self._stores[1], weights_version(self.model)
        if previous.version != version:
            previous = PrefixStore()
        self._stores = (previous, PrefixStore(version=version))

    def _end_prefix_store(self) -> None:
        """Keep this call's sequences for the next call when they fit :data:`PREFIX_STORE_BYTES`."""
        current = self._stores[1]
        self._stores = (PrefixStore(), current if current.nbytes <= PREFIX_STORE_BYTES else PrefixStore())

    @torch.no_grad()
    def _generate_batch_kv(self, prompts: list[list[int]], max_new_tokens: int, detector: StopDetector,
                           temperature: float, top_p: float, greedy: bool) -> list[GenerationOutput]:
        """:meth:`_generate_batch` with :class:`KVDecoder`: prefill (reusing cached prefixes), then one token per
        step for every cache row, the running ones sampled; the cache is compacted to the running rows once a
        quarter of its rows have finished."""
        decoder, (previous, current) = self.kv_decoder, self._stores
        cache = decoder.new_cache(len(prompts), max(len(p) for p in prompts) + max_new_tokens)
        logits = self._prefill_kv(cache, prompts, previous)
        record = _DecodeRecord.empty(len(prompts))
        where: list[tuple[KVCache, int]] = [(cache, b) for b in range(len(prompts))]  # each sequence's cache row
        running = torch.arange(len(prompts), device=logits.device)  # cache row of each running sequence
        rng = self._rng()
        for step in range(max_new_tokens):
            tokens, logps = sample_next_token(
                logits[running], temperature=temperature, top_p=top_p, greedy=greedy, generator=rng
            )
            keep = record.add(tokens.tolist(), logps.tolist(), detector)
            if not keep or step == max_new_tokens - 1:
                break
            record.alive = [record.alive[j] for j in keep]
            running, tokens = running[keep], tokens[keep]
            if 4 * len(keep) <= 3 * cache.length.shape[0]:  # compact: a new cache of the running rows
                cache = cache.select(running)
                running = torch.arange(len(keep), device=logits.device)
                for j, b in enumerate(record.alive):
                    where[b] = (cache, j)
            feed = torch.full_like(cache.length, self.pad_id)
            feed[running] = tokens
            logits = decoder.decode(cache, feed)
        for b, (prompt, out) in enumerate(zip(prompts, record.tokens)):
            current.add(prompt + out[:-1], *where[b])
        current.nbytes += sum({id(c): c.nbytes for c, _ in where}.values())
        return record.outputs()

    def _prefill_kv(self, cache: KVCache, prompts: list[list[int]], previous: PrefixStore) -> torch.Tensor:
        """Prompt b into cache row b: copied from an identical earlier prompt of the batch, or its tokens after the
        longest prefix ``previous`` holds (copied from there) prefilled. Returns the next logits ``[B, V]``."""
        first: dict[tuple[int, ...], int] = {}
        rows, new_tokens, copies = [], [], []
        for b, prompt in enumerate(prompts):
            key = tuple(prompt)
            if key in first:
                copies.append((b, first[key]))
                continue
            first[key] = b
            hit = previous.longest_prefix(prompt)
            n = 0
            if hit is not None:
                n, source, source_row = hit
                cache.copy_row(b, source, source_row, n)
            rows.append(b)
            new_tokens.append(prompt[n:])
        fresh = self.kv_decoder.prefill(cache, rows, new_tokens)
        logits = fresh.new_empty((len(prompts), fresh.shape[1]))
        logits[rows] = fresh
        for b, source in copies:
            cache.copy_row(b, cache, source, len(prompts[b]))
            logits[b] = logits[source]
        return logits

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
