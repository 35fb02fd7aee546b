"""The learner's published weights on one machine: one shared-memory tensor per parameter, a version and a lock.

The learner publishes after every update (:meth:`SharedWeights.publish`: copy in, version set) without waiting for
any rollout; a worker, when it starts a request, loads the newest version into its engine through the engine's own
contract (:meth:`SharedWeights.load_into`: ``backend.load_weights``) unless it holds it already. The lock is held
only while one side copies, so neither waits for the other's generation or update."""

from __future__ import annotations

import time
from typing import Any, Iterable

import torch

from searchr1_lld.rollout.backends.base import GenerationBackend


class SharedWeights:
    """Parameters by name in shared memory (``torch.Tensor.share_memory_``), with a version (-1: none published) and
    a lock, made by ``ctx`` (a ``torch.multiprocessing`` context) so that a spawned worker receives them."""

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]], ctx: Any) -> None:
        self.tensors = {name: t.detach().to("cpu", copy=True).contiguous().share_memory_() for name, t in named}
        self.version = ctx.Value("q", -1)
        self.lock = ctx.Lock()

    def publish(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Copy ``named`` (every parameter, the learner's stream: ``engine.named_weights``) in as ``version``.
        Returns the seconds the lock was held."""
        t0 = time.perf_counter()
        with self.lock:
            for name, tensor in named:
                self.tensors[name].copy_(tensor.detach().to("cpu"))
            self.version.value = int(version)
        return time.perf_counter() - t0

    def load_into(self, backend: GenerationBackend, loaded: int) -> int:
        """The newest version into ``backend`` (``backend.load_weights``) unless it is ``loaded``. Returns the version
        the backend holds now."""
        with self.lock:
            version = int(self.version.value)
            if version != loaded:
                backend.load_weights(iter(self.tensors.items()))
        return version
