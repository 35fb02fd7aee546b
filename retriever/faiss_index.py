"""FAISS helpers: index construction from a factory string, training-set size, search parameters, GPU placement,
batched Flat search through BLAS, and memory-mapped reading."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_SEARCH_PARAMS = {"efSearch": 128, "nprobe": 64}  # used only by index types that have the parameter


class FaissSetupError(RuntimeError):
    """The installed FAISS cannot do what was asked (no GPU for --gpu-index, two FAISS builds installed)."""


def faiss_distributions() -> list[str]:
    """Names of the installed distributions that ship the ``faiss`` module (faiss-cpu, faiss-gpu, faiss-gpu-cu12, ...)."""
    names = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("faiss") and any(str(f).startswith("faiss/") for f in (dist.files or [])):
            names.add(name)
    return sorted(names)


@functools.lru_cache(maxsize=1)
def check_one_faiss() -> str:
    """The one installed FAISS distribution's name; FaissSetupError when there are several (they overwrite each
    other's ``faiss/`` module, so which library loads depends on install order) or none."""
    found = faiss_distributions()
    if len(found) > 1:
        raise FaissSetupError(f"{len(found)} FAISS builds are installed ({', '.join(found)}) and share the module "
                              f"faiss/; keep one: pip uninstall -y {' '.join(found)} && pip install -e '.[cpu]' "
                              f"(or '.[gpu]')")
    if not found:
        raise FaissSetupError("no FAISS build is installed: pip install -e '.[cpu]' (or '.[gpu]' on a CUDA machine)")
    return found[0]


def make_faiss_index(dim: int, index_type: str, *, polysemous_training: bool = False):
    """``faiss.index_factory(dim, index_type, inner product)`` with a clear error for a bad factory string.

    The factory turns on polysemous training for ``PQ`` codes (unless spelled ``PQ64np``); it only serves
    polysemous Hamming filtering, which IVF-PQ search does not use by default, and it makes training minutes
    slower (measured: > 4 min vs 11 s for IVF256,PQ64 on 12k x 768, one core), so it is off unless asked for.
    """
    import faiss

    try:
        index = faiss.index_factory(int(dim), index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"bad FAISS index type {index_type!r} for dim {dim}: {str(e).strip().splitlines()[-1]} "
                         "(examples: Flat, HNSW32, IVF4096,Flat, IVF4096,PQ64, SQ8)") from None
    try:
        inner = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:
        inner = faiss.downcast_index(index)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = bool(polysemous_training)
    return index


def _ivf_nlist(index) -> int:
    import faiss

    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except (RuntimeError, AttributeError):
        return 0


def num_train_vectors(index, num_rows: int, train_sample: int | None) -> int:
    """How many vectors to train on: ``train_sample`` if given, else max(256 * nlist, 65536) capped at the corpus."""
    want = train_sample or max(256 * _ivf_nlist(index), 65536)
    return min(int(want), int(num_rows))


def check_trainable(index, num_train: int, index_type: str) -> None:
    """IVF needs at least ``nlist`` training points (FAISS itself warns below 39 per centroid)."""
    nlist = _ivf_nlist(index)
    if nlist and num_train < nlist:
        raise ValueError(f"index type {index_type!r} has {nlist} IVF lists but only {num_train} training vectors are "
                         f"available; use fewer lists (e.g. IVF{max(1, num_train // 39)},...) or a larger corpus")


def set_search_params(index, params: dict[str, Any]) -> dict[str, Any]:
    """Apply ``efSearch`` / ``nprobe`` where the index has them; returns the ones that applied."""
    import faiss

    applied = {}
    space = faiss.ParameterSpace()
    for name, value in params.items():
        if value is None:
            continue
        try:
            space.set_index_parameter(index, name, value)
            applied[name] = value
        except RuntimeError:
            pass  # this index type has no such parameter (e.g. nprobe on HNSW)
    return applied


def gpu_count() -> int:
    """Number of GPUs FAISS can use (0 with faiss-cpu)."""
    import faiss

    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def require_gpus(what: str = "--gpu-index") -> int:
    """The number of GPUs FAISS sees; FaissSetupError naming ``what`` (the flag or key that asked) when it sees none
    (a CPU build of FAISS, or no visible GPU): a GPU index is never silently kept on the CPU."""
    n = gpu_count()
    if n == 0:
        import faiss

        build = "CPU build" if not hasattr(faiss, "GpuMultipleClonerOptions") else "GPU build, but no visible GPU"
        raise FaissSetupError(f"{what}: FAISS sees no GPU ({check_one_faiss()} {faiss.__version__}, a {build}); "
                              f"install the gpu extra (pip install -e '.[gpu]') on a CUDA machine, or drop {what}")
    return n


def to_gpus(index, *, shard: bool = True, fp16: bool = True):
    """Clone a CPU index onto all GPUs (sharded across them when there are several). Needs faiss-gpu.

    One process per node does this (``python -m retriever serve --gpu-index``): each of its GPUs gets one shard, one
    ``StandardGpuResources`` (1.5 GiB of temporary memory) and a CUDA context. Not every index type has a GPU version
    (HNSW does not); those raise and the caller keeps the CPU index.
    """
    import faiss

    options = faiss.GpuMultipleClonerOptions()
    options.shard = shard
    options.useFloat16 = fp16
    return faiss.index_cpu_to_all_gpus(index, co=options)


def to_gpu(index, device: int, *, fp16: bool = True):
    """Clone a CPU index onto the one GPU ``device`` (its own ``StandardGpuResources``, kept alive with the index).
    Needs faiss-gpu. What an in-process index in a training rank does: every rank of a node calling
    :func:`to_gpus` would put a shard, temporary memory and a context of each rank on every GPU."""
    import faiss

    resources = faiss.StandardGpuResources()
    options = faiss.GpuClonerOptions()
    options.useFloat16 = fp16
    gpu_index = faiss.index_cpu_to_gpu(resources, int(device), index, options)
    gpu_index.referenced_objects = [resources]  # the resources must outlive the index (FAISS's own wrappers do this)
    return gpu_index


GPU_PLACEMENTS = ("all", "own")  # an index on GPUs: sharded over every visible GPU, or on this process's own one


def own_gpu(encoder_device: str) -> int:
    """The GPU of this process: the query encoder's ``cuda:N`` when it is on one, else this thread's current CUDA
    device (a launched rank's own: accelerate sets it to the rank's local index)."""
    if encoder_device.startswith("cuda:"):
        return int(encoder_device.split(":", 1)[1])
    import torch

    return int(torch.cuda.current_device())


# Brute-force (Flat) search switches from one scan per query to one BLAS matrix product for the whole batch when
# the batch has at least this many queries. Recent FAISS builds default to 128000 (never, for a service's batches);
# measured here on 200k x 384, one thread: 32 queries 929 ms per-query scans -> 332 ms as one sgemm, same results.
FLAT_BLAS_MIN_QUERIES = 16


def use_blas_for_batches(min_queries: int = FLAT_BLAS_MIN_QUERIES) -> None:
    """Make batched Flat searches use one BLAS product (what request batching in the service relies on)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = int(min_queries)


def read_faiss_index(path: str | Path, *, mmap: bool = True):
    """Read an index, memory-mapped where FAISS allows it. Returns ``(index, mode)``; mode says what worked."""
    import faiss

    check_one_faiss()
    path = str(path)
    if mmap:
        for mode in ("IO_FLAG_MMAP_IFC", "IO_FLAG_MMAP"):  # IFC: flat codes mapped too (FAISS >= 1.10)
            flag = getattr(faiss, mode, None)
            if flag is None:
                continue
            try:
                return faiss.read_index(path, flag | faiss.IO_FLAG_READ_ONLY), mode.lower()[3:]
            except RuntimeError:
                continue
    return faiss.read_index(path), "in_memory"
