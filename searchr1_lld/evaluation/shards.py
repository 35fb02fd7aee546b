"""Sharded evaluation on one node: every shard process on its own device and rendezvous port, and ``eval.py --gpus N``
starting the N shard processes and waiting for them (their files are merged by :func:`merge_shards`).

Shard i of k (``eval.py --shard i/k``), before its engine is built (:func:`prepare_shard_process`):

    device       = cuda:(i mod G) with G = the GPUs visible to the process, else cpu
    LOCAL_RANK   = i mod G    (vLLM's external launcher puts its engine on cuda:LOCAL_RANK)
    RANK, WORLD_SIZE = 0, 1   (each shard's engine is a process group of its own, not a rank of the others)
    MASTER_PORT  = kept when a launcher (or ``--gpus``) set it, else a port free on this machine now
    MASTER_ADDR  = kept, else 127.0.0.1

``--gpus N`` picks N distinct free ports at once (all N sockets held open together, so no two shards get the same
one), starts ``eval.py ... --shard i/N`` per shard with its port, its output in ``OUT/shard-i-of-N.log``, and waits;
the first shard that fails stops the others (their finished rows stay in their files: a rerun resumes them) and is
reported with the last line of its log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, MutableMapping, Sequence

from searchr1_lld.distributed import free_ports
from searchr1_lld.evaluation.metrics import EvalError


def visible_gpu_count() -> int:
    """CUDA devices this process can see (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shard_device(shard: tuple[int, int], gpu_count: int) -> str:
    """``cuda:(i mod gpu_count)`` for shard (i, k), or ``cpu`` without GPUs."""
    return f"cuda:{shard[0] % gpu_count}" if gpu_count > 0 else "cpu"


def shard_env(shard: tuple[int, int], gpu_count: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher variables of shard (i, k) (module docstring): what to set in ``environ``."""
    env = {"LOCAL_RANK": str(shard[0] % gpu_count if gpu_count > 0 else 0), "RANK": "0", "WORLD_SIZE": "1"}
    if not environ.get("MASTER_ADDR"):
        env["MASTER_ADDR"] = "127.0.0.1"
    if not environ.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(free_ports(1)[0])
    return env


def prepare_shard_process(shard: tuple[int, int], environ: MutableMapping[str, str] | None = None,
                          gpu_count: int | None = None) -> str:
    """Set this process up as shard (i, k) before any engine or index is built: the launcher variables
    (:func:`shard_env`), the current CUDA device; returns the device the shard's model goes on."""
    environ = os.environ if environ is None else environ
    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    environ.update(shard_env(shard, gpus, environ))
    device = shard_device(shard, gpus)
    import torch

    if gpus > 0 and torch.cuda.is_available():
        torch.cuda.set_device(device)  # the in-process retriever's encoder, built next, resolves to this device
    return device


def shard_command(argv: Sequence[str], shard: tuple[int, int], script: str | Path) -> list[str]:
    """The command of one shard process: ``script`` with ``argv`` less ``--gpus N`` and ``--wandb`` (the parent
    logs the merged results), plus ``--shard i/k --no-progress``."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--gpus":
            skip = True
        elif not a.startswith("--gpus=") and a != "--wandb":
            out.append(a)
    return [sys.executable, str(script), *out, "--shard", f"{shard[0]}/{shard[1]}", "--no-progress"]


def shard_log(out_dir: str | Path, shard: tuple[int, int]) -> Path:
    return Path(out_dir) / f"shard-{shard[0]}-of-{shard[1]}.log"


def run_shards(argv: Sequence[str], n: int, out_dir: str | Path, script: str | Path, *, poll_s: float = 0.5) -> None:
    """Start the ``n`` shard processes of ``argv`` (module docstring) and wait for all; EvalError naming the first
    that failed (the others are stopped)."""
    if n < 1:
        raise EvalError(f"--gpus must be >= 1 (got {n})")
    gpus = visible_gpu_count()
    if gpus and n > gpus:
        raise EvalError(f"--gpus {n}: only {gpus} GPU(s) visible (CUDA_VISIBLE_DEVICES); use --gpus {gpus} or fewer")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ports = free_ports(n)
    threads = str(max(1, (os.cpu_count() or 1) // n))
    procs: list[tuple[tuple[int, int], subprocess.Popen]] = []
    try:
        for i in range(n):
            shard = (i, n)
            env = {**os.environ, "MASTER_PORT": str(ports[i])}
            if not gpus:  # CPU shards share the cores
                env.setdefault("OMP_NUM_THREADS", threads)
            with open(shard_log(out_dir, shard), "w") as log:
                procs.append((shard, subprocess.Popen(shard_command(argv, shard, script), env=env, stdout=log,
                                                      stderr=subprocess.STDOUT)))
            print(f"shard {i}/{n}: pid {procs[-1][1].pid} on {shard_device(shard, gpus)}, port {ports[i]}, "
                  f"log {shard_log(out_dir, shard)}", flush=True)
        while procs:
            for shard, p in list(procs):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove((shard, p))
                if rc != 0:
                    log = shard_log(out_dir, shard)
                    raise EvalError(f"shard {shard[0]}/{n} failed (exit status {rc}): {_last_line(log)} (full log: "
                                    f"{log}; a rerun resumes the finished rows)")
                print(f"shard {shard[0]}/{n}: done", flush=True)
            time.sleep(poll_s if procs else 0)
    finally:
        for _, p in procs:  # stop the others after a failure or an interrupt
            p.terminate()
        for _, p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _last_line(path: Path) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.is_file() else []
    return lines[-1].strip()[:500] if lines else "(no output)"
