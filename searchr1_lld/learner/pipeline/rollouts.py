"""The learner's side of a pipelined run (trainer.staleness = k >= 1): requests the steps' rollouts ahead through a
transport (a worker process: worker.py; a test's threads), takes each step's batch, checks the staleness bound,
publishes the weights after every update, and restarts a worker that died (its in-flight requests sent again); a
worker whose engine or rollout raised stops the run with that error.

    pipeline.start(weights, version=step)     # publish, start the worker, request steps step .. step + k - 1
    result, metrics = pipeline.batch(t)       # wait for step t's batch (async/learner_wait_s), request step t + k
    ... step t's update ...
    pipeline.publish(weights, version=t + 1)  # no wait for the rollout
    pipeline.close()                          # the worker ends within seconds

The schedule and the bound are window.py's.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional, Protocol

import torch

from searchr1_lld.learner.pipeline.window import (RolloutFailure, RolloutRequest, RolloutResult, StalenessWindow,
                                                  check_bound, staleness_metrics)


class Transport(Protocol):
    """How requests reach a rollout worker and results come back (worker.WorkerProcess)."""

    def start(self) -> None: ...

    def send(self, request: RolloutRequest) -> None: ...

    def receive(self, timeout: float) -> Optional[RolloutResult | RolloutFailure]: ...

    def alive(self) -> bool: ...

    def restart(self) -> None: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """Where the learner's weights go after every update (weights.SharedWeights)."""

    def publish(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> float: ...


class RolloutPipeline:
    """The pipelined rollouts of one learner (module docstring). ``draw_rows()``: the next step's prompt rows (the
    trainer's sampler); ``sampler_state()``: the sampler's state now; ``seed_of(step)``: the step's seed."""

    def __init__(self, staleness: int, transport: Transport, publisher: Publisher, *, start: int,
                 draw_rows: Callable[[], list[dict[str, Any]]], sampler_state: Callable[[], dict[str, Any]],
                 seed_of: Callable[[int], int], max_restarts: int, poll_s: float = 0.2) -> None:
        self.window = StalenessWindow(staleness, start)
        self.transport, self.publisher = transport, publisher
        self.draw_rows, self.sampler_state, self.seed_of = draw_rows, sampler_state, seed_of
        self.max_restarts, self.poll_s = max_restarts, poll_s
        self.start_step = start
        self.received: dict[int, RolloutResult] = {}
        self.restarts = 0
        self.publish_s = 0.0

    def start(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Publish the learner's weights as ``version``, start the worker, request the first k steps."""
        self.publish(named, version)
        self.transport.start()
        self._request_due(self.start_step, received=False)

    def batch(self, step: int) -> tuple[RolloutResult, dict[str, float]]:
        """Step ``step``'s rollout (waiting for it; a dead worker restarted, at most trainer.placement.max_restarts
        times), checked against the bound, and the step's async/* metrics; step ``step + k``'s rollout requested."""
        t0 = time.perf_counter()
        while step not in self.received:
            result = self.transport.receive(self.poll_s)
            if result is None:
                if not self.transport.alive():
                    self._restart()
                continue
            if isinstance(result, RolloutFailure):
                raise RuntimeError(f"the rollout worker failed: {result.error}")
            if self.window.take(result):  # a duplicate of an answered request is dropped: never trained twice
                self.received[result.step] = result
        result = self.received.pop(step)
        waited = time.perf_counter() - t0
        check_bound(result, step, self.window.staleness)
        self._request_due(step, received=True)
        return result, {**staleness_metrics(result, step), "async/learner_wait_s": waited,
                        "async/engine_wait_s": result.engine_wait_s, "async/worker_restarts": float(self.restarts),
                        "async/publish_s": self.publish_s}

    def publish(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """The learner's weights as ``version`` (after every update; the worker loads them at its next request)."""
        self.publish_s = self.publisher.publish(named, version)

    def sampler_state_to_save(self) -> dict[str, Any]:
        """The sampler's state a checkpoint records: before the oldest request in flight (window.py)."""
        return self.window.sampler_state_to_save(self.sampler_state())

    def close(self) -> None:
        self.transport.close()

    def _request_due(self, step: int, received: bool) -> None:
        for s in self.window.due(step, received):
            before = self.sampler_state()
            request = RolloutRequest(step=s, rows=self.draw_rows(), seed=self.seed_of(s))
            self.window.add(request, before)
            self.transport.send(request)

    def _restart(self) -> None:
        """A worker died: a new one, sent every request in flight again (generated anew, with the newest weights)."""
        if self.restarts >= self.max_restarts:
            raise RuntimeError(f"the rollout worker died {self.restarts + 1} times (trainer.placement.max_restarts="
                               f"{self.max_restarts})")
        self.restarts += 1
        self.transport.restart()
        for request in self.window.requests():
            self.transport.send(request)
