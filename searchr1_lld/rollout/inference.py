"""A model used for inference inside a block: eval mode (no dropout), no autograd graph, its training flag restored
afterwards, also on error. The rollout engine, the learner's log-prob passes, the evaluator and the warm start share
it."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``with evaluating(model): ...``: ``model`` in eval mode under ``torch.no_grad()`` for the block."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)
