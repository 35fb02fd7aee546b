"""The learner's optimiser: AdamW and its LR schedule (warm-up, constant or cosine, times the trust-region multiplier).
Backward and the guarded optimiser step are the training engine's (learner/engines)."""

from __future__ import annotations

import math

import torch

from searchr1_lld.config import TrainerConfig
from searchr1_lld.learner.step_size import StepSizeController


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
