"""Optimiser glue of the learner: AdamW + the LR schedule, backward per micro-batch, and one optimiser step per
mini-batch with the global gradient norm checked on every rank before it is applied (DDP / DeepSpeed ZeRO-0..3)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from searchr1_lld.config import TrainerConfig
from searchr1_lld.distributed import DistributedFacts, any_rank
from searchr1_lld.learner.step_size import StepSizeController
from searchr1_lld.protocols import Accelerator


def lr_factor(step: int, total_steps: int, warmup_ratio: float, schedule: str) -> float:
    """LR multiplier at scheduler step ``step`` (0-based). The trainer steps it once per applied optimiser step and
    passes the run's total optimiser steps as ``total_steps`` (verl's warm-up ratio is a fraction of those).

    warmup_steps W = int(warmup_ratio * total_steps);  s < W: (s + 1) / W  (linear warm-up, never 0)
    afterwards constant: 1;  cosine: 0.5 * (1 + cos(pi * (s - W) / max(1, total_steps - W)))
    """
    warm = int(warmup_ratio * total_steps)
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def make_optimizer(model: torch.nn.Module, tc: TrainerConfig, total_updates: int,
                   step_size: StepSizeController) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over ``model`` (trainer config ``tc``) and its LR scheduler: one scheduler step per applied optimiser
    step; warm-up = warmup_ratio of all ``total_updates`` optimiser steps (as verl); every rate scaled by the
    trust-region controller's multiplier (``step_size``; 1 when it is off)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_updates, tc.warmup_ratio, tc.lr_schedule) * step_size.multiplier)
    return optimizer, scheduler


def refresh_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set the optimiser's current rates to the schedule's value at its current step, after a factor of the schedule
    (the trust-region multiplier) changed between two of its steps."""
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


def sync_context(accelerator: Accelerator, dist: DistributedFacts, model: torch.nn.Module,
                 last: bool) -> contextlib.AbstractContextManager:
    """No gradient all-reduce on non-final micro-batches (DDP); DeepSpeed: the engine's boundary flag."""
    if dist.world_size > 1 and not last and not dist.deepspeed:
        return accelerator.no_sync(model)
    return contextlib.nullcontext()


def backward(accelerator: Accelerator, dist: DistributedFacts, model: Any, loss: torch.Tensor, last: bool) -> None:
    """DeepSpeed: drive the engine directly -- boundary flag per micro-batch, engine.backward (gradient reduction at
    the boundary); its step is taken by :func:`optimizer_step`, once per mini-batch. Else accelerate."""
    if dist.deepspeed:
        model.set_gradient_accumulation_boundary(last)
        model.backward(loss)
    else:
        accelerator.backward(loss)


def deepspeed_grad_norm(stage: int, engine: Any) -> float:
    """Global (all ranks) L2 norm of the mini-batch gradient held by the DeepSpeed engine of ZeRO ``stage``, before
    its step."""
    opt = engine.optimizer
    if stage in (1, 2) and hasattr(opt, "scaled_global_norm"):
        return float(opt.scaled_global_norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
    if stage == 3 and hasattr(opt, "_get_norm_groups"):
        norms = torch.stack([torch.as_tensor(n, dtype=torch.float32).reshape(()) for n in opt._get_norm_groups()])
        if (~torch.isfinite(norms) | (norms < 0)).any():  # DeepSpeed marks a non-finite group norm with -1
            return float("inf")
        return float(norms.norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
    if stage == 0:  # gradients are all-reduced at the boundary backward: the local norm is the global norm
        grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0
    import deepspeed

    raise RuntimeError(f"DeepSpeed {deepspeed.__version__} ZeRO-{stage}: no gradient-norm method found on "
                       f"{type(opt).__name__}; this trainer supports the DeepSpeed range in pyproject.toml")


def optimizer_step(accelerator: Accelerator, dist: DistributedFacts, model: Any, optimizer: torch.optim.Optimizer,
                   grad_clip: float) -> tuple[float, bool]:
    """One optimiser step on the accumulated mini-batch gradient. The global grad norm (before clipping) is checked
    on every rank *before* the step; non-finite on any rank: the update is skipped on all ranks (gradients
    discarded, no optimiser / scheduler step). Returns (norm, applied)."""
    if dist.deepspeed:
        engine = model
        gn = deepspeed_grad_norm(dist.zero_stage, engine)
        if not any_rank(accelerator, not math.isfinite(gn)):
            engine.step()  # clips to gradient_clipping and applies the update
            return gn, True
        if dist.zero_stage == 0:
            engine.zero_grad()
            return gn if not math.isfinite(gn) else float("nan"), False
        # ZeRO 1-3: the engine's own step discards a non-finite gradient on every rank (its overflow path clears
        # the partitioned gradients); verify it did, so a non-finite update is never applied silently
        engine.step()
        if getattr(engine.optimizer, "overflow", False) is not True:
            raise RuntimeError("non-finite gradient norm, but the DeepSpeed engine applied the step")
        return gn if not math.isfinite(gn) else float("nan"), False
    gn = float(accelerator.clip_grad_norm_(model.parameters(), grad_clip))  # total norm before clipping (global)
    if any_rank(accelerator, not math.isfinite(gn)):
        optimizer.zero_grad(set_to_none=True)
        return gn if not math.isfinite(gn) else float("nan"), False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return gn, True
