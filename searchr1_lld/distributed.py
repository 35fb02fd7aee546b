"""Multi-process facts and collectives: which engine runs the learner (DDP / DeepSpeed ZeRO-n), resolved once into a
:class:`DistributedFacts`, the small all-reduces every rank must agree on, rendezvous ports. No math; a leaf that the
learner, the run bookkeeping, the evaluator and the rollout engines share."""

from __future__ import annotations

import socket
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from searchr1_lld.protocols import Accelerator


def free_ports(n: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports nobody listens on now (bound together, then released): rendezvous ports for
    processes started without a launcher."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def explicit_device(device: str = "auto") -> str:
    """A device named in full: ``auto`` -> ``cuda:<index>`` of this thread's current GPU when there is one, else
    ``cpu``; a bare ``cuda`` -> ``cuda:<index>``; anything else as given. PyTorch's current device is per thread
    (a new thread starts on cuda:0), so a bare ``cuda`` means a different GPU in a worker thread."""
    if device == "auto" and not torch.cuda.is_available():
        return "cpu"
    if device in ("auto", "cuda"):
        return f"cuda:{torch.cuda.current_device()}"
    return device


def thread_cuda_device() -> int | None:
    """This thread's current CUDA device index (None without a GPU): what a worker thread started from here must
    set (:func:`set_thread_cuda_device`) to compute on the same GPU."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def set_thread_cuda_device(index: int | None) -> None:
    """An executor initializer: the worker thread's current CUDA device becomes ``index`` (None: no GPU, nothing to
    set)."""
    if index is not None:
        torch.cuda.set_device(index)


@dataclass(frozen=True)
class DistributedFacts:
    """What the learner asks about its processes, resolved once at set-up (:meth:`of`)."""

    deepspeed: bool  # the model runs through a DeepSpeed engine
    zero_stage: int  # the DeepSpeed ZeRO stage (0 without DeepSpeed)
    world_size: int  # processes (data-parallel ranks)
    rank: int  # this process's index
    is_main: bool  # rank 0: the process that writes the run directory

    @classmethod
    def of(cls, accelerator: Accelerator) -> DistributedFacts:
        return cls(deepspeed=is_deepspeed(accelerator), zero_stage=zero_stage(accelerator),
                   world_size=accelerator.num_processes, rank=accelerator.process_index,
                   is_main=accelerator.is_main_process)


def is_deepspeed(accelerator: Accelerator) -> bool:
    """True when ``accelerator`` runs the model through a DeepSpeed engine (False for None: no accelerator)."""
    if accelerator is None:
        return False
    return str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)).upper() == "DEEPSPEED"


def zero_stage(accelerator: Accelerator) -> int:
    """The DeepSpeed ZeRO stage (0 without DeepSpeed)."""
    if not is_deepspeed(accelerator):
        return 0
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


@contextmanager
def outside_zero3(accelerator: Accelerator) -> Iterator[None]:
    """Models loaded inside stay whole. Under ZeRO-3, transformers builds every model it loads inside
    ``deepspeed.zero.Init`` (partitioned over the ranks) while accelerate's DeepSpeed config is registered with it,
    whatever ``zero3_init_flag`` says; a model that is not trained by the DeepSpeed engine (the in-process
    retriever's encoder, a meta-device skeleton) must not be: its forward would see empty partitions. The
    registration is lifted for the block and restored after it. No-op below stage 3."""
    if zero_stage(accelerator) != 3:
        yield
        return
    from transformers.integrations import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        accelerator.state.deepspeed_plugin.set_deepspeed_weakref()
        if not is_deepspeed_zero3_enabled():
            raise RuntimeError("outside_zero3: accelerate's ZeRO-3 config did not come back into effect")


def agree_max(accelerator: Accelerator, counts: Sequence[int]) -> list[int]:
    """Element-wise max of ``counts`` over all processes (one all-reduce): the number of micro-batches every rank
    runs, so that the collectives inside forward/backward (ZeRO-3 gathers, gradient reduction) pair up."""
    if accelerator.num_processes == 1 or not counts:
        return list(counts)
    t = torch.tensor(list(counts), dtype=torch.long, device=accelerator.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def sum_over_ranks(accelerator: Accelerator, counts: Sequence[int]) -> list[int]:
    """Element-wise sum of ``counts`` over all processes (one all-reduce): a run's totals of per-rank counts."""
    if accelerator.num_processes == 1 or not counts:
        return [int(c) for c in counts]
    t = torch.tensor([int(c) for c in counts], dtype=torch.long, device=accelerator.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    return [int(v) for v in t.tolist()]


def any_rank(accelerator: Accelerator, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (one all-reduce)."""
    return bool(agree_max(accelerator, [int(flag)])[0])


def reduce_metrics(accelerator: Accelerator, metrics: dict[str, Any]) -> dict[str, Any]:
    """Mean of float metrics over processes (NaN-aware is not attempted: NaN on any rank stays NaN)."""
    if accelerator.num_processes == 1:
        return metrics
    keys = sorted(k for k, v in metrics.items() if isinstance(v, float))
    vals = torch.tensor([metrics[k] for k in keys], device=accelerator.device)
    vals = accelerator.reduce(vals, "mean")
    return {**metrics, **{k: float(v) for k, v in zip(keys, vals.tolist())}}
