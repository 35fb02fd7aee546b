"""Rollouts beside the update (trainer.staleness = k >= 1, trainer.placement.kind = split): the staleness window and
its bound (window.py), the learner's side of the pipeline (rollouts.py), the published weights (weights.py), the
rollout worker process (worker.py), the weights' stream of a split GPU launch (broadcast.py); where each side runs
is searchr1_lld/placement.py's. With k = 0 none of it is built: the trainer runs the synchronous step
(learner/step.py) as it always has."""

from __future__ import annotations

from typing import Any, Callable

import torch

from searchr1_lld.placement import thread_split
from searchr1_lld.learner.pipeline.rollouts import RolloutPipeline
from searchr1_lld.learner.pipeline.weights import SharedWeights
from searchr1_lld.learner.pipeline.worker import WorkerProcess
from searchr1_lld.learner.state import Learner


def process_pipeline(learner: Learner, *, start: int, draw_rows: Callable[[], list[dict[str, Any]]],
                     sampler_state: Callable[[], dict[str, Any]], seed_of: Callable[[int], int]) -> RolloutPipeline:
    """The CPU split placement of ``learner``'s run, started at step ``start``: one worker process (spawned) with
    its share of the torch threads (searchr1_lld.placement.thread_split; the learner keeps the rest until the
    pipeline closes), the learner's weights published to it as version ``start``, the first trainer.staleness steps
    requested."""
    cfg = learner.cfg
    ctx = torch.multiprocessing.get_context("spawn")
    threads = thread_split(torch.get_num_threads(), cfg.trainer.placement.rollout_threads)
    weights = SharedWeights(learner.engine.named_weights(learner.module), ctx)
    pipeline = RolloutPipeline(cfg.trainer.staleness, WorkerProcess(cfg, weights, ctx, threads), weights,
                               start=start, draw_rows=draw_rows, sampler_state=sampler_state, seed_of=seed_of,
                               max_restarts=cfg.trainer.placement.max_restarts)
    pipeline.start(learner.engine.named_weights(learner.module), version=start)
    return pipeline
