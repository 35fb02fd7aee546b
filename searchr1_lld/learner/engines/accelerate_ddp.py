"""The plain training engine: one process, or DDP through accelerate (``accelerator.prepare`` wraps the model).
Gradients are all-reduced on the mini-batch's last micro-batch (``no_sync`` before it), clipped by accelerate, and
the optimiser steps only when the global norm is finite on every rank. Checkpoints hold ``policy/`` (an HF model
directory) and ``optimizer.pt`` (bookkeeping/checkpoint.py)."""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from searchr1_lld.bookkeeping import checkpoint
from searchr1_lld.distributed import any_rank
from searchr1_lld.learner.engines.base import TrainingEngine
from searchr1_lld.protocols import Tokenizer


class AccelerateEngine(TrainingEngine):
    """Plain accelerate: a single process or DDP (module docstring)."""

    name = "accelerate"

    def reference_copy(self, policy: torch.nn.Module, load: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        return copy.deepcopy(policy)

    def place_reference(self, ref: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        return ref.to(dtype=dtype).to(self.accelerator.device)

    def no_sync(self, model: Any, last: bool) -> ContextManager:
        if self.accelerator.num_processes > 1 and not last:
            return self.accelerator.no_sync(model)
        return contextlib.nullcontext()

    def backward(self, model: Any, loss: torch.Tensor, last: bool) -> None:
        self.accelerator.backward(loss)

    def optimizer_step(self, model: Any, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        gn = float(self.accelerator.clip_grad_norm_(model.parameters(), grad_clip))  # global norm before clipping
        if any_rank(self.accelerator, not math.isfinite(gn)):
            optimizer.zero_grad(set_to_none=True)
            return gn if not math.isfinite(gn) else float("nan"), False
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return gn, True

    def save_state(self, directory: Path, step: int, model: Any, optimizer: torch.optim.Optimizer,
                   tokenizer: Tokenizer | None, save_policy: bool) -> None:
        if self.accelerator.is_main_process:
            checkpoint.save_model_state(directory, self.accelerator.unwrap_model(model), optimizer, tokenizer,
                                        save_policy)

    def load_state(self, directory: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
        checkpoint.load_model_state(directory, self.accelerator.unwrap_model(model), optimizer)
