"""The continuous rollout scheduler: no turn barrier.

The turn-batched loop (agent_loop.py) sends every active trajectory's turn to the engine in one call and waits for the
slowest before any can search; during the searches the engine idles. Here each trajectory moves on its own, through
the same per-trajectory rules (turn_rules.py), on an engine with a request-level API (backends/base.py:
:class:`RequestStreamBackend`, the vLLM backend's ``LLMEngine.add_request`` / ``step``):

- a trajectory's turn is one engine request (``max_tokens`` = min(``max_tokens_per_turn``, the tokens its length
  budget leaves), so no output is ever cut afterwards); the engine advances every running request by one token per
  :meth:`~RequestStreamBackend.step` and returns each request as soon as it finishes;
- a finished turn is applied at once (:func:`~searchr1_lld.rollout.turn_rules.apply_turn`): an answer or a spent
  budget ends the trajectory, an invalid action appends its message and the next turn enters the engine in the same
  iteration, a valid search joins the searches waiting for the retriever;
- retrieval runs in a worker thread while the engine keeps decoding (on this rank's GPU: PyTorch's current device
  is per thread, so the thread first sets the caller's, :func:`~searchr1_lld.distributed.set_thread_cuda_device`):
  the searches that became ready while no retrieval was running go to the retriever as ONE batch; when it returns,
  every observation is appended and those trajectories' next turns enter the engine together. One batch is in
  flight at a time (the searches that become ready meanwhile form the next), so a retriever client is never called
  from two threads at once;
- the engine idles only when every unfinished trajectory waits for the retriever (``timings['retrieve_wait_s']``).

Token bookkeeping is the turn-batched loop's: the same functions append the same ids, masks and log-probs for the
same engine outputs, so at greedy decoding the two schedulers give the same trajectories token for token
(tests/test_continuous_scheduler.py, tests/test_vllm_engine.py). Request ids are unique per process
(``rollout-<serial>``); a rollout that fails midway (the retriever, the engine) aborts its unfinished requests
before the error propagates, so the engine is clean for the next call.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from tqdm.auto import tqdm

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.distributed import set_thread_cuda_device, thread_cuda_device
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rollout.backends.base import GenerationBackend, GenerationOutput, RequestStreamBackend
from searchr1_lld.rollout.turn_rules import (RolloutClock, RolloutRun, TrajectoryState, apply_turn,
                                             finalize_trajectory, initial_states, record_search, search_batch)
from searchr1_lld.rollout.types import Trajectory

_REQUEST_SERIAL = itertools.count()  # request ids unique within the process (an engine may outlive many rollouts)


def picks_continuous(scheduler: str, streams_requests: bool, engine: str) -> bool:
    """The scheduler rule, the one place it is written (the backend kinds check a config with it, the agent loop
    picks with it): ``rollout.scheduler`` 'continuous' (the engine must have the request-level API, else ValueError
    naming ``engine``), 'turns' never, 'auto' when the engine has that API (vLLM)."""
    if scheduler not in ("auto", "turns", "continuous"):
        raise ValueError(f"rollout.scheduler must be 'auto', 'turns' or 'continuous', got {scheduler!r}")
    if scheduler == "continuous" and not streams_requests:
        raise ValueError(f"continuous needs an engine with a request-level API (add_request / step, the vllm "
                         f"backend's); {engine} runs turn by turn: set rollout.scheduler=turns")
    return scheduler == "continuous" or (scheduler == "auto" and streams_requests)


def uses_continuous_scheduler(cfg: RolloutConfig, backend: GenerationBackend) -> bool:
    """Whether ``rollout.scheduler`` picks the continuous scheduler for ``backend`` (:func:`picks_continuous`)."""
    return picks_continuous(cfg.scheduler, isinstance(backend, RequestStreamBackend), type(backend).__name__)


def run_continuous(
    rows: list[dict],
    *,
    backend: GenerationBackend,
    tokenizer: Tokenizer,
    retriever: Retriever,
    cfg: RolloutConfig,
    n: int = 1,
    greedy: bool = False,
    template: str = "tiny",
    chat_template: str = "never",
    progress: bool = False,
    timings: Optional[dict[str, float]] = None,
    seed: Optional[int] = None,
) -> list[Trajectory]:
    """Roll out ``n`` trajectories per row with the continuous scheduler (module docstring); the arguments and the
    result are :func:`~searchr1_lld.rollout.agent_loop.run_agent_loop`'s (``seed``: each request's own seed derives
    from it, so the order in which searches return, and requests enter the engine, changes no sample).
    ``timings['decode_iterations']``: the engine steps taken."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not isinstance(backend, RequestStreamBackend):
        raise ValueError(f"the continuous scheduler needs an engine with a request-level API; "
                         f"{type(backend).__name__} has none")
    clock = RolloutClock(start=time.perf_counter())
    run = RolloutRun.start(tokenizer, cfg, greedy, eos_ids=getattr(backend, "eos_ids", None), seed=seed)
    states = initial_states(rows, run, n, template, chat_template)
    _Scheduler(backend, retriever, run, clock).run(states, progress)
    for state in states:
        finalize_trajectory(state, tokenizer)
    if timings is not None:
        timings.update(clock.report(states))
    return [s.traj for s in states]


class _Scheduler:
    """One rollout's requests in the engine and its searches at the retriever (module docstring)."""

    def __init__(self, engine: RequestStreamBackend, retriever: Retriever, run: RolloutRun,
                 clock: RolloutClock) -> None:
        self.engine, self.retriever, self.run_rules, self.clock = engine, retriever, run, clock
        self.in_engine: dict[str, TrajectoryState] = {}  # request id -> its trajectory
        self.ready: list[tuple[TrajectoryState, str]] = []  # searches waiting for the next batch
        self.in_flight: Optional[Future] = None
        self.in_flight_batch: list[tuple[TrajectoryState, str]] = []

    def run(self, states: list[TrajectoryState], progress: bool) -> None:
        """Every trajectory to its end; unfinished requests aborted if anything fails."""
        bar = tqdm(total=len(states), desc="rollout trajectories", disable=not progress, leave=False)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-retrieval",
                                initializer=set_thread_cuda_device, initargs=(thread_cuda_device(),)) as pool:
            try:
                for state in states:
                    if not state.done:
                        self._submit(state)
                while self.in_engine or self.ready or self.in_flight is not None:
                    self._launch_retrieval(pool)
                    if self.in_engine:
                        self._step()
                        self._collect_retrieval(block=False)
                    else:
                        self._collect_retrieval(block=True)
                    bar.n = sum(s.done for s in states)
                    bar.refresh()
            finally:
                if self.in_engine:
                    self.engine.abort_requests(list(self.in_engine))
        bar.close()
        unfinished = sum(not s.done for s in states)
        if unfinished:  # unreachable: the final turn always finishes; kept as a loud guard
            raise RuntimeError(f"continuous scheduler ended with {unfinished} unfinished trajectories")

    def _submit(self, state: TrajectoryState) -> None:
        """The trajectory's next turn into the engine: its context, at most the tokens its budget leaves."""
        cfg = self.run_rules.cfg
        request_id = f"rollout-{next(_REQUEST_SERIAL)}"
        seed = self.run_rules.seed_of(state)
        self.engine.add_request(
            request_id, state.context(),
            max_new_tokens=min(cfg.max_tokens_per_turn, self.run_rules.budget(state.traj)),
            stop_strings=list(P.STOP_STRINGS), temperature=cfg.temperature, top_p=cfg.top_p,
            greedy=self.run_rules.greedy, **({} if seed is None else {"seed": seed}))
        self.in_engine[request_id] = state

    def _step(self) -> None:
        """One engine iteration; each turn that finished in it applied."""
        t0 = time.perf_counter()
        finished = self.engine.step()
        self.clock.generate_s += time.perf_counter() - t0
        self.clock.decode_iterations += 1
        for request_id, output in finished:
            state = self.in_engine.pop(request_id, None)
            if state is None:
                raise RuntimeError(f"the engine returned request {request_id!r}, which this rollout did not send")
            self._apply(state, output)

    def _apply(self, state: TrajectoryState, output: GenerationOutput) -> None:
        rules = self.run_rules
        searches = apply_turn(state, output, rules.budget(state.traj), rules.is_final_turn(state.traj), rules)
        if searches:
            self.ready.extend(searches)
        elif not state.done:  # an invalid action: its message is appended, the next turn goes in at once
            self._submit(state)

    def _launch_retrieval(self, pool: ThreadPoolExecutor) -> None:
        """The searches ready now, as one batch to the retriever's thread (when no batch is in flight)."""
        if self.in_flight is not None or not self.ready:
            return
        self.in_flight_batch, self.ready = self.ready, []
        queries = [q for _, q in self.in_flight_batch]
        self.in_flight = pool.submit(self._timed_search, queries)

    def _timed_search(self, queries: list[str]) -> tuple[list[list[dict]], float]:
        t0 = time.perf_counter()
        results = search_batch(self.retriever, queries, self.run_rules, where="continuous rollout")
        return results, time.perf_counter() - t0

    def _collect_retrieval(self, block: bool) -> None:
        """The batch in flight, once back (``block``: wait for it, the engine has nothing to run): observations
        appended, those trajectories' next turns into the engine."""
        if self.in_flight is None or (not block and not self.in_flight.done()):
            return
        t0 = time.perf_counter()
        results, seconds = self.in_flight.result()  # re-raises the retriever's error, with its note
        if block:
            self.clock.retrieve_wait_s += time.perf_counter() - t0
        self.clock.retrieve_s += seconds
        batch, self.in_flight, self.in_flight_batch = self.in_flight_batch, None, []
        for (state, query), hits in zip(batch, results):
            record_search(state, query, hits, self.run_rules)
            if not state.done:
                self._submit(state)
