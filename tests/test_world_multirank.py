"""A multi-rank start on a fresh world directory: `accelerate launch` (2 CPU processes, DDP over gloo) of
`train.py --world FILE --world-dir DIR` where DIR holds nothing yet. The first process builds the world, the other
waits for it; both then train one step on the same files."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO_ROOT, TEST_WORLD_CONFIG, free_port

# the test world, smaller still: the build is part of what this test times (seconds, not a minute)
FRESH_WORLD = dataclasses.replace(TEST_WORLD_CONFIG, num_train_questions=16, num_test_questions=8,
                                  warmstart_trajectories=64, warmstart_drills=0)
OVERRIDES = [
    "trainer.train_batch_size=4", "rollout.n=2", "trainer.ppo_mini_batch_size=4", "trainer.ppo_epochs=1",
    "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "rollout.max_obs_length=60",
    "trainer.micro_batch_token_budget=1000", "trainer.probe_every=0", "trainer.total_steps=1",
    "trainer.save_every=1", "logging.progress_bar=false", "logging.plot_every=0", "trainer.device=cpu",
]


@pytest.mark.slow
def test_two_ranks_start_on_a_fresh_world_and_train_a_step(tmp_path):
    world_yaml, world_dir = tmp_path / "world.yaml", tmp_path / "world"
    world_yaml.write_text(yaml.safe_dump(dataclasses.asdict(FRESH_WORLD)))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / "cpu_2proc_ddp.yaml"), "--main_process_port", str(free_port()),
           "train.py", "--config", "configs/tiny.yaml", "--world", str(world_yaml), "--world-dir", str(world_dir),
           "--no-eval", *OVERRIDES, f"trainer.output_dir={tmp_path / 'runs'}", "trainer.run_name=fresh"]
    out = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-6000:])

    from searchr1_lld.world import read_card, world_config_hash

    card = read_card(world_dir)
    assert card is not None and card["config_hash"] == world_config_hash(FRESH_WORLD)
    run = tmp_path / "runs" / "fresh"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["path"] == str(world_dir / "model")  # the world's files, named in the run's own keys
    assert saved["data"]["train_files"] == [str(world_dir / "qa" / "train.jsonl")]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert (run / "checkpoints" / "step_000001" / "COMPLETE").is_file()
