"""The step's rollout-to-batch path (learner/sampling.py): DAPO's dynamic sampling (more rounds of prompts until the
batch holds its groups, surplus cut, the cap and its fill logged, every rank running the same rounds), the greedy
baselines of REMAX and the soft overlong punishment, on fake rollouts and on training steps of the test world whose
engine is a scripted backend (tests/scripted_backends.py) that answers each prompt right or wrong by plan."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from searchr1_lld import distributed
from searchr1_lld.algo import advantages
from searchr1_lld.algo.batch_filters import get_batch_filter
from searchr1_lld.learner import sampling
from searchr1_lld.rollout.types import Trajectory

N = 2  # responses per prompt in these tests


def _stream(pattern):
    """A prompt stream of rows 0, 1, 2, ... (two per draw) and a rollout whose rewards follow ``pattern(row, k)``."""
    cursor = [0]

    def more_rows():
        rows = [{"id": cursor[0] + i} for i in range(2)]
        cursor[0] += 2
        return rows

    def roll(rows, round_index):
        return [Trajectory(row=r, group_id=g, prompt_ids=[1], reward=float(pattern(r["id"], k)))
                for g, r in enumerate(rows) for k in range(N)]

    return more_rows, roll, cursor


def _sample(pattern, max_rounds, any_rank=lambda flag: flag):
    more_rows, roll, cursor = _stream(pattern)
    out = sampling.sample_groups(roll, more_rows(), more_rows=more_rows, keep=get_batch_filter("nonzero_std"),
                                 max_rounds=max_rounds, any_rank=any_rank)
    return out, cursor[0]


def test_more_rounds_until_the_batch_is_full_and_the_surplus_cut():
    # row 0: both right (dropped); rows 1, 2, 3: one right, one wrong (kept). Round 1 keeps 1 of 2 groups, round 2
    # two more: the batch is rows 1 and 2, row 3 is surplus
    out, drawn = _sample(lambda row, k: row % 4 == 0 or k == 0, max_rounds=10)
    assert (out.rounds, out.prompts, out.kept, out.filled, drawn) == (2, 4, 3, 0, 4)
    assert [t.row["id"] for t in out.batch] == [1, 1, 2, 2] and [t.group_id for t in out.batch] == [0, 0, 1, 1]
    assert len(out.generated) == 8


def test_the_cap_fills_the_batch_from_dropped_groups():
    # only row 3 has a right and a wrong answer: two rounds keep one group, the first dropped one (row 0) fills
    out, drawn = _sample(lambda row, k: row % 4 == 3 and k == 0, max_rounds=2)
    assert (out.rounds, out.prompts, out.kept, out.filled, drawn) == (2, 4, 1, 1, 4)
    assert [t.row["id"] for t in out.batch] == [3, 3, 0, 0] and [t.group_id for t in out.batch] == [0, 0, 1, 1]
    one, drawn = _sample(lambda row, k: False, max_rounds=1)  # one round: no collective, no second draw
    assert (one.rounds, one.filled, drawn, len(one.batch)) == (1, 2, 2, 4)


def test_a_full_rank_runs_the_rounds_its_peer_needs():
    """This rank's first round keeps both groups, a peer's does not: every rank runs the second round (agreed by
    any_rank), and the surplus is cut."""
    flags = []

    def peer_needs_one_more(flag):
        flags.append(flag)
        return flag or len(flags) == 1

    out, drawn = _sample(lambda row, k: k == 0, max_rounds=5, any_rank=peer_needs_one_more)
    assert flags == [False, False] and (out.rounds, out.prompts, out.kept, drawn) == (2, 4, 4, 4)
    assert [t.row["id"] for t in out.batch] == [0, 0, 1, 1]


def _rank_rounds(rank: int, world: int, port: int, out_dir: str) -> None:
    """One of two gloo processes: rank 0 fills its batch in round 1, rank 1 only in round 3."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    accelerator = SimpleNamespace(num_processes=world, device=torch.device("cpu"))
    pattern = (lambda row, k: k == 0) if rank == 0 else (lambda row, k: row >= 4 and k == 0)
    more_rows, roll, _ = _stream(pattern)
    out = sampling.sample_groups(roll, more_rows(), more_rows=more_rows, keep=get_batch_filter("nonzero_std"),
                                 max_rounds=5, any_rank=functools.partial(distributed.any_rank, accelerator))
    (prompts,) = distributed.sum_over_ranks(accelerator, [out.prompts])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rounds": out.rounds, "prompts": prompts,
                                                             "batch": [t.row["id"] for t in out.batch]}))
    torch.distributed.destroy_process_group()


def test_ranks_agree_on_the_rounds_over_a_process_group(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_rounds, args=(2, distributed.free_ports()[0], str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rounds"], r1["rounds"]) == (3, 3) and r0["prompts"] == r1["prompts"] == 12
    assert r0["batch"] == [0, 0, 1, 1] and r1["batch"] == [4, 4, 5, 5]


# ------------------------------------------------------------------ training steps with a scripted engine


@pytest.fixture(scope="module")
def world_retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def _scripted_trainer(tmp_path, tiny_world, retriever, correct, *overrides, greedy_correct=None, sleep_s=0.0):
    """A test-world Trainer (prompts in file order) whose engine answers training row j's k-th response with the
    gold answer when ``correct(j, k)`` (a greedy request: ``greedy_correct(j)``), else with a wrong one; each
    sampled engine call sleeps ``sleep_s``. Returns (trainer, backend)."""
    from conftest import on_world
    from scripted_backends import ScriptedBackend
    from searchr1_lld.config import load_config
    from searchr1_lld.learner.trainer import Trainer
    from searchr1_lld.rollout.agent_loop import encode_prompt
    from test_trainer import SMALL

    cfg = on_world(load_config(None, [*SMALL, "data.shuffle=false", "trainer.save_every=0", "trainer.run_name=run",
                                      f"trainer.output_dir={tmp_path}", *overrides]), tiny_world)
    tr = Trainer(cfg, retriever=retriever)
    tok, rows = tr.learner.tokenizer, tr.train_rows
    index = {tuple(encode_prompt(tok, r["question"], cfg.data.prompt_template, cfg.data.chat_template)): j
             for j, r in enumerate(rows)}

    def script(call, i, prompt):
        j = index[tuple(prompt)]
        greedy = backend.calls[call]["greedy"]
        if sleep_s and i == 0 and not greedy:
            time.sleep(sleep_s)
        right = greedy_correct(j) if greedy else correct(j, i % cfg.rollout.n)
        return tok.encode(f"<answer> {rows[j]['golden_answers'][0] if right else 'nobody'} </answer>",
                          add_special_tokens=False)

    backend = ScriptedBackend(script, tok)
    tr.learner.backend = backend
    return tr, backend


def _record(monkeypatch, name):
    """The inputs of the advantage estimator ``name`` at each call: (scores, group ids, keywords)."""
    seen = []
    fn = advantages.ADVANTAGE_ESTIMATORS[name]

    def recording(scores, group_ids, mask, **kw):
        seen.append((scores.clone(), group_ids.clone(), kw))
        return fn(scores, group_ids, mask, **kw)

    monkeypatch.setitem(advantages.ADVANTAGE_ESTIMATORS, name, recording)
    return seen


def _record_rollouts(monkeypatch):
    seen = []
    real = sampling.rollout_step

    def recording(*args, **kw):
        seen.append(real(*args, **kw))
        return seen[-1]

    monkeypatch.setattr(sampling, "rollout_step", recording)
    return seen


def test_dynamic_sampling_in_the_step(tmp_path, tiny_world, world_retriever, monkeypatch):
    """Rows 0, 4, ...: both answers right (dropped); the others one right, one wrong. Each step rolls out two rounds
    (4 prompts, 8 responses, 3 groups kept), trains on exactly 2 groups x 2 responses (rows 1, 2 and 5, 6: the
    surplus rows 3 and 7 cut), logs the counts, and its rollout time holds both rounds. The overlong punishment
    (L_max 6, L_cache 2) shapes what the advantage reads: EM + clamp((4 - generated tokens) / 2, -1, 0)."""
    tr, backend = _scripted_trainer(
        tmp_path, tiny_world, world_retriever, lambda j, k: j % 4 == 0 or k == 0,
        "algorithm.dynamic_sampling.enabled=true", "algorithm.reward_shaping=overlong", "algorithm.overlong.max_length=6", "algorithm.overlong.cache_length=2",
        sleep_s=0.3)
    seen, rollouts = _record(monkeypatch, "grpo"), _record_rollouts(monkeypatch)
    metrics = [tr.train_step(), tr.train_step()]
    for m in metrics:
        assert m["rollout/dynamic_sampling_rounds"] == 2 and m["rollout/dynamic_sampling_filled_groups"] == 0
        assert (m["rollout/prompts_generated"], m["rollout/responses_generated"]) == (4, 8)
        assert m["rollout/kept_group_frac"] == 0.75
        assert m["reward/em_mean"] == 5 / 8 and m["reward/em_mean_trained"] == 0.5
        assert m["time/rollout_s"] >= 0.6  # two engine calls of 0.3 s
    assert [[t.row["id"] for t in r.trajectories] for r in rollouts] == [
        [tr.train_rows[j]["id"] for j in (1, 1, 2, 2)], [tr.train_rows[j]["id"] for j in (5, 5, 6, 6)]]
    assert tr.sampler.state() == {"epoch": 0, "cursor": 8}  # the extra rounds drew from the prompt stream
    assert [len(c["prompts"]) for c in backend.calls] == [4, 4, 4, 4] and not any(c["greedy"] for c in backend.calls)
    for (scores, groups, kw), r in zip(seen, rollouts):
        lengths = torch.tensor([float(sum(t.response_mask)) for t in r.trajectories])
        em = torch.tensor([t.reward for t in r.trajectories])
        assert em.tolist() == [1, 0, 1, 0] and groups.tolist() == [0, 0, 1, 1] and "baselines" not in kw
        torch.testing.assert_close(scores, em + ((4 - lengths) / 2).clamp(-1, 0))
        assert scores[1] == scores[3] == -1.0  # 'nobody' is 8 tokens: beyond L_max
    assert metrics[0]["reward/overlong_frac"] >= 0.5 and metrics[0]["reward/overlong_penalty_mean"] <= -0.5


def test_the_round_cap_fills_the_batch_and_says_so(tmp_path, tiny_world, world_retriever, monkeypatch):
    """Only row 3 of rows 0-3 has a right and a wrong answer: with 2 rounds at most, the batch is row 3 and the first
    dropped group (row 0), 2 groups x 2 responses still, and the fill is logged and warned about."""
    from searchr1_lld.learner import step

    tr, _ = _scripted_trainer(tmp_path, tiny_world, world_retriever, lambda j, k: j % 4 == 3 and k == 0,
                              "algorithm.dynamic_sampling.enabled=true", "algorithm.dynamic_sampling.max_rounds=2")
    with pytest.raises(ValueError, match="more_rows"):  # the step cannot ask for more rows: a clear error
        step.train_step(tr.learner, tr.next_rows(), step=0, probe=tr.probe, detector=tr.detector, history=[])
    tr.sampler.load_state({"epoch": 0, "cursor": 0})
    seen = _record(monkeypatch, "grpo")
    with pytest.warns(UserWarning, match="1 groups of the batch were filled from dropped ones"):
        m = tr.train_step()
    assert (m["rollout/dynamic_sampling_rounds"], m["rollout/dynamic_sampling_filled_groups"]) == (2, 1)
    assert (m["rollout/prompts_generated"], m["rollout/kept_group_frac"]) == (4, 0.25)
    ((scores, groups, _),) = seen
    assert scores.tolist() == [1, 0, 0, 0] and groups.tolist() == [0, 0, 1, 1]
    assert m["adv/nonzero_frac"] == 0.5  # the filled group carries no signal


def test_remax_rolls_out_one_greedy_response_per_prompt(tmp_path, tiny_world, world_retriever, monkeypatch):
    """REMAX: one greedy engine call (n = 1) on the batch's 2 prompts; its EM (row 0 right, row 1 wrong) is the
    baseline of both responses of the prompt; its time and tokens are logged."""
    tr, backend = _scripted_trainer(tmp_path, tiny_world, world_retriever, lambda j, k: k == 0,
                                    "algorithm.method=remax", greedy_correct=lambda j: j % 2 == 0)
    seen = _record(monkeypatch, "remax")
    m = tr.train_step()
    greedy = [c for c in backend.calls if c["greedy"]]
    assert len(greedy) == 1 and len(greedy[0]["prompts"]) == 2 and len(backend.calls) == 2
    gold = [tr.train_rows[j]["golden_answers"][0] for j in (0, 1)]
    greedy_lengths = [len(tr.learner.tokenizer.encode(f"<answer> {a} </answer>", add_special_tokens=False))
                      for a in (gold[0], "nobody")]
    ((scores, groups, kw),) = seen
    assert scores.tolist() == [1, 0, 1, 0] and kw["baselines"].tolist() == [1, 1, 0, 0]
    assert m["rollout/baseline_generated_tokens"] == sum(greedy_lengths)
    assert m["rollout/baseline_reward_mean"] == 0.5 and m["time/baseline_rollout_s"] > 0
    assert m["adv/nonzero_frac"] == 0.5  # A = r - b = [0, -1, 1, 0]
