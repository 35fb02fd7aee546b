"""Launched by tests/test_trainer_multirank.py under `accelerate launch --config_file configs/accelerate/cpu_2proc_*.yaml`
(2 CPU processes): the learner's multi-rank rules, checked on real training steps of the tiny test world.

    python tests/multirank_run.py OUT_DIR [key=value ...]      (train.py's config path: configs/tiny.yaml + overrides)

Run A trains 2 steps from scratch (checkpoint after each); run B resumes from A's step-1 checkpoint and trains step 2.
To make the ranks disagree, rank 1 cuts every micro-batch to one response (rank 0 packs by the token budget), so rank 0
runs fewer micro-batches and must pad; in step 2 rank 1 (only) makes the first micro-batch loss NaN, so the first update
of step 2 must be skipped on both ranks. Every rollout of run A is recorded (response ids and the engine's log-probs,
per step, from both ranks): step 2's come from the policy after step 1, so they show whether the rollout engine
received the update. Last, on run B's trainer, packed micro-batches against padded rows (the same log-probs, losses and
gradient norms). Writes OUT_DIR/result.json (rank 0), OUT_DIR/params_{a,b}.pt (rank 0) and, after the learner's
close, OUT_DIR/closed_rank{0,1}.json (each rank: whether its process group is still up).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from searchr1_lld.learner import batching, step
from searchr1_lld.config import load_config
from searchr1_lld.learner.trainer import Trainer

RANK = int(os.environ.get("RANK", "0"))
out_dir = Path(sys.argv[1])
overrides = sys.argv[2:]

if RANK == 1:  # rank 1: one response per micro-batch -> more micro-batches than rank 0
    one_each = lambda lengths, indices, budget: [[i] for i in sorted(indices)]  # noqa: E731
    batching.micro_batches_by_tokens = one_each  # the updates' plan and the no-grad log-prob passes call it here

_train_step = step.train_step


def _train_step_nan_once_at_step_1(learner, rows, *, step: int, **kwargs):
    """Rank 1, step 1 (of each run): the step's first micro-batch loss is NaN, so its first update is non-finite."""
    if RANK != 1 or step != 1 or os.environ.get("MULTIRANK_NO_NAN"):
        return _train_step(learner, rows, step=step, **kwargs)
    nan_pending = True
    engine = learner.engine
    _backward = engine.backward

    def backward_nan_first(model, loss, last):
        nonlocal nan_pending
        if nan_pending:
            nan_pending = False
            loss = loss * float("nan")
        return _backward(model, loss, last)

    engine.backward = backward_nan_first
    try:
        return _train_step(learner, rows, step=step, **kwargs)
    finally:
        del engine.backward  # the class's own again


step.train_step = _train_step_nan_once_at_step_1


def flat_params(tr: Trainer) -> torch.Tensor:
    named = tr.learner.engine.named_weights(tr.learner.module)  # ZeRO-3: gathered module by module
    return torch.cat([p.reshape(-1).float().cpu() for _, p in named])


def record_rollouts(tr: Trainer, steps: list) -> None:
    """Wrap the trainer's rollout so that each step's trajectories (rank, prompt id, response ids, engine log-probs)
    are appended to ``steps``, gathered from every rank."""
    rollout = tr.learner.rollout

    def recording(rows, **kwargs):
        trajs = rollout(rows, **kwargs)
        mine = [(RANK, t.row["id"], list(t.response_ids), list(t.engine_logprobs or [])) for t in trajs]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        steps.append([t for rank_trajs in gathered for t in rank_trajs])
        return trajs

    tr.learner.rollout = recording


def ranks_identical(vec: torch.Tensor) -> bool:
    gathered = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, vec)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


base = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_k=3", f"trainer.output_dir={out_dir}"]
cfg_a = load_config("configs/tiny.yaml", [*overrides, *base, "trainer.run_name=a", "trainer.resume=never"])
a = Trainer(cfg_a)
rollouts_a: list = []
record_rollouts(a, rollouts_a)
res_a = a.run(evaluate=False)
vec_a = flat_params(a)
ident_a = ranks_identical(vec_a)
kl0 = res_a.history[0]["actor/kl_ref_first_update"]

# run B: resume from A's step-1 checkpoint (copied into B's run dir) and train step 2
ckpt_a1 = a.run_dir / "checkpoints" / "step_000001"
run_b = out_dir / "b"
if RANK == 0:
    shutil.copytree(ckpt_a1, run_b / "checkpoints" / "step_000001")
dist.barrier()
cfg_b = load_config("configs/tiny.yaml", [*overrides, *base, "trainer.run_name=b", "trainer.resume=auto"])
b = Trainer(cfg_b)
res_b = b.run(evaluate=False)
vec_b = flat_params(b)
ident_b = ranks_identical(vec_b)



def packed_against_padded(tr: Trainer) -> dict:
    """One rollout of uneven responses, then with pack_sequences on and off: the batch log-probs (policy and
    reference) and one step's updates at learning rate 0 (the weights stay put, so both variants' gradients are taken
    at the same weights): their losses and gradient norms (all-reduced over the ranks): the log-probs' largest differences, the metrics of both."""
    from searchr1_lld.algo.advantages import grpo_outcome_advantages
    from searchr1_lld.rollout.types import to_batch

    learner = tr.learner
    batch = to_batch(learner.rollout(tr.sampler.next_batch()), learner.tokenizer.pad_token_id)
    adv = grpo_outcome_advantages(batch.rewards, batch.group_ids)
    scheduler_step, learner.scheduler.step = learner.scheduler.step, lambda *a, **k: None
    for group in learner.optimizer.param_groups:
        group["lr"] = 0.0
    out = {}
    for packed in (False, True):
        learner.cfg.trainer.pack_sequences = packed
        logp = step.batch_logprobs(learner, learner.model, batch)
        ref = step.batch_logprobs(learner, learner.ref_model, batch)
        # the sampling policy 0.1 nat above the current one on every token, the same for both: LLDS's gate is then
        # open on the preserving responses in both runs (with logp_old == logp_new it would follow float noise)
        old = (out[False][0] if packed else logp) + 0.1 * batch.response_mask
        m = step.update_policy(learner, batch, adv, old, ref, None, None, step=0)
        out[packed] = (logp, ref, m)
    learner.scheduler.step = scheduler_step
    keys = ("actor/pg_loss", "actor/entropy", "actor/kl_ref", "llds/loss", "actor/grad_norm", "actor/grad_norm_mean")
    return {"logp": float((out[True][0] - out[False][0]).abs().max()),
            "ref": float((out[True][1] - out[False][1]).abs().max()),
            "metrics": {k: (out[False][2][k], out[True][2][k]) for k in keys},  # (padded, packed)
            "grad_norm": out[False][2]["actor/grad_norm"],
            "padded_share": (out[False][2]["actor/padded_token_share"], out[True][2]["actor/padded_token_share"]),
            "lengths": sorted(set(batch.attention_mask.sum(1).tolist()))}


packing = packed_against_padded(b)

if RANK == 0:
    torch.save(vec_a, out_dir / "params_a.pt")
    torch.save(vec_b, out_dir / "params_b.pt")
    keys = ("actor/updates", "actor/skipped_updates", "actor/micro_batches", "actor/padding_micro_batches",
            "actor/grad_norm", "actor/lr", "actor/kl_ref_first_update")
    result = {
        "stage": a.learner.dist.zero_stage, "world_size": a.learner.dist.world_size, "engine": type(a.learner.model).__name__,
        "ref_type": type(a.learner.ref_model).__name__ if a.learner.ref_model is not None else None,
        "ranks_identical_a": ident_a, "ranks_identical_b": ident_b, "a_equals_b": bool(torch.equal(vec_a, vec_b)),
        "a_b_max_abs_diff": float((vec_a - vec_b).abs().max()),
        "steps_b_ran": len([h for h in res_b.history if h["step"] > 1]),
        "history_b_steps": [h["step"] for h in res_b.history], "kl_ref_first_update_step0": kl0,
        "responses_per_step": a.responses_per_step, "ppo_mini_batch_size": cfg_a.trainer.ppo_mini_batch_size,
        "ppo_epochs": cfg_a.trainer.ppo_epochs,
        "history_a": [{k: h.get(k) for k in keys} for h in res_a.history],
        "rollouts_a": rollouts_a,
        "history_b": [{k: h.get(k) for k in keys} for h in res_b.history],
        "packed_against_padded": packing,
    }
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    print("RESULT_JSON " + json.dumps(result))
b.learner.close()  # every rank waits, then the process group is released before exit
(out_dir / f"closed_rank{RANK}.json").write_text(json.dumps({"process_group": dist.is_initialized()}))
