"""The rollout worker of a split placement on one machine: a process of its own with its own engine (the run's
``rollout.backend`` kind, built from ``model.path``), tokenizer and retriever, and its own torch threads. It serves
:class:`~searchr1_lld.learner.pipeline.window.RolloutRequest` s in order: load the newest published weights, roll
out the step's rows (seeded as the synchronous step seeds its rollout), stamp each trajectory with the weights'
version, return a :class:`~searchr1_lld.learner.pipeline.window.RolloutResult`.

:class:`WorkerProcess` is the learner's handle: start (spawn), send, receive, alive, restart (fresh queues: a dead
worker's half-sent results are never read), close. Ctrl-C reaches both processes (one process group): the worker
leaves quietly, the learner's ``close`` ends it within seconds either way. A worker whose learner died exits too.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from typing import Any, Optional

import torch

from searchr1_lld.config import Config
from searchr1_lld.distributed import explicit_device
from searchr1_lld.learner import factories
from searchr1_lld.learner.pipeline.weights import SharedWeights
from searchr1_lld.learner.pipeline.window import RolloutFailure, RolloutRequest, RolloutResult
from searchr1_lld.learner.step import seed_everything
from searchr1_lld.placement import set_torch_threads
from searchr1_lld.rollout.agent_loop import run_agent_loop
from searchr1_lld.rollout.backends import backend_kind
from searchr1_lld.rollout.inference import evaluating

# the learner's launch (torchrun / accelerate, or the process group a single learner sets up for itself): a worker
# is no rank of it, so an engine that reads these (vLLM's external launcher) sets up a group of its own
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
POLL_S = 0.5  # how often a waiting worker checks that its learner lives
CLOSE_S = 3.0  # how long close() waits for a worker to leave before it terminates it


def build_engine(cfg: Config, parameter_names: set[str]) -> tuple[Any, Any, Any]:
    """(backend, tokenizer, retriever) of a worker: the ``rollout.backend`` kind's engine on its own copy of the
    policy (a kind that generates on a module: loaded from ``model.path``; else the engine loads it), the run's
    retriever (factories.make_retriever)."""
    kind = backend_kind(cfg.rollout)
    device = explicit_device("cpu" if cfg.trainer.device == "cpu" else "auto")
    model, tokenizer = factories.load_policy_and_tokenizer(cfg)
    model = model.to(device) if kind.generates_on_learner_module else None
    backend = kind.build(cfg.rollout, model=model, tokenizer=tokenizer, model_path=cfg.model.path, seed=None,
                         dtype=cfg.model.dtype, tokenizer_path=cfg.model.tokenizer_path or cfg.model.path,
                         shares_learner_weights=False, device=str(device), parameter_names=parameter_names)
    return backend, tokenizer, factories.make_retriever(cfg)


def serve(cfg: Config, weights: SharedWeights, requests: Any, results: Any, threads: int, parent: int) -> None:
    """The worker process's main: build the engine (outside the learner's launch: :data:`LAUNCH_VARIABLES`), then
    serve requests until a None arrives, the learner (``parent``) is gone, or Ctrl-C; an error of the engine or the
    rollout goes back as a RolloutFailure."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    try:
        set_torch_threads(max(threads, 1))
        backend, tokenizer, retriever = build_engine(cfg, set(weights.tensors))
        loaded = -1
        idle_since = time.perf_counter()
        while True:
            try:
                request: Optional[RolloutRequest] = requests.get(timeout=POLL_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            if request is None:
                return
            engine_wait = time.perf_counter() - idle_since
            loaded = weights.load_into(backend, loaded)
            t0 = time.perf_counter()
            seed_everything(request.seed)
            timings: dict[str, float] = {}
            model = getattr(backend, "model", None)
            with evaluating(model) if model is not None else contextlib.nullcontext():
                trajs = run_agent_loop(
                    request.rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg.rollout,
                    n=cfg.rollout.n, template=cfg.data.prompt_template, chat_template=cfg.data.chat_template,
                    seed=request.seed, timings=timings)
            for t in trajs:
                t.policy_version = loaded
            results.put(RolloutResult(step=request.step, trajectories=trajs, version=loaded,
                                      published_at_end=int(weights.version.value), rollout_s=time.perf_counter() - t0,
                                      engine_wait_s=engine_wait, timings=timings))
            idle_since = time.perf_counter()
    except KeyboardInterrupt:
        return
    except Exception:  # the learner raises it: a restart would fail the same way
        results.put(RolloutFailure(traceback.format_exc(limit=-8)))


class WorkerProcess:
    """The learner's handle on one rollout worker process (module docstring)."""

    def __init__(self, cfg: Config, weights: SharedWeights, ctx: Any, threads: tuple[int, int]) -> None:
        """``threads``: (the learner's, the worker's) torch threads while the worker runs (placement.thread_split);
        the learner's own setting comes back at :meth:`close`."""
        self.cfg, self.weights, self.ctx = cfg, weights, ctx
        self.learner_threads, self.threads = threads
        self.threads_before: Optional[int] = None
        self.process: Any = None
        self.requests: Any = None
        self.results: Any = None

    @property
    def pid(self) -> Optional[int]:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """A fresh worker with fresh queues; the learner keeps its share of the threads."""
        if self.threads_before is None:
            self.threads_before = torch.get_num_threads()
            set_torch_threads(self.learner_threads)
        self.requests, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.process = self.ctx.Process(target=serve, name="rollout-worker", daemon=True,
                                        args=(self.cfg, self.weights, self.requests, self.results, self.threads,
                                              os.getpid()))
        self.process.start()

    def send(self, request: RolloutRequest) -> None:
        self.requests.put(request)

    def receive(self, timeout: float) -> Optional[RolloutResult | RolloutFailure]:
        """The next result (or the worker's failure), or None after ``timeout`` seconds without one."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def restart(self) -> None:
        """The dead worker's process and queues dropped, a new one started."""
        self._stop(grace_s=0.0)
        self.start()

    def close(self) -> None:
        """Ask the worker to leave, wait up to :data:`CLOSE_S`, then terminate it (and kill it if it stays); the
        learner's threads as they were."""
        if self.process is not None and self.process.is_alive():
            try:
                self.requests.put(None)
            except (OSError, ValueError):
                pass
        self._stop(grace_s=CLOSE_S)
        if self.threads_before is not None:
            set_torch_threads(self.threads_before)
            self.threads_before = None

    def _stop(self, grace_s: float) -> None:
        if self.process is None:
            return
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(CLOSE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for q in (self.requests, self.results):
            q.cancel_join_thread()
            q.close()
        self.process = None
