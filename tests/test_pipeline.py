"""The rollout pipeline of trainer.staleness >= 1 without processes: the schedule, the staleness bound under random
completion timings and worker deaths (hypothesis), resume's sampler state, the placement's thread split and rank
plan, the weights' broadcast stream, and the config's refusals."""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1_lld.config import ConfigError, load_config
from searchr1_lld.learner.pipeline.broadcast import broadcast_weights
from searchr1_lld.placement import check_split_launch, rank_plan, set_torch_threads, thread_split
from searchr1_lld.learner.pipeline.rollouts import RolloutPipeline
from searchr1_lld.learner.pipeline.window import (RolloutFailure, RolloutRequest, RolloutResult, StalenessError,
                                                  StalenessWindow, check_bound, staleness_metrics)
from searchr1_lld.rollout.types import Trajectory


def _result(step: int, versions: list[int], end: int | None = None) -> RolloutResult:
    trajs = [Trajectory(row={"id": f"{step}"}, group_id=0, prompt_ids=[1], policy_version=v) for v in versions]
    return RolloutResult(step=step, trajectories=trajs, version=min(versions),
                         published_at_end=end if end is not None else max(versions), rollout_s=0.0, engine_wait_s=0.0)


def test_the_window_requests_k_steps_ahead_and_one_more_once_a_batch_arrives():
    w = StalenessWindow(2, start=5)
    assert w.due(5, received=False) == [5, 6]  # before step 5's batch: steps 5 .. 5 + k - 1
    for s in (5, 6):
        w.add(RolloutRequest(s, [], 0), {"cursor": s})
    assert w.due(5, received=False) == []
    assert w.due(5, received=True) == [7]  # step 5's batch in: step 5 + k
    with pytest.raises(ValueError, match="step order"):
        w.add(RolloutRequest(9, [], 0), {})
    assert w.take(_result(5, [5])) and not w.take(_result(5, [5]))  # a duplicate is never taken twice
    assert w.sampler_state_to_save({"cursor": 99}) == {"cursor": 6}  # before the oldest request in flight
    assert w.take(_result(6, [5]))
    assert w.sampler_state_to_save({"cursor": 99}) == {"cursor": 99}
    with pytest.raises(ValueError):
        StalenessWindow(0, start=0)


def test_the_bound_and_the_metrics_of_a_batch():
    r = _result(7, [5, 6, 6, 7], end=8)
    assert staleness_metrics(r, 7) == {"async/staleness_mean": (2 + 1 + 1 + 0) / 4, "async/staleness_max": 2.0,
                                       "async/version_lag": 3.0}  # 8 - 5: published while it was generated
    check_bound(r, 7, staleness=2)
    with pytest.raises(StalenessError, match=r"outside \[6, 7\]"):
        check_bound(r, 7, staleness=1)
    with pytest.raises(StalenessError):
        check_bound(_result(3, [4]), 3, staleness=2)  # weights newer than the step's own: a bug


class _ThreadWorld:
    """A learner's published version and a worker thread that serves requests in order, each with the newest
    version when it starts, taking a random time; it may die (a fault) at a request's start."""

    def __init__(self, delays: list[float], deaths: set[int]) -> None:
        self.published = 0
        self.delays, self.deaths = delays, deaths
        self.served = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    # the publisher
    def publish(self, named, version: int) -> float:
        with self.lock:
            self.published = version
        return 0.0

    # the transport
    def start(self) -> None:
        self.requests, self.results, self.dead = queue.Queue(), queue.Queue(), threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(self.requests, self.results, self.dead), daemon=True)
        self.thread.start()

    def _serve(self, requests, results, dead) -> None:
        while True:
            request = requests.get()
            if request is None:
                return
            with self.lock:
                version, n = self.published, self.served
                self.served += 1
            if n in self.deaths:
                dead.set()
                return
            time.sleep(self.delays[n % len(self.delays)])
            trajs = [Trajectory(row=row, group_id=i, prompt_ids=[1], policy_version=version)
                     for i, row in enumerate(request.rows)]
            results.put(RolloutResult(request.step, trajs, version, self.published, 0.0, 0.0))

    def send(self, request) -> None:
        self.requests.put(request)

    def receive(self, timeout: float):
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return not self.dead.is_set()

    def restart(self) -> None:
        self.start()

    def close(self) -> None:
        self.requests.put(None)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(staleness=st.integers(1, 3), steps=st.integers(1, 7),
       rollout_ms=st.lists(st.integers(0, 4), min_size=1, max_size=8),
       update_ms=st.lists(st.integers(0, 4), min_size=1, max_size=8),
       deaths=st.sets(st.integers(0, 10), max_size=2))
def test_no_batch_holds_a_trajectory_older_than_k_and_every_step_trains_its_own_rows_once(
        staleness, steps, rollout_ms, update_ms, deaths):
    world = _ThreadWorld([ms / 1000 for ms in rollout_ms], deaths)
    cursor = {"cursor": 0}

    def draw_rows():
        cursor["cursor"] += 1
        return [{"id": f"row{cursor['cursor'] - 1}"}]

    pipe = RolloutPipeline(staleness, world, world, start=0, draw_rows=draw_rows, sampler_state=lambda: dict(cursor),
                           seed_of=lambda s: 1000 + s, max_restarts=len(deaths), poll_s=0.002)
    pipe.start([], version=0)
    trained = []
    for t in range(steps):
        result, metrics = pipe.batch(t)  # raises StalenessError on a violation
        versions = [tr.policy_version for tr in result.trajectories]
        assert all(0 <= t - v <= staleness for v in versions)
        assert metrics["async/staleness_max"] <= staleness
        trained.append(result.trajectories[0].row["id"])
        time.sleep(update_ms[t % len(update_ms)] / 1000)
        pipe.publish([], version=t + 1)
    pipe.close()
    assert trained == [f"row{t}" for t in range(steps)]  # in order, none twice, none skipped
    # what a checkpoint after the last step records: the sampler before the rows of the oldest request in flight
    assert pipe.sampler_state_to_save() == {"cursor": steps}


def test_a_worker_that_keeps_dying_fails_the_run_after_max_restarts():
    world = _ThreadWorld([0.0], deaths={0, 1, 2})
    pipe = RolloutPipeline(1, world, world, start=0, draw_rows=lambda: [{"id": "r"}], sampler_state=dict,
                           seed_of=lambda s: s, max_restarts=2, poll_s=0.002)
    pipe.start([], version=0)
    with pytest.raises(RuntimeError, match="died 3 times"):
        pipe.batch(0)


def test_a_worker_whose_rollout_raised_stops_the_run_with_its_error():
    world = _ThreadWorld([0.0], deaths=set())
    world._serve = lambda requests, results, dead: results.put(RolloutFailure("RuntimeError: retriever down"))
    pipe = RolloutPipeline(1, world, world, start=0, draw_rows=lambda: [{"id": "r"}], sampler_state=dict,
                           seed_of=lambda s: s, max_restarts=3, poll_s=0.002)
    pipe.start([], version=0)
    with pytest.raises(RuntimeError, match="the rollout worker failed: RuntimeError: retriever down"):
        pipe.batch(0)
    assert pipe.restarts == 0


def test_one_step_off_policy_trains_step_t_plus_1_on_version_t():
    """k = 1 with a worker much faster than the update: from step 1 on every batch is exactly one version old."""
    world = _ThreadWorld([0.0], deaths=set())
    pipe = RolloutPipeline(1, world, world, start=0, draw_rows=lambda: [{"id": "r"}], sampler_state=dict,
                           seed_of=lambda s: s, max_restarts=0, poll_s=0.002)
    pipe.start([], version=0)
    ages = []
    for t in range(4):
        result, _ = pipe.batch(t)
        ages.append(t - result.version)
        time.sleep(0.02)  # the update; the worker finishes step t + 1's rollout meanwhile, with version t
        pipe.publish([], version=t + 1)
    pipe.close()
    assert ages == [0, 1, 1, 1]


def test_thread_split():
    assert thread_split(2, 0) == (1, 1)
    assert thread_split(16, 0) == (8, 8)
    assert thread_split(16, 4) == (12, 4)
    assert thread_split(4, 9) == (1, 3)  # each side keeps one
    assert thread_split(1, 0) == (1, 1)  # a one-thread machine still runs both sides


def test_a_thread_count_torch_did_not_take_is_a_warning(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(before + 1) == before + 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

    def skip_set_num_threads(n: int) -> None:  # what vLLM's CPU worker puts in its place
        pass

    monkeypatch.setattr(torch, "set_num_threads", skip_set_num_threads)
    with pytest.warns(RuntimeWarning, match=rf"asked torch for {before + 1} threads, it uses {before}.*skip_set_num"):
        assert set_torch_threads(before + 1) == before


def test_the_rank_plan_of_a_split_gpu_launch():
    plan = rank_plan(8, 2)
    assert plan.learner_ranks == (0, 1, 2, 3, 4, 5) and plan.rollout_ranks == (6, 7)
    assert [plan.role(r) for r in (0, 5, 6, 7)] == ["learner", "learner", "rollout", "rollout"]
    assert plan.source == 0 and plan.broadcast_ranks == (0, 6, 7)
    for bad in (0, 8):
        with pytest.raises(ConfigError, match="trainer.placement.rollout_gpus"):
            rank_plan(8, bad)
    split = ["trainer.staleness=1", "trainer.placement.kind=split",
             "algorithm.rollout_correction.preset=decoupled_token_is", "trainer.placement.rollout_gpus=2",
             "trainer.train_batch_size=12", "trainer.ppo_mini_batch_size=12"]
    assert check_split_launch(load_config(None, split).validate(), 8, on_gpu=False) is None  # CPU: a worker process
    assert check_split_launch(load_config(None, split).validate(), 8, on_gpu=True).rollout_ranks == (6, 7)
    with pytest.raises(ConfigError, match="must divide over them"):  # 16 prompts over 6 learner ranks
        sixteen = load_config(None, [*split, "trainer.train_batch_size=16", "trainer.ppo_mini_batch_size=16"])
        check_split_launch(sixteen.validate(), 8, on_gpu=True)


def test_the_weights_broadcast_stream_delivers_the_source_tensors_in_order():
    """A stand-in wire for torch.distributed.broadcast: the source's buffers are copied into the receiver's."""
    source = {"a.weight": torch.arange(6.0).view(2, 3), "b.bias": torch.tensor([7.0, 8.0])}
    shapes = {n: (t.shape, t.dtype) for n, t in source.items()}
    wire: list[torch.Tensor] = []

    def send(buf, src, group):
        assert src == 0 and group == "g"
        wire.append(buf.clone())

    def receive(buf, src, group):
        buf.copy_(wire.pop(0))

    sent = list(broadcast_weights(source.items(), shapes, group="g", source=0, is_source=True, device="cpu",
                                  broadcast=send))
    received = dict(broadcast_weights([], shapes, group="g", source=0, is_source=False, device="cpu",
                                      broadcast=receive))
    assert [n for n, _ in sent] == list(source)
    assert all(torch.equal(received[n], source[n]) for n in source)
    with pytest.raises(ValueError, match="out of order"):
        list(broadcast_weights(reversed(list(source.items())), shapes, group="g", source=0, is_source=True,
                               device="cpu", broadcast=send))


@pytest.mark.parametrize("overrides, key, reason", [
    (["trainer.staleness=1"], "trainer.placement.kind", "sleep / wake"),  # a colocated launch with k > 0
    (["trainer.placement.kind=split"], "trainer.staleness", "must be >= 1"),
    (["trainer.staleness=1", "trainer.placement.kind=split"], "algorithm.rollout_correction.mode", "pi_proximal"),
    (["trainer.staleness=1", "trainer.placement.kind=split", "algorithm.rollout_correction.preset=bypass_ppo_clip"],
     "algorithm.rollout_correction.bypass", "proximal"),
    (["trainer.staleness=1", "trainer.placement.kind=split", "algorithm.rollout_correction.preset=decoupled_token_is",
      "algorithm.dynamic_sampling.enabled=true"], "algorithm.dynamic_sampling.enabled", "rounds"),
    (["trainer.staleness=1", "trainer.placement.kind=split", "algorithm.rollout_correction.preset=decoupled_token_is",
      "algorithm.advantage=remax"], "algorithm.advantage", "baselines"),
    (["trainer.staleness=-1"], "trainer.staleness", ">= 0"),
])
def test_the_config_refuses_what_a_rollout_beside_the_update_cannot_do(overrides, key, reason):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        load_config(None, overrides).validate()
    assert reason in str(err.value)


def test_a_split_run_with_the_decoupled_objective_is_accepted():
    cfg = load_config(None, ["trainer.staleness=2", "trainer.placement.kind=split",
                             "algorithm.rollout_correction.preset=decoupled_token_is"]).validate()
    assert cfg.trainer.staleness == 2 and load_config(None, []).validate().trainer.staleness == 0


def test_published_weights_reach_an_engine_through_its_contract_once_per_version():
    """SharedWeights: the learner publishes; a worker's engine receives every parameter through load_weights when a
    newer version is there, and nothing when it holds that version already."""
    from searchr1_lld.learner.pipeline.weights import SharedWeights

    class RecordingEngine:
        def __init__(self):
            self.loads: list[dict[str, torch.Tensor]] = []

        def load_weights(self, named):
            self.loads.append({n: t.clone() for n, t in named})

    model = torch.nn.Linear(2, 2)
    weights = SharedWeights(model.named_parameters(), torch.multiprocessing.get_context("spawn"))
    engine = RecordingEngine()
    assert weights.load_into(engine, loaded=-1) == -1 and not engine.loads  # nothing published yet
    weights.publish(model.named_parameters(), version=0)
    assert weights.load_into(engine, loaded=-1) == 0 and len(engine.loads) == 1  # a fresh worker's first request
    assert weights.load_into(engine, loaded=0) == 0 and len(engine.loads) == 1  # held already
    with torch.no_grad():
        model.weight.add_(1.0)
    weights.publish(model.named_parameters(), version=1)
    assert weights.load_into(engine, loaded=0) == 1
    loaded = engine.loads[-1]
    assert set(loaded) == {"weight", "bias"} and torch.equal(loaded["weight"], model.weight.detach())


def _broadcast_rank(rank: int, port: int, out: str) -> None:
    """One rank of a two-rank gloo launch split into a learner rank and a rollout rank: the learner's weights
    broadcast to the rollout rank over a group spanning both, saved by each rank."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        plan = rank_plan(2, 1)
        group = torch.distributed.new_group(list(plan.broadcast_ranks))
        torch.manual_seed(0 if plan.role(rank) == "learner" else 1)  # the rollout rank starts from other weights
        model = torch.nn.Linear(3, 2)
        shapes = {n: (p.shape, p.dtype) for n, p in model.named_parameters()}
        source = rank == plan.source
        got = dict(broadcast_weights(model.named_parameters() if source else [], shapes, group=group,
                                     source=plan.source, is_source=source, device="cpu"))
        torch.save({n: t.detach().clone() for n, t in got.items()}, f"{out}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_the_weights_cross_a_process_group_spanning_a_learner_and_a_rollout_rank(tmp_path):
    from conftest import free_port

    torch.multiprocessing.spawn(_broadcast_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    learner, rollout = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    torch.manual_seed(0)
    expected = dict(torch.nn.Linear(3, 2).named_parameters())
    assert set(rollout) == {"weight", "bias"}
    assert all(torch.equal(rollout[n], expected[n].detach()) and torch.equal(learner[n], expected[n].detach())
               for n in expected)
