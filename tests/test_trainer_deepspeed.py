"""One real GRPO+LLDS step through the DeepSpeed engine (ZeRO-2, CPU, gloo) via accelerate, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, free_port

SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, "tests")
from searchr1_lld.config import load_config
from searchr1_lld.learner.trainer import Trainer
from conftest import on_world
world, out = sys.argv[1], sys.argv[2]
# 4 prompts x 4 responses, half rewarded: 8 correct responses, so some action span's likelihood falls after the
# first update and the LLDS term is active (with 2 x 2 none fell on the by-role warm start)
cfg = load_config(None, [
    "trainer.train_batch_size=4", "trainer.ppo_mini_batch_size=8", "trainer.ppo_epochs=2", "rollout.n=4",
    "rollout.max_turns=1", "rollout.max_tokens_per_turn=16", "rollout.max_obs_length=60", "rollout.max_total_length=1024",
    "trainer.lr=1e-3", "trainer.warmup_ratio=0", "trainer.weight_decay=0", "logging.progress_bar=false",
    "trainer.probe_every=0", f"trainer.output_dir={out}", "trainer.run_name=ds"])
tr = Trainer(on_world(cfg, world))
real = tr.learner.rollout
def mixed(rows, **kw):
    trajs = real(rows, **kw)
    for i, t in enumerate(trajs):
        t.reward = float(i % 2 == 0)
    return trajs
tr.learner.rollout = mixed
before = [p.detach().clone() for p in tr.learner.model.parameters()]
m = tr.train_step()
changed = any(not torch.equal(a, b) for a, b in zip(before, tr.learner.model.parameters()))
path = tr.save()
print("RESULT_JSON " + json.dumps({"deepspeed": tr.learner.dist.deepspeed, "stage": tr.learner.dist.zero_stage,
      "engine": type(tr.learner.model).__name__, "changed": changed, "grad_norm": m["actor/grad_norm"],
      "updates": m["actor/updates"], "llds_active": m.get("llds/active_token_frac"),
      "ckpt": sorted(p.name for p in path.iterdir())}))
"""


@pytest.mark.slow
def test_deepspeed_zero2_cpu_step(tmp_path, tiny_world):
    env = dict(os.environ)
    env.update({
        "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions"),
    })
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_world), str(tmp_path)], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT_JSON ")][-1]
    res = json.loads(line.split(" ", 1)[1])
    assert res["deepspeed"] and res["stage"] == 2 and res["engine"] == "DeepSpeedEngine"
    assert res["changed"] and res["grad_norm"] > 0 and res["updates"] == 4
    assert res["llds_active"] > 0
    assert "deepspeed" in res["ckpt"] and "policy" in res["ckpt"] and "COMPLETE" in res["ckpt"]
