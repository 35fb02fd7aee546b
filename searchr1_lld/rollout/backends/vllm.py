"""vLLM generation backend, colocated with the learner on the same GPU(s). A thin adapter; vllm imported lazily.

- Engine: ``vllm.LLM`` with ``gpu_memory_utilization`` and sleep mode: the trainer calls :meth:`sleep` after the
  rollout (weights offloaded, KV cache freed for the update) and :meth:`wake_up` before the next one.
- Sampling: ``SamplingParams`` with the stop strings kept in the output (``include_stop_str_in_output``), special
  tokens kept in the detokenised text (the tags may be added tokens, stop strings must see them), and ``logprobs=0``
  (the sampled token's log-prob). With ``rollout.vllm_logprobs_mode=processed_logprobs`` (vLLM >= 0.10.2) they are
  log_softmax(logits / temperature), the convention of backends/base.py (top-p < 1 additionally renormalises over the
  nucleus in vLLM); with raw log-probs they match it only at temperature 1.
- Weight sync: in process, through the model's own ``load_weights(iterable of (name, tensor))`` (the documented path
  vLLM's RLHF examples use), then the prefix cache is reset so no KV computed with old weights is reused. Nothing is
  saved to disk. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine in this process so tensors are not pickled.

The pure pieces (:func:`build_llm_kwargs`, :func:`build_sampling_kwargs`, :func:`convert_completion`) are unit-tested
with fake objects; the engine itself needs a GPU and vllm.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput


def build_llm_kwargs(model_path: str, cfg: RolloutConfig, *, tokenizer_path: str = "", seed: Optional[int] = None,
                     dtype: str = "auto") -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` from the rollout config."""
    if not model_path:
        raise ValueError("vLLM needs a model path (local HF dir or hub id)")
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=tokenizer_path or model_path,
        dtype=dtype,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        enable_sleep_mode=cfg.vllm_enable_sleep_mode,
        enable_prefix_caching=cfg.vllm_enable_prefix_caching,
        enforce_eager=cfg.vllm_enforce_eager,
        max_model_len=cfg.max_total_length,
        seed=0 if seed is None else int(seed),
    )
    if cfg.vllm_logprobs_mode:
        kwargs["logprobs_mode"] = cfg.vllm_logprobs_mode
    return kwargs


def build_sampling_kwargs(*, max_new_tokens: int, stop_strings: list[str], temperature: float, top_p: float,
                          greedy: bool, n: int = 1) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (greedy = temperature 0, top-p 1)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return dict(
        n=n,
        temperature=0.0 if greedy else float(temperature),
        top_p=1.0 if greedy else float(top_p),
        max_tokens=int(max_new_tokens),
        stop=list(stop_strings),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        logprobs=0,  # the sampled token's log-prob only
        detokenize=True,  # stop strings are matched on text
    )


def convert_completion(completion: Any) -> GenerationOutput:
    """One vLLM ``CompletionOutput`` (``token_ids``, ``logprobs``, ``finish_reason``) -> :class:`GenerationOutput`.

    ``completion.logprobs[k]`` maps token id -> object with ``.logprob`` (or a float); the sampled token must be in it.
    """
    token_ids = [int(t) for t in completion.token_ids]
    logprobs: Optional[list[float]] = None
    if getattr(completion, "logprobs", None) is not None:
        logprobs = []
        for k, tok in enumerate(token_ids):
            entry = completion.logprobs[k]
            if tok not in entry:
                raise RuntimeError(f"vLLM returned no log-prob for the sampled token {tok} at position {k}")
            value = entry[tok]
            logprobs.append(float(getattr(value, "logprob", value)))
    reason = completion.finish_reason
    if reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request finished with {reason!r} (expected 'stop' or 'length')")
    return GenerationOutput(token_ids, logprobs, reason)


def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the learner's weights with HF names (what vLLM's ``load_weights`` expects)."""
    module = getattr(model, "module", model)
    for name, tensor in module.state_dict().items():
        yield name, tensor.detach()


class VLLMBackend(BackendBase):
    def __init__(self, model_path: str, tokenizer: Any, cfg: RolloutConfig, *, seed: Optional[int] = None,
                 dtype: str = "auto", tokenizer_path: str = "", llm: Any = None) -> None:
        """``llm`` injects a ready engine (tests); otherwise ``vllm.LLM(**build_llm_kwargs(...))`` is created."""
        self.tokenizer = tokenizer
        self.cfg = cfg
        self._asleep = False
        if llm is None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            try:
                from vllm import LLM
            except ImportError as err:  # pragma: no cover - depends on the machine
                raise ImportError("rollout.backend=vllm needs vllm (pip install 'searchr1-lld[gpu]')") from err
            llm = LLM(**build_llm_kwargs(model_path, cfg, tokenizer_path=tokenizer_path, seed=seed, dtype=dtype))
        self.llm = llm

    def _sampling_params(self, **kwargs: Any) -> Any:
        from vllm import SamplingParams

        return SamplingParams(**build_sampling_kwargs(**kwargs))

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, stop_strings: list[str], temperature: float,
                 top_p: float, greedy: bool) -> list[GenerationOutput]:
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy)
        if self._asleep:
            self.wake_up()
        params = self._sampling_params(max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                                       temperature=temperature, top_p=top_p, greedy=greedy)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        if len(results) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(results)} results for {len(prompts)} prompts")
        return [convert_completion(r.outputs[0]) for r in results]

    # ------------------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        if self.cfg.vllm_enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Learner -> engine in process via the engine model's ``load_weights``; resets the prefix cache."""
        if self._asleep:
            try:
                self.llm.wake_up(tags=["weights"])  # weights first: the KV cache is not needed to load them
            except TypeError:  # older vLLM: no tags
                self.llm.wake_up()
                self._asleep = False
        weights = list(named_weights(model))
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda engine_model: engine_model.load_weights(weights))
        else:
            engine_model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
            engine_model.load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
