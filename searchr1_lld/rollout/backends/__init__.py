"""Generation backends behind one contract (base.py): transformers (hf.py), vLLM (vllm.py), each a kind of kinds.py.

:func:`make_backend` is the one factory: the trainer (on the learner's module), the evaluator and the lab (a model
loaded from a directory or an in-memory policy) all build their engine through it.
"""

from __future__ import annotations

from typing import Optional

import torch

from searchr1_lld.config import RolloutConfig
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.backends.base import BackendBase, GenerationBackend, GenerationOutput, StopDetector
from searchr1_lld.rollout.backends.kinds import BACKEND_KINDS, BackendKind, backend_kind

__all__ = ["BACKEND_KINDS", "BackendBase", "BackendKind", "GenerationBackend", "GenerationOutput", "StopDetector",
           "backend_kind", "make_backend"]


def make_backend(cfg: RolloutConfig, *, model: Optional[torch.nn.Module] = None, tokenizer: Optional[Tokenizer] = None,
                 model_path: str = "", seed: Optional[int] = None, dtype: str = "auto", tokenizer_path: str = "",
                 shares_learner_weights: bool = False, device: str = "auto",
                 parameter_names: Optional[set[str]] = None) -> GenerationBackend:
    """Build the backend of the kind ``cfg.backend`` names (a RolloutConfig; ``cfg.generation_batch_size`` sequences
    per call).

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
    return backend_kind(cfg).build(cfg, model=model, tokenizer=tokenizer, model_path=model_path, seed=seed, dtype=dtype,
                                   tokenizer_path=tokenizer_path, shares_learner_weights=shares_learner_weights,
                                   device=device, parameter_names=parameter_names)
