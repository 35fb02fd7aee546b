"""vLLM generation backend: one engine per training rank, colocated on that rank's GPU. vllm is imported lazily.

Pinned release: the ``gpu`` extra of pyproject.toml (``VLLM_PIN`` below); ``tests/test_vllm_contract.py`` reads that
release's wheel and checks every call this module makes against it (the calls are declared in ``VLLM_API`` and
parsed out of this file's own source, so the check cannot drift from the code).

- Engine per rank (vLLM's "external launcher" mode for RL trainers started by torchrun / accelerate): every process
  builds ``vllm.LLM(distributed_executor_backend="external_launcher", tensor_parallel_size=1,
  seed=base_seed + rank)`` on its own GPU and generates for its own prompts. vLLM reads RANK / LOCAL_RANK /
  WORLD_SIZE / MASTER_ADDR / MASTER_PORT (set by the launcher; defaulted here for a single process) and joins the
  launcher's process group. The ranks are vLLM's "external" data-parallel dimension (vllm/distributed/
  parallel_state.py: "every dp rank can generate independently"); ``data_parallel_size`` is deliberately NOT
  passed: vLLM's own DP makes every forward step a collective over the DP group, so all ranks would have to call
  ``generate`` the same number of times, and the multi-turn agent loop does not (a rank whose trajectories have
  all answered stops calling): it would deadlock. Tensor parallel has the same lockstep requirement within a TP
  group, so ``rollout.vllm_tensor_parallel_size`` must be 1 (the 3B and 7B engines fit one GPU: docs/memory.md).
- Memory: with ``rollout.vllm_enable_sleep_mode`` the engine is built with ``enable_sleep_mode=True`` and
  :meth:`sleep` calls ``LLM.sleep(level=rollout.vllm_sleep_level)`` (1: weights to CPU, KV cache freed; 2: both
  freed, vLLM keeps its buffers; the right choice here since every update streams the weights back anyway). Without
  it ``sleep``/``wake_up`` only flip the state and the engine keeps ``vllm_gpu_memory_utilization`` of the GPU.
- Weights: :meth:`load_weights` wakes the weight memory only (``wake_up(tags=["weights"])``), passes the
  ``(name, tensor)`` iterator to the engine model's own ``load_weights`` through ``LLM.apply_model`` (in process:
  the external-launcher executor runs the function on this process's worker, nothing is pickled or written to
  disk), then resets the prefix cache so no KV computed with old weights is reused; :meth:`wake_up` then
  allocates the KV cache (``wake_up(tags=["kv_cache"])``). vLLM's ``load_weights`` maps the learner's HF
  names onto its own (packed q/k/v, gate/up) layers; with tied embeddings its lm_head is the embedding.
- Sampling: ``SamplingParams`` with the stop strings kept in the output, special tokens kept in the text (the tags
  may be added tokens), ``logprobs=0`` (the sampled token's log-prob). ``logprobs_mode="processed_logprobs"``
  gives log_softmax(logits / temperature), the convention of backends/base.py (with top-p < 1 vLLM renormalises
  over the nucleus; the learner does not, which is one source of the train/inference gap that
  ``algorithm.rollout_correction`` corrects).

The pure pieces (:func:`build_llm_kwargs`, :func:`build_sampling_kwargs`, :func:`convert_completion`) are
unit-tested with fake objects; the engine itself needs a GPU and vllm.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput

VLLM_PIN = "0.33.0"  # the release the contract test checks; pyproject's gpu extra allows >=0.33.0,<0.34

# Every keyword this module passes to a vllm constructor. The builders below refuse to emit anything else, and the
# contract test checks each name against the pinned release (LLM.__init__ forwards unknown keywords to EngineArgs).
VLLM_API: dict[str, tuple[str, ...]] = {
    "LLM": (
        "model", "tokenizer", "dtype", "seed", "gpu_memory_utilization", "tensor_parallel_size",
        "distributed_executor_backend", "enable_sleep_mode", "enable_prefix_caching",
        "enforce_eager", "max_model_len", "logprobs_mode",
    ),
    "SamplingParams": (
        "n", "temperature", "top_p", "max_tokens", "stop", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "logprobs", "detokenize",
    ),
}
# LLM methods are not listed: the contract test parses every ``self.llm.<method>(...)`` call out of this file.


def _declared(kind: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(VLLM_API[kind]))
    if unknown:
        raise RuntimeError(f"{kind} keywords {unknown} are not declared in VLLM_API (declare them so the contract "
                           "test checks them against the pinned vLLM)")
    return kwargs


def build_llm_kwargs(model_path: str, cfg: RolloutConfig, *, tokenizer_path: str = "", seed: Optional[int] = None,
                     dtype: str = "auto", rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` of training rank ``rank`` out of ``world_size`` (external launcher)."""
    if not model_path:
        raise ValueError("vLLM needs a model path (local HF dir or hub id)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if cfg.vllm_tensor_parallel_size != 1:
        raise ValueError("rollout.vllm_tensor_parallel_size must be 1: the ranks of a TP group would have to call "
                         "generate in lockstep, which the multi-turn agent loop does not do (module docstring)")
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=tokenizer_path or model_path,
        dtype=dtype,
        seed=(0 if seed is None else int(seed)) + rank,  # one seed per engine: ranks sample independently
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        tensor_parallel_size=1,
        distributed_executor_backend="external_launcher",  # one engine in this process, in the launcher's group
        enable_sleep_mode=cfg.vllm_enable_sleep_mode,
        enable_prefix_caching=cfg.vllm_enable_prefix_caching,
        enforce_eager=cfg.vllm_enforce_eager,
        max_model_len=cfg.max_total_length,
    )
    if cfg.vllm_logprobs_mode:
        kwargs["logprobs_mode"] = cfg.vllm_logprobs_mode
    return _declared("LLM", kwargs)


def build_sampling_kwargs(*, max_new_tokens: int, stop_strings: list[str], temperature: float, top_p: float,
                          greedy: bool, n: int = 1) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (greedy = temperature 0, top-p 1)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return _declared("SamplingParams", dict(
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
    ))


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


def set_launcher_env(rank: int, world_size: int) -> None:
    """vLLM's external launcher reads the torchrun variables; a single process without a launcher gets defaults."""
    defaults = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29513"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: weights are not pickled


def release_cached_learner_memory() -> None:
    """Return PyTorch's cached-but-unused blocks (the update's activations) to the driver before the engine maps
    its memory again: vLLM's sleep-mode allocator sits outside PyTorch's cache and cannot reuse them otherwise."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMBackend(BackendBase):
    def __init__(self, model_path: str, tokenizer: Any, cfg: RolloutConfig, *, seed: Optional[int] = None,
                 dtype: str = "auto", tokenizer_path: str = "", rank: Optional[int] = None,
                 world_size: Optional[int] = None, llm: Any = None) -> None:
        """``rank``/``world_size`` default to the launcher's RANK / WORLD_SIZE (0 / 1 without one). ``llm`` injects
        a ready engine (tests); otherwise ``vllm.LLM(**build_llm_kwargs(...))`` is created on this rank's GPU."""
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self._weights_awake = True
        if llm is None:
            set_launcher_env(self.rank, self.world_size)
            try:
                from vllm import LLM
            except ImportError as err:  # pragma: no cover - depends on the machine
                raise ImportError("rollout.backend=vllm needs vllm (pip install 'searchr1-lld[gpu]')") from err
            llm = LLM(**build_llm_kwargs(model_path, cfg, tokenizer_path=tokenizer_path, seed=seed, dtype=dtype,
                                         rank=self.rank, world_size=self.world_size))
        self.llm = llm

    def _sampling_params(self, **kwargs: Any) -> Any:
        from vllm import SamplingParams

        return SamplingParams(**build_sampling_kwargs(**kwargs))

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, stop_strings: list[str], temperature: float,
                 top_p: float, greedy: bool) -> list[GenerationOutput]:
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy)
        self.check_awake()
        params = self._sampling_params(max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                                       temperature=temperature, top_p=top_p, greedy=greedy)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        if len(results) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(results)} results for {len(prompts)} prompts")
        return [convert_completion(r.outputs[0]) for r in results]

    # ------------------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory for the update phase (only with rollout.vllm_enable_sleep_mode)."""
        if self.asleep:
            return
        if self.cfg.vllm_enable_sleep_mode:
            self.llm.sleep(level=self.cfg.vllm_sleep_level)
            self._weights_awake = False
        self.asleep = True

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the learner's weights into the engine model (one tensor at a time), then drop stale prefix KV."""
        if not self._weights_awake:
            release_cached_learner_memory()
            self.llm.wake_up(tags=["weights"])  # weights only: the KV cache is not needed to load them
            self._weights_awake = True
        self.llm.apply_model(lambda engine_model: engine_model.load_weights(named_tensors))
        self.llm.reset_prefix_cache()

    def wake_up(self) -> None:
        """Take the rest of the memory back (KV cache; the weights too if no load_weights came in between)."""
        if not self.asleep:
            return
        if self.cfg.vllm_enable_sleep_mode:
            release_cached_learner_memory()
            if self._weights_awake:
                self.llm.wake_up(tags=["kv_cache"])
            else:
                self.llm.wake_up()
        self._weights_awake = True
        self.asleep = False
