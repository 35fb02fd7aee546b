"""Rollout throughput on the tiny policy (CPU), in two parts.

HF (``--part hf``): the turn-batched agent loop on the HF backend: generated tokens per second; the loop's own work
(prompt building, decoding for action parsing, observation tokenising, masks, spans, rewards) over generation time,
``RESULT rollout_loop_work_over_generation`` (target <= 0.10); and the share of wall time spent outside the engine's
``generate``, the retrieval calls included, ``RESULT rollout_overhead_frac``. The world defaults to ``.cache/world``
when built, else the test world of tests/conftest.py (built on demand). One warm-up rollout, then one measured.

Schedulers (``--part schedulers``): the turn-batched loop and the continuous scheduler (rollout/continuous.py) on ONE
vLLM CPU engine and the same prompts, at the demo's shapes (configs/tiny.yaml: 16 prompts x 8 responses, temperature
1, 3 searches + the answer-only turn, 48 tokens per turn, top-3 documents), with the retriever in process and over
HTTP (the project's service, ``python -m retriever serve`` on the world's index in a child process, queried
through RetrieverClient), each with 0 / 20 / 100 ms added before every retriever call. Per run: generated tokens per second,
wall time, decode iterations (turn-batched: the sum over turns of the turn's longest output, what an engine that
runs a turn's requests together iterates; continuous: the engine steps taken). Rollouts are sampled, so each
configuration runs ``--repeats`` times with the schedulers alternating; iterations are summed over the repeats, and
tokens/s is the median rollout's (a shared machine slows single rollouts by 2x at times).

    RESULT rollout_decode_iterations_turns_over_continuous   (in process, 0 ms; target >= 1.3)
    RESULT rollout_continuous_over_turns_<latency>ms        (tokens/s ratio over HTTP)
    RESULT rollout_continuous_over_turns_inprocess_<latency>ms

The engine's world: ``--vllm-world`` (a world whose model's head size vLLM's CPU kernels take, 32..512), default the
engine world of tests/test_vllm_engine.py (built on demand). Ratios are within one run, on one engine.

    .venv/bin/python benchmarks/bench_rollout.py [--part all|hf|schedulers] [--world DIR] [--rows 16 --n 4]
        [--vllm-world DIR] [--sched-rows 16 --sched-n 8 --repeats 2]
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
    ap.add_argument("--part", choices=["all", "hf", "schedulers"], default="all")
    ap.add_argument("--world", default=None)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="responses per row (rows * n = batch, default 64)")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens-per-turn", type=int, default=64)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--vllm-world", default=None, help="the schedulers' engine world (default: the test engine world)")
    ap.add_argument("--sched-rows", type=int, default=16, help="prompts per rollout (the demo's 16)")
    ap.add_argument("--sched-n", type=int, default=8, help="responses per prompt (the demo's group size 8)")
    ap.add_argument("--repeats", type=int, default=2, help="rollouts per scheduler and configuration")
    ap.add_argument("--latencies-ms", default="0,20,100", help="added per retriever call, comma-separated")
    args = ap.parse_args()
    if args.part in ("all", "hf"):
        measure_hf(args)
    if args.part in ("all", "schedulers"):
        from rollout_schedulers import measure_schedulers

        measure_schedulers(args)


def measure_hf(args: argparse.Namespace) -> None:
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
