"""The preflight inside every training launch on a GPU, and the allocator setting the launch gives the learner.

:func:`check_at_start` runs when the learner is built (``Learner.build``, right after the accelerator: before the
policy is loaded and before any engine exists) on every rank of a launch whose device is a GPU: the blocking checks
of ``train.py --preflight`` (preflight/run.py: rows files, model files, the retriever's index or service, the memory
plan with the engine's start, the update and the first wake-up) with the launch this process is part of, read from
the live accelerator (:func:`launch_of`), and this GPU's total memory. The ranks then agree (:func:`agree`, one
gather): if any rank found a problem, rank 0 prints every problem once, one line each, as ``train.py --preflight``
does (``train.py: preflight: ...`` on stderr; a problem only some ranks saw names them), and every rank raises
:class:`PreflightRefused`, which train.py turns into exit status 2 on every rank, after the process group is taken
down. ``train.py --no-preflight`` (``Trainer(preflight=False)``) skips it; a launch on CPUs has no GPU to plan.

The learner's allocator setting (``expandable_segments``) is preflight/allocator.py's; the start-up check prints
its note on rank 0 when it is off.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import torch

from searchr1_lld.config import Config
from searchr1_lld.distributed import DistributedFacts
from searchr1_lld.preflight.allocator import expandable_segments_note
from searchr1_lld.preflight.run import Launch, run_preflight, zero_buckets
from searchr1_lld.protocols import Accelerator

GiB = float(1 << 30)


class PreflightRefused(Exception):
    """The start-up preflight found problems (rank 0 printed them, one a line); every rank raises it."""

    def __init__(self, problems: list[str]):
        super().__init__(f"preflight: {len(problems)} problem(s): " + "; ".join(problems))
        self.problems = problems


def launch_of(accelerator: Accelerator, dist: DistributedFacts) -> Launch:
    """The launch this process is part of, as the preflight's plan needs it: processes, machines
    (LOCAL_WORLD_SIZE processes each), DeepSpeed's stage, offload, zero3_init and bucket sizes from the accelerator's
    plugin."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or 0) or dist.world_size
    launch = Launch(processes=dist.world_size, machines=max(1, dist.world_size // per_node),
                    deepspeed=dist.deepspeed, zero_stage=dist.zero_stage,
                    bf16=str(accelerator.mixed_precision) == "bf16", source="this launch")
    if dist.deepspeed:
        plugin = accelerator.state.deepspeed_plugin
        zero = plugin.deepspeed_config.get("zero_optimization") or {}
        launch.offload_optimizer = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
        launch.zero3_init = bool(plugin.zero3_init_flag)
        launch.buckets = zero_buckets(zero)
    return launch


def gather(dist: DistributedFacts, mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (one ``all_gather_object``; this rank's alone without others)."""
    if dist.world_size == 1:
        return [mine]
    out: list[Any] = [None] * dist.world_size
    torch.distributed.all_gather_object(out, mine)
    return out


def agree(accelerator: Accelerator, dist: DistributedFacts, problems: list[str], stream: TextIO | None = None) -> None:
    """Every rank's problems gathered; none anywhere: return. Else rank 0 writes each distinct problem once
    (``train.py: preflight: ...``; one that not every rank found names the ranks that did), the process group is
    taken down, and every rank raises :class:`PreflightRefused` with all of them."""
    found = gather(dist, list(problems))
    union: dict[str, list[int]] = {}
    for rank, rank_problems in enumerate(found):
        for problem in rank_problems:
            union.setdefault(problem, []).append(rank)
    if not union:
        return
    lines = [problem if len(ranks) == dist.world_size else f"{problem} (rank {', '.join(map(str, ranks))})"
             for problem, ranks in union.items()]
    if dist.is_main:
        out = stream or sys.stderr
        for line in lines:
            print(f"train.py: preflight: {line}", file=out, flush=True)
        print(f"train.py: preflight: {len(lines)} problem(s): the run cannot start (train.py --preflight prints the "
              "whole plan; --no-preflight skips this check)", file=out, flush=True)
    if dist.world_size > 1:
        accelerator.wait_for_everyone()
        accelerator.end_training()  # the process group goes down before the ranks exit
    raise PreflightRefused(lines)


def check_at_start(cfg: Config, accelerator: Accelerator, dist: DistributedFacts,
                   gpu_bytes: float | None = None, stream: TextIO | None = None) -> None:
    """The start-up preflight of the module docstring on this rank (``gpu_bytes``: this GPU's total memory; None:
    the device's own), then :func:`agree`. A launch whose device is not a GPU is not checked."""
    if accelerator.device.type != "cuda":
        return
    if gpu_bytes is None:
        gpu_bytes = float(torch.cuda.get_device_properties(accelerator.device).total_memory)
    result = run_preflight(cfg, launch=launch_of(accelerator, dist), device_gib=gpu_bytes / GiB,
                           wait_for_service=True)
    note = expandable_segments_note()
    if note and dist.is_main:
        print(f"train.py: preflight: note: {note}", file=stream or sys.stderr, flush=True)
    agree(accelerator, dist, result.problems, stream)
