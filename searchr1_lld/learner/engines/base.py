"""The training engine: how the learner's model is distributed and stepped, chosen once when the learner is built.

A kind owns everything that differs between ways of running the learner (plain accelerate / DDP, DeepSpeed ZeRO-0..3;
FSDP2 would be one more kind): the set-up before ``accelerator.prepare``, the frozen reference's copy and placement,
models that must stay whole (the retriever's encoder, the rollout engine's own copy), backward and the gradient
accumulation boundary, the gradient norm and the guarded optimiser step, the weights handed to the rollout engine,
the model and optimiser state of a checkpoint, and the end of the run. Nothing outside ``learner/engines`` asks which
kind runs.

    engine = training_engine(accelerator)                    # learner/engines/__init__.py: resolved once
    engine.configure(trainer_cfg); model, opt = accelerator.prepare(model, opt)
    with engine.no_sync(model, last): engine.backward(model, loss, last)
    norm, applied = engine.optimizer_step(model, opt, grad_clip)
    backend.load_weights(engine.named_weights(module))
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch

from searchr1_lld.config import TrainerConfig
from searchr1_lld.protocols import Accelerator, Tokenizer


class TrainingEngine:
    """The interface every kind implements (the defaults are the plain single-process / DDP behaviour where one
    exists). ``accelerator``: the run's accelerate object, which every kind drives."""

    name = "base"
    partitions_parameters = False  # a rank holds only a shard of every parameter (ZeRO-3, FSDP)

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator

    # ---------------------------------------------------------------- set-up
    def configure(self, trainer_cfg: TrainerConfig) -> None:
        """Before ``accelerator.prepare``: the kind's own settings from the trainer config (clipping, accumulation)."""

    def reference_copy(self, policy: torch.nn.Module, load: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """A copy of the initial ``policy`` for the frozen reference (``load`` loads it again from its files)."""
        raise NotImplementedError

    def place_reference(self, ref: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        """The frozen reference in the policy's ``dtype``, placed where the kind runs it."""
        raise NotImplementedError

    def outside_partitioning(self) -> ContextManager:
        """Models built inside stay whole on every rank (an encoder, a generation copy); a no-op where nothing is
        partitioned."""
        return contextlib.nullcontext()

    # ---------------------------------------------------------------- the update
    def no_sync(self, model: Any, last: bool) -> ContextManager:
        """No gradient reduction on a micro-batch that is not the mini-batch's last (``last``)."""
        raise NotImplementedError

    def backward(self, model: Any, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch; ``last``: the mini-batch's accumulation boundary."""
        raise NotImplementedError

    def optimizer_step(self, model: Any, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        """One optimiser step on the accumulated mini-batch gradient, its global norm (before clipping) checked on
        every rank first: non-finite on any rank, the update is skipped on all (gradients discarded). Returns (norm,
        applied)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- weights, checkpoints, the end
    def named_weights(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter of the unwrapped ``module``, for the rollout engine."""
        return ((name, p.detach()) for name, p in module.named_parameters())

    def save_state(self, directory: Path, step: int, model: Any, optimizer: torch.optim.Optimizer,
                   tokenizer: Tokenizer | None, save_policy: bool) -> None:
        """Write the model's and the optimiser's state into a checkpoint's ``directory`` (every rank calls it)."""
        raise NotImplementedError

    def load_state(self, directory: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
        """Restore what :meth:`save_state` wrote."""
        raise NotImplementedError

    def close(self, *models: Any) -> None:
        """Release what the kind holds for ``models`` at the end of the run (before the process group goes)."""
