"""The learner's PyTorch allocator setting that a launch gives it: ``expandable_segments``.

Waking the rollout engine maps fresh physical memory, which needs memory the driver sees as free; PyTorch's caching
allocator hands back only whole free segments, and the optimiser's states (created at the first update) sit in
segments the learner keeps using, so what the update frees around them stays with PyTorch. With
``expandable_segments`` PyTorch grows and shrinks one segment per stream instead, and freed memory goes back.
:func:`use_expandable_segments` (train.py, before CUDA starts) turns it on unless the user's allocator configuration
names it already; vLLM 0.32 turns it off inside its own sleep-mode pools and back on after
(vllm/device_allocator/cumem.py). :func:`expandable_segments_note` is the preflight's note when it is off.
"""

from __future__ import annotations

import os

# torch reads the first of these that is set (the accelerator-agnostic name wins over the CUDA one)
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments"


def allocator_conf(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(the variable torch reads its allocator settings from, its value); (PYTORCH_CUDA_ALLOC_CONF, "") when none is
    set."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARIABLES:
        if env.get(name, "").strip():
            return name, env[name]
    return "PYTORCH_CUDA_ALLOC_CONF", ""


def expandable_setting(conf: str) -> bool | None:
    """``expandable_segments`` in an allocator configuration string: True / False as it says, None when absent."""
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == EXPANDABLE:
            return value.strip().lower() in ("true", "1")
    return None


def use_expandable_segments(environ: dict[str, str] | None = None) -> str:
    """Turn on ``expandable_segments`` for this process's PyTorch allocator (module docstring), keeping the user's
    other settings, unless their configuration names it already; to take effect it must run before CUDA starts.
    Returns the variable and the value in force."""
    env = os.environ if environ is None else environ
    name, conf = allocator_conf(env)
    if expandable_setting(conf) is None:
        env[name] = f"{conf},{EXPANDABLE}:True" if conf.strip() else f"{EXPANDABLE}:True"
    return f"{name}={env[name]}"


def expandable_segments_note(environ: dict[str, str] | None = None) -> str | None:
    """The preflight's note when the learner's allocator runs without ``expandable_segments``, else None."""
    name, conf = allocator_conf(environ)
    if expandable_setting(conf):
        return None
    return (f"allocator: {name}={conf!r} runs the learner without {EXPANDABLE}: memory the update frees inside "
            "segments it still uses cannot go back to the driver when the engine wakes up (train.py sets "
            f"{EXPANDABLE}:True unless the variable names it)")
