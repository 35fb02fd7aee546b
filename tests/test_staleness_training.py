"""trainer.staleness on the tiny world: k = 0 is the synchronous step (no pipeline built, the step called as it always
was); k = 1 trains in two processes, checkpoints, resumes, survives a killed rollout worker, trains every prompt batch
once in the sampler's order, and stops both processes within seconds on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import torch

from searchr1_lld.config import load_config
from searchr1_lld.learner import pipeline, sampling, step
from searchr1_lld.learner.batching import PromptSampler
from searchr1_lld.learner.pipeline.rollouts import RolloutPipeline
from searchr1_lld.learner.trainer import Trainer

from conftest import REPO_ROOT, on_world, world_args
from test_trainer import SMALL, shared_retriever  # noqa: F401  (a module fixture)

ONE_STEP_OFF = ["trainer.staleness=1", "trainer.placement.kind=split",
                "algorithm.rollout_correction.preset=decoupled_token_is"]


def _cfg(tmp_path, *extra):
    return load_config(None, SMALL + [f"trainer.output_dir={tmp_path}", "trainer.run_name=run", *extra])


def _mixed_rewards(trajectories):
    """The untrained test policy rarely answers right: every group one correct and one wrong response (rollout.n=2)."""
    for i, t in enumerate(trajectories):
        t.reward = float(i % 2 == 0)
    return trajectories


def _params(trainer):
    return [p.detach().clone() for p in trainer.learner.model.parameters()]


def test_staleness_0_builds_no_pipeline_and_calls_the_step_as_before(tmp_path, tiny_world, shared_retriever,
                                                                    monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pipeline was built with trainer.staleness=0")

    calls = []
    real_step = step.train_step

    def recorded(*args, **kwargs):
        calls.append(sorted(kwargs))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(pipeline, "process_pipeline", refuse)
    monkeypatch.setattr(step, "train_step", recorded)
    tr = Trainer(on_world(_cfg(tmp_path, "trainer.total_steps=2", "trainer.save_every=0"), tiny_world),
                 retriever=shared_retriever)
    res = tr.run(evaluate=False)
    assert tr.pipeline is None and res.steps == 2
    assert calls == [["detector", "history", "more_rows", "probe", "step"]] * 2  # no rollout handed in
    assert not any(k.startswith("async/") for h in res.history for k in h)


def test_a_rollout_handed_to_the_step_trains_as_the_steps_own_rollout(tmp_path, tiny_world, shared_retriever):
    """The step's ``sampled`` path (what a pipelined step trains) against the synchronous step: the same rollout
    (same weights, same seed) gives the same weights bit for bit."""
    cfg = on_world(_cfg(tmp_path, "trainer.total_steps=1", "trainer.save_every=0"), tiny_world)
    own, handed = (Trainer(cfg, retriever=shared_retriever) for _ in range(2))
    for tr in (own, handed):
        rollout = tr.learner.rollout
        tr.learner.rollout = lambda rows, _roll=rollout, **kw: _mixed_rewards(_roll(rows, **kw))
    initial = _params(own)
    own.train_step()
    rows = handed.next_rows()
    seed = step.step_seed(cfg.trainer.seed, 0, 0, 1)
    step.seed_everything(seed)
    sampled = sampling.rollout_step(handed.learner, rows, seed=seed)
    step.train_step(handed.learner, rows, step=0, probe=handed.probe, detector=handed.detector, history=[],
                    sampled=sampled)
    for a, b in zip(own.learner.model.parameters(), handed.learner.model.parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(own.learner.model.parameters(), initial))  # it did train


def test_one_step_off_policy_in_two_processes_checkpoints_resumes_and_survives_a_killed_worker(
        tmp_path, tiny_world, shared_retriever, monkeypatch):
    trained_rows: list[list[str]] = []
    responses: list[list[list[int]]] = []
    real_step = step.train_step

    def recorded(learner, rows, **kwargs):
        trained_rows.append([t.row["id"] for t in kwargs["sampled"].trajectories[:: learner.cfg.rollout.n]])
        responses.append([t.response_ids for t in kwargs["sampled"].trajectories])
        _mixed_rewards(kwargs["sampled"].trajectories)
        return real_step(learner, rows, **kwargs)

    monkeypatch.setattr(step, "train_step", recorded)
    common = [*ONE_STEP_OFF, "trainer.save_every=1", "trainer.keep_last_k=4", "trainer.resume=auto"]
    first = Trainer(on_world(_cfg(tmp_path, *common, "trainer.total_steps=2"), tiny_world), retriever=shared_retriever)
    initial = _params(first)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # split 1 + 1 while the worker runs, given back after
    try:
        res = first.run(evaluate=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert any(not torch.equal(a, b) for a, b in zip(_params(first), initial))  # it trained
    assert first.pipeline is None  # closed at the end of the run
    assert [h["async/staleness_max"] for h in res.history] == [0.0, 1.0]  # step 2 trains version 1's rollout
    # the worker rolls out as the synchronous step does: step 0 (version 0, its seed) samples the same tokens
    sync = Trainer(on_world(_cfg(tmp_path / "sync", "trainer.total_steps=1"), tiny_world), retriever=shared_retriever)
    seed = step.step_seed(0, 0, 0, 1)
    step.seed_everything(seed)
    assert [t.response_ids for t in sampling.rollout_step(sync.learner, sync.next_rows(), seed=seed).trajectories] \
        == responses[0]
    state = json.loads((first.run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    # step 3's rows (cursor 4 .. 5) were in flight at the checkpoint: it records the sampler before them
    assert state["data"] == {"epoch": 0, "cursor": 4}

    real_batch = RolloutPipeline.batch
    killed = []

    def kill_before_step_3(self, t):
        if t == 2 and not killed:
            killed.append(self.transport.pid)
            os.kill(self.transport.pid, signal.SIGKILL)
        return real_batch(self, t)

    monkeypatch.setattr(RolloutPipeline, "batch", kill_before_step_3)
    second = Trainer(on_world(_cfg(tmp_path, *common, "trainer.total_steps=4"), tiny_world),
                     retriever=shared_retriever)
    res = second.run(evaluate=False, allow_changes=("trainer.total_steps",))
    assert killed and not psutil.pid_exists(killed[0])  # the dead worker was reaped, a new one served steps 3 and 4
    assert [h["step"] for h in res.history] == [1, 2, 3, 4]
    assert [h["async/worker_restarts"] for h in res.history[2:]] == [1.0, 1.0]
    assert all(h["async/staleness_max"] <= 1 for h in res.history)
    # every batch of the sampler trained once, in order, across the checkpoint, the resume and the killed worker
    sampler = PromptSampler(second.train_rows, 2, 0)
    assert trained_rows == [[r["id"] for r in sampler.next_batch()] for _ in range(4)]
    # the decoupled objective's behaviour weight is live: the stale batches' tokens weigh pi_prox / pi_behav != 1
    assert all(h["rollout/tis_weight_max"] > 1.0 or h["rollout/tis_weight_min"] < 1.0 for h in res.history[2:])


def test_ctrl_c_stops_the_learner_and_the_rollout_worker_within_seconds(tmp_path, tiny_world):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, "train.py", *world_args(tiny_world), *SMALL, *ONE_STEP_OFF, "trainer.total_steps=500",
            f"trainer.output_dir={tmp_path}", "trainer.run_name=run", "trainer.save_every=0", "--no-eval"]
    # SIGINT at its default action, as a terminal starts it (a suite run in the background inherits it ignored), in a
    # process group of its own (Ctrl-C reaches the terminal's foreground group: the learner and its worker)
    proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):  # the worker has served steps
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step logged"
        time.sleep(0.2)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers, "no rollout worker process"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at the terminal sends: to the whole foreground group
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    stopped = time.monotonic() - t0
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert proc.returncode == 130 and "interrupted" in err, err[-3000:]
    assert not alive and stopped < 15, (stopped, alive)


def test_with_a_rollout_worker_the_learner_evaluates_on_its_own_module_and_builds_no_second_engine(
        tmp_path, tiny_world, shared_retriever, monkeypatch):
    """rollout.backend=vllm with trainer.staleness=1: the worker builds the vLLM engine; the learner's own engine (its
    evaluations, the probe set) is the transformers backend on its module, turn by turn."""
    from searchr1_lld.learner.state import Learner
    from searchr1_lld.rollout.backends.hf import HFBackend
    from searchr1_lld.rollout.backends.kinds import VLLMKind

    def refuse(*args, **kwargs):
        raise AssertionError("the learner built a vLLM engine beside its rollout worker's")

    monkeypatch.setattr(VLLMKind, "build", refuse)
    cfg = on_world(_cfg(tmp_path, *ONE_STEP_OFF, "rollout.backend=vllm"), tiny_world)
    learner = Learner.build(cfg, total_updates=2, retriever=shared_retriever)
    assert isinstance(learner.backend, HFBackend) and learner.backend.model is learner.module
    assert (learner.rollout_cfg.backend, learner.rollout_cfg.scheduler) == ("hf", "turns")
    assert cfg.rollout.backend == "vllm"  # the worker's engine, as configured
    rows = [{"id": "q", "question": "Who founded Brelm?", "golden_answers": ["x"], "data_source": "synthetic"}]
    assert learner.evaluate(rows)["n"] == 1.0
    # synchronous: the learner's engine is the run's own
    sync = on_world(_cfg(tmp_path / "sync"), tiny_world)
    assert Learner.build(sync, total_updates=2, retriever=shared_retriever).rollout_cfg is sync.rollout
