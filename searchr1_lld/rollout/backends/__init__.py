"""Generation backends behind one contract (base.py): transformers (hf.py), vLLM (vllm.py), scripted (tests).

:func:`make_backend` is the one factory: the trainer (on the learner's module), the evaluator and the lab (a model
loaded from a directory or an in-memory policy) all build their engine through it.
"""

from __future__ import annotations

from typing import Optional

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.distributed import explicit_device
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationBackend, GenerationOutput, StopDetector
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.rollout.backends.vllm import VLLMBackend

__all__ = ["BackendBase", "GenerationBackend", "GenerationOutput", "StopDetector", "make_backend"]


def make_backend(cfg: RolloutConfig, *, model: Optional[torch.nn.Module] = None, tokenizer: Optional[Tokenizer] = None,
                 model_path: str = "", seed: Optional[int] = None, dtype: str = "auto", tokenizer_path: str = "",
                 shares_learner_weights: bool = False, device: str = "auto",
                 parameter_names: Optional[set[str]] = None) -> GenerationBackend:
    """Build the backend named by ``cfg.backend`` (a RolloutConfig; ``cfg.generation_batch_size`` sequences per call).

    "hf": generation with ``model``, or with the model loaded from ``model_path`` (in eval mode, ``dtype``: auto =
    bf16 on GPU, fp32 on CPU; ``device`` auto = this thread's current GPU as cuda:<index> if there is one, or a
    device such as cuda:1);
    ``shares_learner_weights``: it is the learner's own module, so weight loads are no-ops. "vllm": one engine on
    this rank's GPU loaded from ``model_path`` (rank / world size from the launcher's environment);
    ``parameter_names``: the learner's parameter names, every one of which each weight load must deliver (default:
    those of the model in ``model_path``).
    """
    if tokenizer is None:
        raise ValueError("make_backend needs the tokenizer")
    if cfg.backend == "hf":
        if model is None:
            if not model_path:
                raise ValueError("rollout.backend=hf needs the model or model_path")
            model = _load_hf_model(str(model_path), dtype, device)
        return HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed,
                         shares_learner_weights=shares_learner_weights)
    if cfg.backend == "vllm":
        if not model_path:
            raise ValueError("rollout.backend=vllm needs model_path (a local HF model dir or hub id)")
        return VLLMBackend(str(model_path), tokenizer, cfg, seed=seed, dtype=dtype, tokenizer_path=str(tokenizer_path),
                           parameter_names=parameter_names)
    raise ValueError(f"unknown rollout.backend {cfg.backend!r}; expected 'hf' or 'vllm'")


def _load_hf_model(model_path: str, dtype: str, device: str) -> torch.nn.Module:
    """The causal LM in ``model_path`` in eval mode on ``device`` (auto: the current GPU if any), in ``dtype`` (auto:
    bf16 on GPU, fp32 on CPU)."""
    from transformers import AutoModelForCausalLM

    device = explicit_device(device)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device).eval()
