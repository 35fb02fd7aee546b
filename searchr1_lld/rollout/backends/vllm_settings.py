"""The vLLM engine settings that change its memory, fixed by the run rather than by vLLM's defaults for the GPU it
finds, and the launcher variables its external-launcher executor reads. Pure functions of the config and the
environment (no vllm import): the backend builds its engine from them (vllm.py) and the preflight plans the same
engine from them (searchr1_lld/preflight/run.py, memory_plan.EngineSettings).

- Batch: vLLM 0.32 sizes Model Runner V2's per-request state and its profiling pass by ``max_num_seqs`` and
  ``max_num_batched_tokens``, whose defaults depend on the GPU (engine/arg_utils.py get_batch_defaults: 1,024 and
  16,384 on a GPU of >= 70 GiB other than an A100, 256 and 8,192 below). A training engine passes its own
  (:func:`engine_batch`): twice the requests a rank has in the engine at once, one whole context (or one token of
  every sequence) per step.
- Graph offload: ``sleep_mode_offload_cudagraph`` (vLLM 0.32: the CUDA-graph pool backed up to host memory at sleep
  and restored at wake-up) is passed as :data:`OFFLOAD_CUDAGRAPH`, off: the update keeps at least 18 % of the GPU free
  in every paper cell with the pool on the GPU (docs/memory.md), and the backup costs two host copies of the pool
  per step on a path this project has not run on a GPU.
- ``LOCAL_RANK``: vLLM puts its engine on ``cuda:LOCAL_RANK``; :func:`local_rank` takes the launcher's local index,
  never the global rank (rank 8 is device 0 of the second node).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

from searchr1_lld.config import Config, RolloutConfig

OFFLOAD_CUDAGRAPH = False  # sleep_mode_offload_cudagraph (module docstring)
# the local index of this process on its node, as launchers other than torchrun / accelerate name it
LOCAL_INDEX_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                         "SLURM_LOCALID")


@dataclass(frozen=True)
class EngineBatch:
    """vLLM's batch limits: requests scheduled at once, tokens per engine step."""

    max_num_seqs: int
    max_num_batched_tokens: int

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"need 1 <= max_num_seqs <= max_num_batched_tokens, got {self.max_num_seqs} and "
                             f"{self.max_num_batched_tokens}")


def engine_batch(cfg: Config, world_size: int) -> EngineBatch:
    """The batch limits of a training rank's engine: ``max_num_seqs`` = the larger of twice the trajectories of the
    rank's share of a step (ceil(train_batch_size / world_size) x rollout.n, each with one request in the engine at a
    time) and one evaluation batch (eval.batch_size greedy questions); ``max_num_batched_tokens`` =
    max(rollout.max_total_length, max_num_seqs): one whole context, or one token of every sequence, per step. The
    paper's cell (512 prompts x 5 on 8 ranks, evaluation batches of 512, 4,096 tokens): 640 and 4,096."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    trajectories = math.ceil(cfg.trainer.train_batch_size / world_size) * cfg.rollout.n
    seqs = max(2 * trajectories, cfg.eval.batch_size, 1)
    return EngineBatch(max_num_seqs=seqs, max_num_batched_tokens=max(cfg.rollout.max_total_length, seqs))


def memory_settings(r: RolloutConfig, batch: Optional[EngineBatch]) -> dict[str, Any]:
    """What the memory plan needs of an engine built from ``r`` with ``batch`` (None: vLLM's defaults of an 80 GB
    GPU): memory_plan.EngineSettings' fields, with ``eager`` (no CUDA graphs) in place of the graph pool's size."""
    settings: dict[str, Any] = dict(gpu_memory_utilization=r.vllm.gpu_memory_utilization,
                                    kv_cache_memory_bytes=int(r.vllm.kv_cache_memory_bytes),
                                    sleeps=r.vllm.enable_sleep_mode, eager=r.vllm.enforce_eager,
                                    offload_cudagraph=OFFLOAD_CUDAGRAPH)
    if batch is not None:
        settings.update(max_num_seqs=batch.max_num_seqs, max_num_batched_tokens=batch.max_num_batched_tokens)
    return settings


def local_rank(rank: int, world_size: int, environ: Optional[dict[str, str]] = None) -> int:
    """This process's index on its node: the launcher's (:data:`LOCAL_INDEX_VARIABLES`, else ``RANK`` modulo
    ``LOCAL_WORLD_SIZE``), 0 for a process alone, else ValueError: the global rank is no device index beyond the
    first node."""
    env = os.environ if environ is None else environ
    for name in LOCAL_INDEX_VARIABLES:
        if env.get(name, "").strip():
            return int(env[name])
    if env.get("LOCAL_WORLD_SIZE", "").strip():
        return rank % int(env["LOCAL_WORLD_SIZE"])
    if world_size == 1:
        return 0
    raise ValueError(f"rank {rank} of {world_size}: the launcher gives no local index "
                     f"({', '.join(LOCAL_INDEX_VARIABLES)} or LOCAL_WORLD_SIZE); vLLM would take the global rank as "
                     "this node's GPU. Launch with accelerate or torchrun, or set LOCAL_RANK")
