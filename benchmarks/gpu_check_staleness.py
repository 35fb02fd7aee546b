"""The GPU check's staleness section: tokens trained per second with the rollout beside the update (trainer.staleness
= 1: one rollout worker process) against the synchronous step (k = 0), rollout and learner on the same device.

The test-sized synthetic world (gpu_check_e2e.world_config: its tokenizer, BM25 index and QA rows) with a policy of
Qwen2.5-0.5B's shape (benchmarks/model_configs/qwen2.5-0.5b.json, random weights, the world's vocabulary; ``--smoke``:
the world's own tiny policy), configs/tiny.yaml's step (16 prompts x 8 responses, HF backend; ``--smoke``: 4 x 4)
on the device, paired
as benchmarks/bench_staleness.py runs them (one run per k, ``staleness_steps`` steps each, the first untimed).
Results: ``staleness_tokens_per_s_k0`` / ``_k1``, ``staleness_speedup_k1_over_k0``, and the learner's and the
engine's idle shares of each (bench_staleness.summary). Random weights never search or answer: every turn is an
invalid action, so the figures measure the two sides' overlap, not a trained policy's trajectories.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench_staleness import run, summary
from gpu_check_e2e import built_world
from gpu_check_parts import guarded

HERE = Path(__file__).resolve().parent


def random_policy(world: Path, out: Path) -> Path:
    """A Qwen2.5-0.5B-shaped causal LM with random weights over the world's vocabulary, saved to ``out``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shape = json.loads((HERE / "model_configs" / "qwen2.5-0.5b.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    shape.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def section_staleness(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """k = 0 and k = 1 on the device (module docstring)."""
    from searchr1_lld.world.build import trainer_overrides

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        world = built_world(root)
        policy = world / "model" if smoke else random_policy(world, root / "policy")
        overrides = [*trainer_overrides(world), f"model.path={policy}", f"trainer.device={device.type}",
                     "data.val_files=[]", "data.test_files=[]", *shapes["staleness_overrides"]]
        threads = torch.get_num_threads()
        rows: dict[str, list[dict[str, float]]] = {"k0": [], "k1": []}

        def measure() -> dict[str, Any]:
            for k in (0, 1):
                rows[f"k{k}"].append(run(k, shapes["staleness_steps"], threads, overrides, root / "runs"))
            return {f"staleness_{name}": value for name, value in summary(rows).items()}

        guarded(out, "staleness", measure, device)
    return out
