"""Thread and OpenMP wait-policy defaults for a retriever that shares its node with training.

A retriever next to a trainer is the normal case. With OpenMP's default (active) wait policy, idle worker threads
spin for a while after each parallel region; when other processes want the same cores, the spinning threads and the
trainer fight over them. Measured on 2 cores with ~0.75 core of co-located load: one MiniLM query encode went from
15 ms (idle) to ~370 ms with spinning threads, and to 24 ms with ``OMP_WAIT_POLICY=PASSIVE``.

Defaults applied by ``python -m retriever serve`` / ``search`` (each overridable):

- ``OMP_WAIT_POLICY=PASSIVE`` unless the variable is already set in the environment;
- intra-op threads (torch, FAISS, BLAS): ``--threads`` if given, else ``$OMP_NUM_THREADS`` if set, else
  ``min(4, usable cores)``: a query batch is small, more threads mostly add synchronisation.

OpenMP runtimes read these variables once, when the library is loaded, so they are set before torch or faiss is
imported (``apply_thread_defaults`` refuses to run after, rather than silently doing nothing).
"""

from __future__ import annotations

import os
import sys

DEFAULT_MAX_THREADS = 4
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(DEFAULT_MAX_THREADS, usable_cores()))


def apply_thread_defaults(threads: int | None = None) -> dict:
    """Set the wait policy and thread counts in the environment before torch/faiss load; returns what was set."""
    loaded = [m for m in ("torch", "faiss") if m in sys.modules]
    if loaded:
        raise RuntimeError(f"apply_thread_defaults must run before {loaded} is imported (OpenMP reads its settings "
                           "when it loads)")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 (got {threads})")
    n = int(threads) if threads else default_threads()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for var in THREAD_ENV_VARS:
        if threads or var not in os.environ:
            os.environ[var] = str(n)
    return {"threads": n, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"]}


def set_library_threads(n: int) -> None:
    """After import: tell torch and FAISS the same thread count (they may have their own OpenMP runtimes)."""
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def runtime_info() -> dict:
    """Thread settings as the running process sees them (for /health)."""
    torch = sys.modules.get("torch")
    return {"threads": torch.get_num_threads() if torch is not None else None,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
