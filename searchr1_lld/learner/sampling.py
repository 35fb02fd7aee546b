"""The step's rollout-to-batch path (learner/step.py): which trajectories make the batch, and the rewards and
baselines the advantage estimator reads. Orchestration only; the rules are the registered functions of
``searchr1_lld.algo`` (batch_filters.py, reward_shaping.py, advantages.py).

- :func:`rollout_step`: n responses per prompt row. With ``algorithm.dynamic_sampling`` (DAPO's dynamic sampling):
  the batch filter drops groups (DAPO: rewards all equal), and further rounds roll out the next prompt rows of the
  trainer's stream (``more_rows``: one batch share per round, as verl generates a whole ``gen_batch`` per round) until
  the step holds its full number of kept groups, at most ``max_rounds`` rounds in all. The batch keeps exactly its
  size: surplus kept groups are cut (the first ones kept stay, as in verl); when the rounds are spent, the first
  dropped groups fill it (they carry no policy-gradient signal), counted and warned about. Every rank runs the same
  number of rounds (:func:`searchr1_lld.distributed.any_rank` after each), so the prompt stream, which every rank
  draws in full, stays the same on all of them, and a collective inside generation (ZeRO-3) pairs up.
- :func:`greedy_baselines`: for an estimator registered with ``needs_baselines`` (remax), one greedy response per
  prompt of the batch through the same agent loop (n = 1, temperature 0, the training rollout's turns and retrieval);
  its EM is the baseline of every response to that prompt.
- :func:`shaped_rewards`: ``algorithm.reward_shaping``'s rule on the EM rewards (DAPO's soft overlong punishment).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from searchr1_lld import distributed
from searchr1_lld.algo.batch_filters import BatchFilterFn, get_batch_filter
from searchr1_lld.algo.reward_shaping import get_reward_shaping
from searchr1_lld.config import Config
from searchr1_lld.learner.state import Learner
from searchr1_lld.rollout.types import Trajectory, TrajectoryBatch

Rows = list[dict[str, Any]]


@dataclass
class GroupSample:
    """What the rounds of dynamic sampling produced on one rank."""

    batch: list[Trajectory]  # the step's batch: as many groups as the first round's rows, group ids 0 .. G-1
    generated: list[Trajectory]  # every response rolled out, all rounds, in order
    rounds: int  # generation rounds run (the same on every rank)
    prompts: int  # prompt groups rolled out
    kept: int  # groups the filter kept (surplus ones included)
    filled: int  # groups of the batch filled from dropped ones (the rounds ran out)


@dataclass
class StepRollout:
    """The step's rollout on one rank."""

    trajectories: list[Trajectory]  # the batch (group ids 0 .. G-1 under dynamic sampling)
    generated: list[Trajectory]  # every response generated for it (the batch's and the dropped and surplus groups')
    metrics: dict[str, float]  # time/rollout_s (all rounds) and, under dynamic sampling, its counts (totals over ranks)


def round_seed(seed: int, round_index: int) -> int:
    """The sampling seed of generation round ``round_index`` of a step seeded ``seed``: ``seed`` itself for the first
    round (the step without dynamic sampling samples the same), a 63-bit hash of both for the others."""
    if round_index == 0:
        return seed
    digest = hashlib.blake2b(f"{int(seed)}:round:{int(round_index)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def split_groups(trajs: list[Trajectory], keep: BatchFilterFn) -> list[tuple[list[Trajectory], bool]]:
    """The groups of one rollout call in order, each with the filter's verdict (kept or not)."""
    flags = keep(torch.tensor([float(t.reward) for t in trajs]), torch.tensor([int(t.group_id) for t in trajs]))
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(int(t.group_id), []).append(i)
    return [([trajs[i] for i in idx], bool(flags[idx[0]])) for idx in groups.values()]


def sample_groups(roll: Callable[[Rows, int], list[Trajectory]], rows: Rows, *, more_rows: Callable[[], Rows],
                  keep: BatchFilterFn, max_rounds: int, any_rank: Callable[[bool], bool]) -> GroupSample:
    """Dynamic sampling (module docstring) on one rank: ``roll(rows, round_index)`` rolls out rows, ``more_rows()``
    gives the next round's rows, ``keep`` is the batch filter, ``any_rank(flag)`` is True on every rank when the flag
    is on any (one collective per round but the last allowed one, on every rank alike). The batch holds len(rows)
    groups: the first kept ones, then the first dropped ones when too few were kept."""
    target = len(rows)
    kept: list[list[Trajectory]] = []
    dropped: list[list[Trajectory]] = []
    generated: list[Trajectory] = []
    rounds = 0
    while True:
        trajs = roll(rows, rounds)
        rounds += 1
        generated.extend(trajs)
        for group, keep_it in split_groups(trajs, keep):
            (kept if keep_it else dropped).append(group)
        if rounds >= max_rounds or not any_rank(len(kept) < target):
            break
        rows = more_rows()
    filled = max(0, target - len(kept))
    groups = kept[:target] + dropped[:filled]
    batch = [dataclasses.replace(t, group_id=g) for g, group in enumerate(groups) for t in group]
    return GroupSample(batch=batch, generated=generated, rounds=rounds, prompts=len(kept) + len(dropped),
                       kept=len(kept), filled=filled)


def rollout_step(learner: Learner, rows: Rows, *, seed: int,
                 more_rows: Optional[Callable[[], Rows]] = None) -> StepRollout:
    """The step's rollout of ``rows`` (this rank's share), seeded ``seed``; under algorithm.dynamic_sampling, the
    rounds of :func:`sample_groups` with ``more_rows`` (the trainer's next batch share per call). Metrics (totals
    over ranks): rollout/dynamic_sampling_rounds, rollout/prompts_generated, rollout/responses_generated,
    rollout/kept_group_frac (kept groups / groups generated), rollout/dynamic_sampling_filled_groups, and
    reward/em_mean_trained (EM over the batch's responses)."""
    ds, t0 = learner.cfg.algorithm.dynamic_sampling, time.time()
    if not ds.enabled:
        trajs = learner.rollout(rows, seed=seed)
        return StepRollout(trajs, trajs, {"time/rollout_s": time.time() - t0})
    if more_rows is None and ds.max_rounds > 1:
        raise ValueError("algorithm.dynamic_sampling needs more prompt rows than the step's: train_step(more_rows=...) "
                         "must give the next rows of the prompt stream (the Trainer passes its sampler's)")
    sample = sample_groups(lambda r, k: learner.rollout(r, seed=round_seed(seed, k)), rows,
                           more_rows=more_rows or (lambda: []), keep=get_batch_filter(ds.filter),
                           max_rounds=ds.max_rounds, any_rank=functools.partial(distributed.any_rank,
                                                                                learner.accelerator))
    prompts, responses, kept, filled = distributed.sum_over_ranks(
        learner.accelerator, [sample.prompts, len(sample.generated), sample.kept, sample.filled])
    if filled and learner.dist.is_main:
        warnings.warn(f"dynamic sampling: {sample.rounds} generation rounds (the most allowed) kept {kept} of "
                      f"{prompts} groups; {filled} groups of the batch were filled from dropped ones (no "
                      "policy-gradient signal)")
    return StepRollout(sample.batch, sample.generated, {
        "time/rollout_s": time.time() - t0, "rollout/dynamic_sampling_rounds": float(sample.rounds),
        "rollout/prompts_generated": float(prompts), "rollout/responses_generated": float(responses),
        "rollout/kept_group_frac": kept / max(prompts, 1), "rollout/dynamic_sampling_filled_groups": float(filled),
        "reward/em_mean_trained": sum(float(t.reward) for t in sample.batch) / len(sample.batch)})


def greedy_baselines(learner: Learner, trajs: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
    """Baselines [B] of the batch ``trajs``: the EM of one greedy rollout (n = 1, the training rollout's settings,
    retrieval included) of each group's prompt, the same for every response of the group. Metrics:
    time/baseline_rollout_s, rollout/baseline_generated_tokens (generated tokens of the greedy responses, total over
    ranks), rollout/baseline_reward_mean."""
    t0 = time.time()
    rows: dict[int, dict[str, Any]] = {}
    for t in trajs:
        rows.setdefault(int(t.group_id), t.row)
    greedy = learner.rollout(list(rows.values()), greedy=True, n=1)
    reward_of = {g: float(t.reward) for g, t in zip(rows, greedy)}
    (tokens,) = distributed.sum_over_ranks(learner.accelerator, [sum(sum(t.response_mask) for t in greedy)])
    return torch.tensor([reward_of[int(t.group_id)] for t in trajs]), {
        "time/baseline_rollout_s": time.time() - t0, "rollout/baseline_generated_tokens": float(tokens),
        "rollout/baseline_reward_mean": sum(reward_of.values()) / max(len(reward_of), 1)}


def reward_shaping_settings(cfg: Config) -> dict[str, Any]:
    """The keyword settings of algorithm.reward_shaping's rule (its config section, lengths resolved)."""
    alg = cfg.algorithm
    if alg.reward_shaping == "overlong":
        max_length, cache_length = alg.overlong.lengths(cfg.rollout)
        return {"max_length": max_length, "cache_length": cache_length,
                "penalty_factor": alg.overlong.penalty_factor}
    return {}


def shaped_rewards(cfg: Config, batch: TrajectoryBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards [B] the advantage estimator reads: algorithm.reward_shaping's rule on the batch's EM rewards (the
    generated tokens, response_mask = 1, are the length), and the rule's metrics."""
    rule = get_reward_shaping(cfg.algorithm.reward_shaping)
    return rule(batch.rewards, batch.response_mask, **reward_shaping_settings(cfg))
