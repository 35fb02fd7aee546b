"""The trainer drives the engine contract in order, on every rank: rollout -> sleep -> updates -> load_weights -> wake_up.

A recording fake backend (real HF generation on the learner's module, every contract call logged) runs inside a real
Trainer on the tiny world, for the ZeRO-0, ZeRO-2 and ZeRO-3 shapes of the weight-sync code path; the ZeRO-3 stream
itself (one module gathered at a time, tied weights once) is checked with fake accelerator objects.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from searchr1_lld.config import load_config
from searchr1_lld.learner.engines import AccelerateEngine, DeepSpeedEngine
from searchr1_lld.learner.weight_sync import iter_gathered_named_parameters
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.learner.trainer import Trainer

from conftest import on_world
from test_trainer import SMALL


class RecordingBackend:
    """Wraps a real backend; logs every contract call into ``events`` (shared with the optimizer / gather hooks)."""

    def __init__(self, inner, events):
        self.inner, self.events = inner, events
        self.streams: list[list[tuple[str, torch.Tensor]]] = []
        self.vocab_limit = inner.vocab_limit

    def generate(self, prompts, **kw):
        self.events.append("generate")
        return self.inner.generate(prompts, **kw)

    def sleep(self):
        self.events.append("sleep")
        self.inner.sleep()

    def wake_up(self):
        self.events.append("wake_up")
        self.inner.wake_up()

    def load_weights(self, named_tensors):
        self.events.append("load_weights")
        got = []
        for name, t in named_tensors:  # consumed one at a time, copied before the next is requested
            self.events.append("tensor")
            got.append((name, t.detach().clone()))
        self.streams.append(got)
        self.inner.load_weights(iter(got))


def recording_gather(events):
    @contextlib.contextmanager
    def gather(params):
        events.append(("gather", len(params)))
        yield
        events.append("release")

    return gather


def _collapse(events):
    """Runs of repeated events -> one entry ('generate', 'update', 'tensor', gathers dropped)."""
    out = []
    for e in events:
        e = e if isinstance(e, str) else "gather"
        if e in ("gather", "release", "tensor"):
            continue
        if out and out[-1] == e and e in ("generate", "update"):
            continue
        out.append(e)
    return out


def attach_recording_engine(tr, events: list):
    """Give trainer ``tr`` an engine holding its own copy of the policy (as vLLM does, so the weight stream is really
    read and applied), recording its calls and every optimiser step into ``events``. Returns the engine's model."""
    learner = tr.learner.module
    engine_model = type(learner)(learner.config)
    engine_model.load_state_dict(learner.state_dict())
    # the trainer generates through its backend, the step puts it to sleep, streams it the weights and wakes it
    tr.learner.backend = RecordingBackend(HFBackend(engine_model, tr.learner.tokenizer), events)
    opt = getattr(tr.learner.optimizer, "optimizer", tr.learner.optimizer)
    opt.register_step_post_hook(lambda *a: events.append("update"))
    return engine_model


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_trainer_drives_the_engine_in_order(tmp_path, tiny_world, shared_retriever, monkeypatch, stage):
    events: list = []
    cfg = load_config(None, SMALL + [f"trainer.output_dir={tmp_path}", "trainer.run_name=run", "trainer.probe_every=0"])
    tr = Trainer(on_world(cfg, tiny_world), retriever=shared_retriever)
    # the weights the DeepSpeed engine of that ZeRO stage hands over, through a recording gather (patched after
    # set-up: a real ZeRO-3 set-up needs a DeepSpeed model; the update itself stays the plain engine's)
    zero = DeepSpeedEngine(tr.learner.accelerator, stage)
    monkeypatch.setattr(tr.learner.engine, "named_weights", lambda module: (
        iter_gathered_named_parameters(module, recording_gather(events)) if stage == 3 else zero.named_weights(module)))
    learner = tr.learner.module
    engine_model = attach_recording_engine(tr, events)

    tr.train_step()
    tr.train_step()

    step = ["generate", "sleep", "update", "load_weights", "wake_up"]
    assert _collapse(events) == step + step
    n_params = len(list(learner.parameters()))
    for stream in tr.learner.backend.streams:
        assert [n for n, _ in stream] == [n for n, _ in learner.named_parameters()]  # every weight once, in order
    assert events.count("tensor") == 2 * n_params
    gathers = [e for e in events if isinstance(e, tuple)]
    if stage == 3:
        assert sum(n for _, n in gathers) == 2 * n_params  # each parameter gathered exactly once per sync
        first = events.index("load_weights")
        assert isinstance(events[first + 1], tuple) and events[first + 2] == "tensor"  # gathered, then streamed
    else:
        assert gathers == []
    for (name, p), (_, q) in zip(learner.named_parameters(), engine_model.named_parameters()):
        assert torch.equal(p.detach(), q.detach()), name  # the engine holds the updated weights


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.body = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied embeddings


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_sync_streams_each_weight_once_one_module_gathered_at_a_time(stage):
    model = Tied()
    active: list[set[int]] = []
    log: list = []

    @contextlib.contextmanager
    def gather(params):
        assert not active, "two modules gathered at once"
        active.append({id(p) for p in params})
        yield
        active.pop()

    class Backend:
        def load_weights(self, named):
            for name, t in named:
                owner = dict(model.named_parameters())[name]
                log.append((name, bool(active) and id(owner) in active[0]))

    named = iter_gathered_named_parameters(model, gather) if stage == 3 else AccelerateEngine(None).named_weights(model)
    Backend().load_weights(named)
    names = [n for n, _ in log]
    assert names == ["embed.weight", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"]  # tied: once
    assert all(gathered for _, gathered in log) == (stage == 3) and any(g for _, g in log) == (stage == 3)


def test_zero3_stream_with_deepspeeds_own_gather_on_plain_parameters():
    model = Tied()
    got = list(iter_gathered_named_parameters(model))
    assert [n for n, _ in got] == ["embed.weight", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"]
    assert torch.equal(got[0][1], model.embed.weight)


RANK_SCRIPT = r"""
import json, sys
sys.path.insert(0, "tests")
from searchr1_lld.config import load_config
from searchr1_lld.learner.trainer import Trainer
from conftest import on_world
from test_engine_order import _collapse, attach_recording_engine
from test_trainer import SMALL
world, out = sys.argv[1], sys.argv[2]
cfg = load_config(None, SMALL + [f"trainer.output_dir={out}", "trainer.run_name=r", "trainer.probe_every=0",
                                 "trainer.device=cpu", "trainer.train_batch_size=4", "trainer.ppo_mini_batch_size=2"])
tr = Trainer(on_world(cfg, world))
events = []
learner = tr.learner.module
engine = attach_recording_engine(tr, events)
tr.train_step()
same = all(bool((p.detach() == q.detach()).all()) for p, q in zip(learner.parameters(), engine.parameters()))
# one file per rank: two ranks printing to one pipe can interleave their lines
import os
os.makedirs(out, exist_ok=True)
with open(f"{out}/result-{tr.learner.dist.rank}.json", "w") as f:
    json.dump({"rank": tr.learner.dist.rank, "world": tr.learner.dist.world_size, "order": _collapse(events), "engine_synced": same}, f)
"""


@pytest.mark.slow
def test_every_rank_drives_the_engine_in_order(tmp_path, tiny_world):
    """Two real processes (torch.distributed.run, gloo, DDP on CPU): each rank's recorded order and synced engine."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO_ROOT, free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    script = tmp_path / "rank_order.py"
    script.write_text(RANK_SCRIPT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(script), str(tiny_world), str(tmp_path / "runs")], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    results = sorted((json.loads(p.read_text()) for p in (tmp_path / "runs").glob("result-*.json")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    for r in results:
        assert r["order"] == ["generate", "sleep", "update", "load_weights", "wake_up"], r
        assert r["engine_synced"], r


@pytest.fixture(scope="module")
def shared_retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def test_trainer_applies_rollout_correction(tmp_path, tiny_world, shared_retriever, monkeypatch):
    from searchr1_lld.learner import step
    seen = []
    real = step.objective

    def spy(*args, token_weights=None, **kw):  # what the step hands the objective
        seen.append(token_weights)
        return real(*args, token_weights=token_weights, **kw)

    monkeypatch.setattr(step, "objective", spy)
    cfg = load_config(None, SMALL + [f"trainer.output_dir={tmp_path}", "trainer.run_name=run", "trainer.probe_every=0",
                                     "algorithm.rollout_correction.mode=token", "algorithm.rollout_correction.cap=1.5"])
    tr = Trainer(on_world(cfg, tiny_world), retriever=shared_retriever)
    m = tr.train_step()
    # the HF engine samples with the learner's own fp32 module: the two log-probs agree, the weights are ~1
    assert m["rollout/engine_learner_logp_gap"] < 1e-3
    assert abs(m["rollout/tis_weight_mean"] - 1) < 1e-3 and m["rollout/tis_capped_frac"] == 0.0
    assert seen and all(w is not None and w.shape[0] > 0 for w in seen)
    assert all(torch.allclose(w, torch.ones_like(w), atol=1e-3) for w in seen)
    tr.cfg.algorithm.rollout_correction.mode = "off"
    seen.clear()
    m = tr.train_step()
    assert "rollout/tis_weight_mean" not in m and seen and all(w is None for w in seen)
