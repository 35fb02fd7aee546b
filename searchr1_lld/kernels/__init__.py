"""Hand-fused CPU kernels in C, built with the system C compiler on first use and loaded with ctypes.

``load(name)`` compiles ``searchr1_lld/kernels/<name>.c`` (``cc -O3 -march=native ...``, see ``_FLAGS``) into a cache
directory (``$SEARCHR1_KERNEL_CACHE``, default ``~/.cache/searchr1_lld/kernels``), named by the hash of the source,
the flags and the CPU so that an edited kernel is rebuilt, and returns the loaded library. Several processes (ranks)
may build the same kernel at once: each writes its own temporary file and renames it into place. Without a working
C compiler it returns None after one warning (with ``SEARCHR1_KERNELS=0``, silently), and callers run their torch
formulation instead.

Kernels: ``llds_cpu.c`` -- the LLDS term of the fused objective (algo/llds.py, ``llds_update``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
# reassociation (not -ffast-math: NaN and infinity keep their meaning) lets the compiler vectorise the sums
# and -march=native the wider vector units (the cache name includes this CPU's identity: see _cpu_id)
_FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c99", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math"]
_LOADED: dict[str, ctypes.CDLL | None] = {}


def cache_dir() -> Path:
    """Where built kernels live (``$SEARCHR1_KERNEL_CACHE`` or ``~/.cache/searchr1_lld/kernels``)."""
    return Path(os.environ.get("SEARCHR1_KERNEL_CACHE", Path.home() / ".cache" / "searchr1_lld" / "kernels"))


def _cpu_id() -> str:
    """This CPU's model and instruction-set flags (Linux), else the platform's processor string: a kernel built with
    -march=native is reused only on the same kind of CPU (a cache directory shared between machines stays safe)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.machine() + platform.processor()


def _build(source: Path, target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *_FLAGS, str(source), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {source.name}:\n{proc.stderr.strip()}")
        os.replace(tmp, target)  # atomic: a concurrent builder's identical file is simply replaced
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(name: str) -> ctypes.CDLL | None:
    """The built kernel library ``name`` (``<name>.c`` beside this file), or None (one warning) if it cannot be
    built."""
    if name in _LOADED:
        return _LOADED[name]
    lib = None
    if os.environ.get("SEARCHR1_KERNELS", "1") != "0":
        source = _HERE / f"{name}.c"
        digest = hashlib.sha256(source.read_bytes() + " ".join(_FLAGS).encode() + _cpu_id().encode()).hexdigest()[:16]
        target = cache_dir() / f"{name}-{digest}.so"
        try:
            if not target.exists():
                _build(source, target)
            lib = ctypes.CDLL(str(target))
        except (OSError, RuntimeError) as e:
            warnings.warn(f"C kernel {name!r} unavailable ({e}); using the torch formulation", stacklevel=2)
            lib = None
    _LOADED[name] = lib
    return lib


def llds_update(neg_d: torch.Tensor, m: torch.Tensor, advantages: torch.Tensor, grad_logp: torch.Tensor, *, gate: int,
                lam: float, tau: float, answer_mask: torch.Tensor | None, c_answer: float | None,
                inv_den: float) -> torch.Tensor | None:
    """``llds_cpu.c`` on the arguments of :func:`searchr1_lld.algo.llds.llds_update` (gate as its index in
    ``llds.GATES``, c_answer = min(lam_answer, lam) or None): adds -w inv_den to ``grad_logp`` in place and returns
    the ``[8]`` metrics ending with L_LLDS, or None when the kernel does not apply (not CPU float32 / bool contiguous,
    inside ``torch.compile``, or no compiler): the caller then runs the torch formulation. Shapes are checked here,
    since the C code trusts them: a mismatch is an error, not a fallback."""
    if (neg_d.dtype, grad_logp.dtype, advantages.dtype, m.dtype) != _LLDS_DTYPES or gate < 0 or not (
            neg_d.is_cpu and m.is_cpu and grad_logp.is_cpu and advantages.is_cpu and neg_d.is_contiguous()
            and m.is_contiguous() and grad_logp.is_contiguous() and advantages.is_contiguous()
    ) or torch.compiler.is_compiling():
        return None
    answer = None
    if c_answer is not None:
        answer = (answer_mask if answer_mask.dtype == torch.bool else answer_mask != 0).contiguous()
        if not answer.is_cpu:
            return None
    shape = neg_d.shape
    if len(shape) != 2 or m.shape != shape or grad_logp.shape != shape or (
            answer is not None and answer.shape != shape) or advantages.shape not in (shape, shape[:1]):
        raise ValueError(f"llds kernel: neg_d, mask, grad (and answer mask) must be [B, T] and advantages [B] or "
                         f"[B, T]; got {tuple(shape)}, {tuple(m.shape)}, {tuple(grad_logp.shape)}, "
                         f"{None if answer is None else tuple(answer.shape)}, {tuple(advantages.shape)}")
    fn = _LLDS_FN or _llds_fn()
    if fn is None:
        return None
    out = torch.empty(8, dtype=torch.float32)
    if fn(shape[0], shape[1], neg_d.data_ptr(), m.data_ptr(), advantages.data_ptr(), advantages.dim() == 2,
          None if answer is None else answer.data_ptr(), gate, lam, 0.0 if c_answer is None else c_answer, tau, inv_den,
          grad_logp.data_ptr(), out.data_ptr()) != 0:
        raise MemoryError("llds_cpu: could not allocate its per-row scratch space")
    return out


_LLDS_FN = None
_LLDS_DTYPES = (torch.float32, torch.float32, torch.float32, torch.bool)


def _llds_fn():
    """``llds_update`` of the built ``llds_cpu`` library with its C signature (cached), or None."""
    global _LLDS_FN
    lib = load("llds_cpu")
    if lib is None:
        return None
    fn = lib.llds_update
    p, f, i = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, p, p, p, i, p, i, f, f, f, f, p, p]
    fn.restype = ctypes.c_int
    _LLDS_FN = fn
    return fn
