"""The generation backends as kinds: :data:`BACKEND_KINDS` maps each ``rollout.backend`` name to an object that carries
the kind's facts (what it needs to be built, whether it streams requests, its part of the memory plan and of the
preflight) and builds its engine. The name is read once, by :func:`backend_kind`; later code asks the object.

A new backend is its engine's module (the ``GenerationBackend`` contract of base.py) and one entry here.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from searchr1_lld.config import Config, ConfigError, RolloutConfig
from searchr1_lld.config.validation import Check, raise_first
from searchr1_lld.distributed import explicit_device
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.rollout.backends.vllm import VLLMBackend
from searchr1_lld.rollout.backends.vllm_settings import EngineBatch, engine_batch, memory_settings
from searchr1_lld.rollout.continuous import picks_continuous


class BackendKind:
    """What a generation backend must say about itself; one subclass per kind, one instance in BACKEND_KINDS."""

    name: str = ""
    label: str = ""  # its name in the preflight's lines
    streams_requests: bool = False  # a request-level API (add_request / step): the continuous scheduler can drive it
    needs_gpu: bool = False  # its engine runs on a GPU (the preflight plans GPU memory even for trainer.device=auto)
    # it generates on the learner's own module (under ZeRO-3: on a whole copy of it, learner/factories.engine_copy)
    generates_on_learner_module: bool = False
    # one engine serves the checkpoints of one evaluation, each one's weights streamed into it (else a new engine each)
    keeps_engine_across_checkpoints: bool = False

    def build(self, cfg: RolloutConfig, *, model: Optional[torch.nn.Module], tokenizer: Tokenizer, model_path: str,
              seed: Optional[int], dtype: str, tokenizer_path: str, shares_learner_weights: bool, device: str,
              parameter_names: Optional[set[str]], batch: Optional[EngineBatch] = None) -> GenerationBackend:
        """Its engine (``batch``: the batch limits of an engine that schedules requests, vllm_settings.EngineBatch;
        None: its defaults)."""
        raise NotImplementedError

    def for_learner(self, cfg: Config, learner: torch.nn.Module, tokenizer: Tokenizer, model_path: str,
                    engine_module: Optional[torch.nn.Module]) -> GenerationBackend:
        """The rollout engine of a training run, for the learner's (unwrapped) module ``learner``."""
        raise NotImplementedError

    def hf_engine_tokens(self, r: RolloutConfig) -> Optional[int]:
        """The tokens of the engine's KV cache in the memory plan (None: the engine reserves its own fraction)."""
        return None

    def engine_memory(self, cfg: Config, world_size: int) -> Optional[dict[str, Any]]:
        """What the memory plan needs of the engine a training run of ``world_size`` ranks builds
        (vllm_settings.memory_settings: memory_plan.EngineSettings' fields and ``eager``); None: an engine whose
        memory is counted otherwise (hf_engine_tokens)."""
        return None

    def parks_weights(self, r: RolloutConfig) -> bool:
        """Whether the engine parks a copy of the weights in host memory while it sleeps."""
        return False

    def plan_notes(self, r: RolloutConfig) -> list[str]:
        """The preflight's notes on this engine's memory."""
        return []

    def checks(self, r: RolloutConfig) -> list[Check]:
        """The checks of the kind's own settings section (keys relative to ``rollout``), run when the kind is chosen
        (:func:`backend_kind`)."""
        return []


class HFKind(BackendKind):
    name, label = "hf", "HF engine"
    generates_on_learner_module = True

    def build(self, cfg: RolloutConfig, *, model: Optional[torch.nn.Module], tokenizer: Tokenizer, model_path: str,
              seed: Optional[int], dtype: str, tokenizer_path: str, shares_learner_weights: bool, device: str,
              parameter_names: Optional[set[str]], batch: Optional[EngineBatch] = None) -> GenerationBackend:
        """Generation with ``model``, or with the model loaded from ``model_path`` (:func:`load_hf_model`)."""
        if model is None:
            if not model_path:
                raise ValueError("rollout.backend=hf needs the model or model_path")
            model = load_hf_model(str(model_path), dtype, device)
        return HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed,
                         shares_learner_weights=shares_learner_weights)

    def for_learner(self, cfg: Config, learner: torch.nn.Module, tokenizer: Tokenizer, model_path: str,
                    engine_module: Optional[torch.nn.Module]) -> GenerationBackend:
        """Generation on ``engine_module`` when there is one (the ZeRO-3 full copy: every weight sync copies the
        learner's parameters into it), else on the learner's own module (no copy, weight loads are no-ops). seed=None:
        the HF sampler draws from the global RNG, which every step re-seeds (resume stays reproducible)."""
        own = engine_module is None
        return self.build(cfg.rollout, model=learner if own else engine_module, tokenizer=tokenizer, model_path="",
                          seed=None, dtype="auto", tokenizer_path="", shares_learner_weights=own, device="auto",
                          parameter_names=None)

    def hf_engine_tokens(self, r: RolloutConfig) -> Optional[int]:
        return r.generation_batch_size * r.max_total_length


class VLLMKind(BackendKind):
    name, label = "vllm", "vLLM"
    streams_requests = True
    needs_gpu = True
    keeps_engine_across_checkpoints = True

    def build(self, cfg: RolloutConfig, *, model: Optional[torch.nn.Module], tokenizer: Tokenizer, model_path: str,
              seed: Optional[int], dtype: str, tokenizer_path: str, shares_learner_weights: bool, device: str,
              parameter_names: Optional[set[str]], batch: Optional[EngineBatch] = None) -> GenerationBackend:
        """One engine on this rank's GPU loaded from ``model_path`` (rank / world size from the launcher's
        environment), with the batch limits ``batch`` (None: vLLM's defaults)."""
        if not model_path:
            raise ValueError("rollout.backend=vllm needs model_path (a local HF model dir or hub id)")
        return VLLMBackend(str(model_path), tokenizer, cfg, seed=seed, dtype=dtype, tokenizer_path=str(tokenizer_path),
                           parameter_names=parameter_names, batch=batch)

    def for_learner(self, cfg: Config, learner: torch.nn.Module, tokenizer: Tokenizer, model_path: str,
                    engine_module: Optional[torch.nn.Module]) -> GenerationBackend:
        """One engine per rank (GPU) that the trainer streams the weights into after every update, with the batch
        limits of the run (vllm_settings.engine_batch over the launcher's WORLD_SIZE ranks, as the engine reads its
        rank); the names it must receive are the learner's own parameter names."""
        return self.build(cfg.rollout, model=None, tokenizer=tokenizer, model_path=model_path, seed=cfg.trainer.seed,
                          dtype=cfg.model.dtype, shares_learner_weights=False, device="auto",
                          tokenizer_path=getattr(tokenizer, "name_or_path", "") or cfg.model.tokenizer_path,
                          parameter_names={name for name, _ in learner.named_parameters()},
                          batch=engine_batch(cfg, int(os.environ.get("WORLD_SIZE", 1))))

    def engine_memory(self, cfg: Config, world_size: int) -> Optional[dict[str, Any]]:
        return memory_settings(cfg.rollout, engine_batch(cfg, world_size))

    def parks_weights(self, r: RolloutConfig) -> bool:
        return r.vllm.enable_sleep_mode and r.vllm.sleep_level == 1

    def plan_notes(self, r: RolloutConfig) -> list[str]:
        if r.vllm.enable_sleep_mode:
            return []
        return ["plan: rollout.vllm.enable_sleep_mode=false: the engine keeps its reservation through the update"]

    def checks(self, r: RolloutConfig) -> list[Check]:
        """rollout.vllm.*: the engine's memory, sleep and log-prob settings; one engine per rank."""
        v = r.vllm
        return [
            (0 < v.gpu_memory_utilization <= 1, "vllm.gpu_memory_utilization", "must be in (0, 1]"),
            (v.tensor_parallel_size == 1, "vllm.tensor_parallel_size",
             "must be 1: one engine per rank (TP ranks would have to call generate in lockstep, which the multi-turn "
             "agent loop does not; see rollout/backends/vllm.py)"),
            (v.sleep_level in (1, 2), "vllm.sleep_level", "must be 1 or 2"),
            (v.kv_cache_memory_bytes >= 0, "vllm.kv_cache_memory_bytes", "must be >= 0"),
            (v.logprobs_mode in ("", "raw_logprobs", "processed_logprobs"), "vllm.logprobs_mode",
             "must be '', 'raw_logprobs' or 'processed_logprobs'"),
        ]


BACKEND_KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (HFKind(), VLLMKind())}


def backend_kind(r: RolloutConfig) -> BackendKind:
    """The kind ``rollout.backend`` names, checked against the rollout settings it must serve
    (``rollout.scheduler=continuous`` needs a kind that streams requests) and its own section's checks."""
    name = r.backend
    if name not in BACKEND_KINDS:
        raise ConfigError(f"rollout.backend: must be one of {sorted(BACKEND_KINDS)} (got {name!r})")
    kind = BACKEND_KINDS[name]
    try:
        picks_continuous(r.scheduler, kind.streams_requests, f"the {name} engine")
    except ValueError as err:
        raise ConfigError(f"rollout.scheduler: {err} (got {r.scheduler!r})") from None
    raise_first(kind.checks(r), r, prefix="rollout.")
    return kind


def load_hf_model(model_path: str, dtype: str, device: str) -> torch.nn.Module:
    """The causal LM in ``model_path`` in eval mode on ``device`` (auto: the current GPU if any), in ``dtype`` (auto:
    bf16 on GPU, fp32 on CPU)."""
    from transformers import AutoModelForCausalLM

    device = explicit_device(device)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device).eval()
