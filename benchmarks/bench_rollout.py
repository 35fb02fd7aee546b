"""Agent-loop throughput on the tiny policy (CPU): generated tokens per second; the loop's own work (prompt building,
decoding for action parsing, observation tokenising, masks, spans, rewards) over generation time,
``RESULT rollout_loop_work_over_generation`` (target <= 0.10); and the share of wall time spent outside the engine's
``generate``, the retrieval calls included, ``RESULT rollout_overhead_frac`` (with the world's e5-style encoder on CPU,
retrieval is most of it).

    .venv/bin/python benchmarks/bench_rollout.py [--world DIR] [--rows 16 --n 4]

The world defaults to ``.cache/world`` when built, else the test world of tests/conftest.py (built on demand).
Retrieval is the real in-process retriever over the world's index. One warm-up rollout, then one measured rollout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def find_world(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    default = ROOT / ".cache" / "world"
    if (default / "world.json").exists():
        return default
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TEST_WORLD_CONFIG, test_world_dir  # noqa: E402

    from searchr1_lld.world import ensure_world

    return ensure_world(test_world_dir(), TEST_WORLD_CONFIG, progress=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default=None)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="responses per row (rows * n = batch, default 64)")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens-per-turn", type=int, default=64)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.config import RolloutConfig
    from searchr1_lld.instruments.monitor import rollout_metrics
    from searchr1_lld.rollout import run_agent_loop
    from searchr1_lld.rollout.backends.hf import HFBackend

    torch.set_num_threads(args.threads)
    world = find_world(args.world)
    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(world / "model"), dtype=torch.float32).eval()
    retriever = InProcessRetriever(world / "index", device="cpu")
    rows = [json.loads(line) for line in open(world / "qa" / "train.jsonl")][: args.rows]
    cfg = RolloutConfig(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn, max_obs_length=256,
                        max_total_length=2048, topk=3, generation_batch_size=args.rows * args.n)
    backend = HFBackend(model, tok, batch_size=cfg.generation_batch_size, seed=0)

    run_agent_loop(rows[:2], backend=backend, tokenizer=tok, retriever=retriever, cfg=cfg, n=2)  # warm-up
    timings: dict = {}
    t0 = time.perf_counter()
    trajs = run_agent_loop(rows, backend=backend, tokenizer=tok, retriever=retriever, cfg=cfg, n=args.n,
                           timings=timings)
    wall = time.perf_counter() - t0
    gen_s, ret_s = timings["generate_s"], timings["retrieve_s"]
    outside = wall - gen_s
    tokens = timings["generated_tokens"]
    stats = rollout_metrics(trajs)
    print(f"world {world}  model params {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M  threads {args.threads}")
    print(f"batch {len(trajs)} trajectories ({args.rows} rows x n={args.n}), max_turns {cfg.max_turns}, "
          f"max_tokens_per_turn {cfg.max_tokens_per_turn}")
    print(f"generated tokens {int(tokens)}, searches {sum(t.valid_searches for t in trajs)}, "
          f"invalid actions {sum(t.invalid_actions for t in trajs)}, turns mean {stats['rollout/turns_mean']:.2f}")
    print(f"wall {wall:.2f} s = generate {gen_s:.2f} s + retrieval {ret_s:.3f} s + other loop work {outside - ret_s:.3f} s")
    print(f"loop work (outside generation and retrieval) / generation time = {(outside - ret_s) / gen_s:.4f} "
          f"(target <= 0.10); with retrieval {outside / gen_s:.4f}")
    print(f"RESULT rollout_tokens_per_s {tokens / wall:.1f}")
    print(f"RESULT rollout_loop_work_over_generation {(outside - ret_s) / gen_s:.4f}")
    print(f"RESULT rollout_overhead_frac {outside / wall:.4f}")


if __name__ == "__main__":
    main()
