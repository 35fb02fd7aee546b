"""Where the two sides of a split placement run (trainer.placement, trainer.staleness >= 1); the learner's pipeline
(learner/pipeline) and the preflight's memory plan (preflight/run.py) both read it.

CPU: one rollout worker process beside the learner's, the machine's torch threads split between them
(:func:`thread_split`).

GPU (written for an 8-GPU launch, configs/accelerate/split_2rollout_6learner.yaml): the launch's ranks split into
learner ranks (DeepSpeed, the first ``world - rollout_gpus``) and rollout ranks (one vLLM engine each, the last
``rollout_gpus``), :func:`rank_plan`; the weights go from the first learner rank to every rollout rank over one
process group that spans it and them (learner/pipeline/broadcast.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch

from searchr1_lld.config import Config, ConfigError, RolloutConfig


def thread_split(total: int, rollout_threads: int) -> tuple[int, int]:
    """(learner threads, rollout threads) of ``total``: ``rollout_threads`` (0 = half, rounded down) for the worker,
    the rest for the learner, at least one each."""
    total = max(int(total), 2)
    rollout = rollout_threads or total // 2
    rollout = min(max(rollout, 1), total - 1)
    return total - rollout, rollout


def learner_engine_config(cfg: Config) -> RolloutConfig:
    """The rollout settings of the learner's own engine. Synchronous (trainer.staleness = 0): the run's. Split
    (staleness >= 1): the rollout worker generates every training batch, so the learner's engine serves only its
    evaluations and the probe set: the transformers backend on the learner's own module, turn by turn (no second copy
    of the policy, and with rollout.backend=vllm no second vLLM engine beside the worker's)."""
    if cfg.trainer.staleness == 0:
        return cfg.rollout
    return dataclasses.replace(cfg.rollout, backend="hf", scheduler="turns")


def set_torch_threads(threads: int) -> int:
    """``torch.set_num_threads(threads)``, then the number torch actually uses, with a warning where it is another:
    vLLM's CPU worker, once built in a process, replaces ``torch.set_num_threads`` with a function that does nothing,
    so a split asked for in that process would silently not happen."""
    torch.set_num_threads(threads)
    used = torch.get_num_threads()
    if used != threads:
        warnings.warn(f"asked torch for {threads} threads, it uses {used}: torch.set_num_threads is "
                      f"{getattr(torch.set_num_threads, '__qualname__', torch.set_num_threads)!r} in this process "
                      "(vLLM's CPU engine replaces it with a no-op once built in a process); the thread split "
                      "does not apply here", RuntimeWarning, stacklevel=2)
    return used


@dataclass(frozen=True)
class RankPlan:
    """The roles of a split GPU launch's ranks."""

    world_size: int
    learner_ranks: tuple[int, ...]  # DeepSpeed; the first of them is the run's main process and the weights' source
    rollout_ranks: tuple[int, ...]  # one vLLM engine each

    def role(self, rank: int) -> str:
        """'learner' or 'rollout'."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        return "rollout" if rank in self.rollout_ranks else "learner"

    @property
    def source(self) -> int:
        """The rank that broadcasts the weights: the first learner rank."""
        return self.learner_ranks[0]

    @property
    def broadcast_ranks(self) -> tuple[int, ...]:
        """The ranks of the weights' process group: the source and every rollout rank."""
        return (self.source, *self.rollout_ranks)


def rank_plan(world_size: int, rollout_gpus: int) -> RankPlan:
    """The learner ranks ``0 .. world - rollout_gpus - 1`` and the rollout ranks after them; a ConfigError unless both
    sides get at least one GPU."""
    if not 1 <= rollout_gpus < world_size:
        raise ConfigError(f"trainer.placement.rollout_gpus: a split GPU launch needs at least one rollout and one "
                          f"learner GPU: must be in [1, {world_size - 1}] for {world_size} GPUs (got {rollout_gpus})")
    learners = world_size - rollout_gpus
    return RankPlan(world_size, tuple(range(learners)), tuple(range(learners, world_size)))


def check_split_launch(cfg: Config, world_size: int, on_gpu: bool) -> RankPlan | None:
    """The rank plan of a split launch on GPUs (None on CPU, where the worker is a process of the learner's own); a
    ConfigError when the launch cannot hold it: ranks for both sides, the learner's batch divisible over its ranks."""
    if cfg.trainer.placement.kind != "split" or not on_gpu:
        return None
    plan = rank_plan(world_size, cfg.trainer.placement.rollout_gpus)
    learners, tc = len(plan.learner_ranks), cfg.trainer
    if tc.train_batch_size % learners or tc.ppo_mini_batch_size % learners:
        raise ConfigError(f"trainer.placement.rollout_gpus={cfg.trainer.placement.rollout_gpus} leaves {learners} "
                          f"learner ranks: trainer.train_batch_size ({tc.train_batch_size}) and "
                          f"trainer.ppo_mini_batch_size ({tc.ppo_mini_batch_size}) must divide over them")
    return plan
