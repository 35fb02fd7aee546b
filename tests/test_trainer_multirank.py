"""The learner on 2 CPU processes (gloo): DDP, DeepSpeed ZeRO-2 and ZeRO-3 through `accelerate launch` with the
shipped configs/accelerate/cpu_2proc_*.yaml, on real training steps of the tiny test world (tests/multirank_run.py).

Each launch trains 2 steps (run A), then resumes a second run (B) from A's step-1 checkpoint. Rank 1 cuts its
micro-batches to one response each, so the ranks disagree on the micro-batch count (rank 0 must pad, in the update and
in the no-grad log-prob passes; a mismatch would hang, which the timeout turns into a failure), and rank 1 alone makes
the first update of step 2 non-finite (both ranks must skip it). Asserted: exit 0; actor/updates = responses per step /
ppo_mini_batch_size x ppo_epochs; padding happened; the NaN update was skipped on both ranks; ranks bit-identical after
2 steps (DDP, ZeRO-2; ZeRO-3 gathered); resume == uninterrupted; KL(ref) is 0 on the first update of step 0; the
ZeRO-2 / ZeRO-3 policies after step 1 equal the DDP one within fp32 tolerance, and so do the rollouts of step 2, which
that policy generates (ZeRO-3 generates on a separate full copy that must receive every update); packed
micro-batches give the padded rows' log-probs, losses and gradient norms (one rollout, updates at learning rate 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT, free_port, world_args

OVERRIDES = [
    "trainer.train_batch_size=4", "rollout.n=2", "trainer.ppo_mini_batch_size=4", "trainer.ppo_epochs=1",
    "rollout.max_turns=2", "rollout.max_tokens_per_turn=24", "rollout.max_obs_length=60",
    "trainer.micro_batch_token_budget=1000", "trainer.probe_every=1", "trainer.probe_size=2",
    "logging.progress_bar=false", "logging.plot_every=0", "algorithm.entropy_coef=0.01",
]
TIMEOUT_S = 540


def _launch(kind: str, out_dir, world_dir) -> tuple[dict, float]:
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
                "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions")})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / f"cpu_2proc_{kind}.yaml"), "--main_process_port",
           str(free_port()), "tests/multirank_run.py", str(out_dir), *OVERRIDES, *world_args(world_dir)]
    t0 = time.time()
    out = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.time() - t0
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-6000:])
    # DeepSpeed stays on gloo: its shared-memory op (minutes of g++ on a first launch) is never built
    assert "shm_comm_op built" not in out.stdout + out.stderr
    print(f"RESULT multirank_{kind}_wall_s {wall:.1f}")
    for rank in (0, 1):  # the learner's close released the process group on every rank before exit
        assert json.loads((out_dir / f"closed_rank{rank}.json").read_text()) == {"process_group": False}
    return json.loads((out_dir / "result.json").read_text()), wall


def _policy(run_dir, step: int):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "policy" / "model.safetensors"))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_world):
    out = tmp_path_factory.mktemp("ddp")
    return _launch("ddp", out, tiny_world)[0], out


def _check_common(res: dict) -> None:
    assert res["world_size"] == 2
    expected_updates = res["responses_per_step"] // res["ppo_mini_batch_size"] * res["ppo_epochs"]
    assert expected_updates == 2
    for h in res["history_a"] + res["history_b"]:
        assert h["actor/updates"] == expected_updates
        assert h["actor/padding_micro_batches"] > 0  # the ranks disagreed and rank 0 padded (mean over ranks)
    a1, a2 = res["history_a"]
    assert a1["actor/skipped_updates"] == 0 and a2["actor/skipped_updates"] == 1  # rank 1's NaN: skipped on both
    assert res["kl_ref_first_update_step0"] == 0.0  # reference == policy, same dtype, before any update
    assert res["ranks_identical_a"] and res["ranks_identical_b"]
    assert res["steps_b_ran"] == 1 and res["a_equals_b"], res["a_b_max_abs_diff"]  # resume == uninterrupted
    assert res["history_b_steps"] == [1, 2] and res["history_b"] == [a1, a2]  # the resumed history covers both steps
    packing = res["packed_against_padded"]  # packed micro-batches == padded rows under this wrapper
    assert len(packing["lengths"]) > 2 and packing["grad_norm"] > 0, packing
    assert packing["logp"] < 1e-4 and packing["ref"] < 1e-4, packing
    for key, (padded, packed) in packing["metrics"].items():
        assert packed == pytest.approx(padded, rel=1e-4, abs=1e-6), (key, packing)
    assert packing["padded_share"][0] > 0 and packing["padded_share"][1] == 0.0, packing


@pytest.mark.slow
def test_two_rank_ddp(ddp_run):
    res, _ = ddp_run
    assert res["stage"] == 0 and res["engine"] == "DistributedDataParallel"
    _check_common(res)


@pytest.mark.slow
@pytest.mark.parametrize("kind,stage", [("zero2", 2), ("zero3", 3)])
def test_two_rank_deepspeed(kind, stage, tmp_path, tiny_world, ddp_run):
    res, _ = _launch(kind, tmp_path, tiny_world)
    assert res["stage"] == stage and res["engine"] == "DeepSpeedEngine"
    if stage == 3:
        assert res["ref_type"] == "DeepSpeedEngine"  # the reference is sharded like the policy
    _check_common(res)
    # the same seed and world size: after step 1 (2 updates, one padded micro-batch each) the policy equals DDP's
    # within fp32 tolerance (reduction order differs)
    ddp_res, ddp_out = ddp_run
    mine, ref = _policy(tmp_path / "a", 1), _policy(ddp_out / "a", 1)
    assert set(ref) <= set(mine)  # DeepSpeed's gathered state dict also names the tied lm_head.weight
    worst = max(float((mine[k].float() - ref[k].float()).abs().max()) for k in ref)
    assert worst < 1e-5, worst
    # step 2's rollouts come from the policy after step 1 (the same one as DDP's, above): the same tokens, and the
    # engine's log-probs of them within fp32 tolerance. A rollout engine left on the initial weights fails here.
    step2, ddp_step2 = _rollouts_by_prompt(res, 1), _rollouts_by_prompt(ddp_res, 1)
    assert step2.keys() == ddp_step2.keys()
    for key, (ids, logps) in ddp_step2.items():
        assert step2[key][0] == ids, key
        gap = max((abs(a - b) for a, b in zip(step2[key][1], logps)), default=0.0)
        assert gap < 1e-4, (key, gap)


def _rollouts_by_prompt(res: dict, step: int) -> dict:
    """{(rank, prompt id, k-th response of that prompt): (response ids, engine log-probs)} of run A's ``step``."""
    out, seen = {}, {}
    for rank, prompt_id, ids, logps in res["rollouts_a"][step]:
        k = seen[rank, prompt_id] = seen.get((rank, prompt_id), -1) + 1
        out[rank, prompt_id, k] = (ids, logps)
    return out
