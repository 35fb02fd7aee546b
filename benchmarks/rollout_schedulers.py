"""The scheduler part of bench_rollout.py (its docstring): the turn-batched loop and the continuous scheduler on one
vLLM CPU engine, the retriever in process and over HTTP, with added latency per retriever call."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEDULERS = ("turns", "continuous")


class DelayedRetriever:
    """``inner`` with ``delay_s`` seconds added before every call (a remote retriever's round trip)."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.calls = 0

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner.search(queries, topk)


def engine_world(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    sys.path.insert(0, str(ROOT / "tests"))
    from test_vllm_engine import VLLM_WORLD_CONFIG  # noqa: E402

    from conftest import test_world_dir  # noqa: E402
    from searchr1_lld.world import ensure_world

    return ensure_world(test_world_dir(VLLM_WORLD_CONFIG), VLLM_WORLD_CONFIG, progress=True)


def http_retriever(index_dir: Path):
    """The project's retriever service (``python -m retriever serve``) on the index in a child process (its own
    interpreter: a service thread in this process would contend with the engine's Python for the GIL), on a free
    loopback port, and a RetrieverClient on it. Returns (client, process)."""
    from retriever.client import RetrieverClient

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", str(index_dir), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("retriever ready on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
            return RetrieverClient(line.split("retriever ready on ", 1)[1].strip(), max_wait_s=60.0), proc
    raise RuntimeError(f"the retriever service did not start (exit code {proc.wait()})")


def build(args: argparse.Namespace):
    """(engine, tokenizer, rollout config, prompts, {transport: retriever}) at the demo's shapes."""
    from transformers import AutoTokenizer

    from retriever import make_retriever
    from searchr1_lld.config import RetrieverConfig, apply_overrides, config_from_dict, load_config
    from searchr1_lld.rollout.backends import make_backend

    world = engine_world(args.vllm_world)
    cfg = config_from_dict(apply_overrides(load_config(str(ROOT / "configs" / "tiny.yaml")).to_dict(), [
        "rollout.backend=vllm", "rollout.vllm.kv_cache_memory_bytes=268435456", "rollout.vllm.enforce_eager=true"]))
    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    inprocess = make_retriever(RetrieverConfig(mode="inprocess", index_dir=str(world / "index")))
    engine = make_backend(cfg.rollout, tokenizer=tok, model_path=str(world / "model"), seed=0, dtype="float32",
                          tokenizer_path=str(world / "tokenizer"))
    rows = [json.loads(line) for line in open(world / "qa" / "train.jsonl")][: args.sched_rows]
    print(f"engine world {world}; {len(rows)} prompts x n={args.sched_n}, max_turns {cfg.rollout.max_turns}, "
          f"max_tokens_per_turn {cfg.rollout.max_tokens_per_turn}, temperature {cfg.rollout.temperature}")
    client, service = http_retriever(world / "index")
    return engine, tok, cfg.rollout, rows, {"inprocess": inprocess, "http": client}, service


def one_rollout(engine, tok, rollout_cfg, rows, retriever, scheduler: str, n: int) -> dict[str, float]:
    from searchr1_lld.rollout import run_agent_loop

    timings: dict = {}
    calls_before = retriever.calls
    t0 = time.perf_counter()
    trajs = run_agent_loop(rows, backend=engine, tokenizer=tok, retriever=retriever, n=n,
                           cfg=dataclasses.replace(rollout_cfg, scheduler=scheduler), timings=timings)
    wall = time.perf_counter() - t0
    return dict(wall_s=wall, tokens=timings["generated_tokens"], iterations=timings["decode_iterations"],
                retrieve_wait_s=timings["retrieve_wait_s"], searches=float(sum(t.valid_searches for t in trajs)),
                turns=float(sum(t.num_turns for t in trajs)), trajectories=float(len(trajs)), rollouts=1.0,
                longest=float(max(sum(t.response_mask) for t in trajs)), retriever_calls=retriever.calls - calls_before)


def run_grid(args: argparse.Namespace, engine, tok, rollout_cfg, rows, retrievers) -> dict:
    """(transport, latency_ms, scheduler) -> sums over the repeats; the schedulers alternate within a repeat."""
    latencies = [int(x) for x in args.latencies_ms.split(",")]
    for scheduler in SCHEDULERS:  # warm-up
        one_rollout(engine, tok, rollout_cfg, rows[:2], DelayedRetriever(retrievers["inprocess"], 0), scheduler, 2)
    grid: dict = {}
    for transport, inner in retrievers.items():
        for latency in latencies:
            retriever = DelayedRetriever(inner, latency / 1000)
            for rep in range(args.repeats):
                order = SCHEDULERS if rep % 2 == 0 else SCHEDULERS[::-1]
                for scheduler in order:
                    res = one_rollout(engine, tok, rollout_cfg, rows, retriever, scheduler, args.sched_n)
                    acc = grid.setdefault((transport, latency, scheduler), {"rates": []})
                    acc["rates"].append(res["tokens"] / res["wall_s"])
                    for key, value in res.items():
                        acc[key] = acc.get(key, 0.0) + value
                    print(f"  {transport:9s} {latency:3d} ms {scheduler:10s} repeat {rep}: {res['tokens']:.0f} tokens "
                          f"in {res['wall_s']:.2f} s, {res['iterations']:.0f} decode iterations, "
                          f"{res['searches']:.0f} searches in {res['retriever_calls']:.0f} retriever calls", flush=True)
    return grid


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report(grid: dict) -> None:
    """The table (per rollout, means over the repeats; tokens/s: the median rollout's, robust to a repeat slowed by
    other work on the machine) and the RESULT lines (iterations: sums over the repeats; speed: median tokens/s)."""
    print(f"{'retriever':9s} {'added':>6s} {'scheduler':10s} {'tokens/s':>9s} {'wall s':>7s} {'iters/rollout':>13s} "
          f"{'turns/traj':>10s} {'searches/traj':>13s} {'calls':>5s} {'engine idle s':>13s}   (per rollout, mean over repeats)")
    for (transport, latency, scheduler), acc in grid.items():
        k, trajs = acc["rollouts"], acc["trajectories"]
        print(f"{transport:9s} {latency:4d}ms {scheduler:10s} {median(acc['rates']):9.1f} "
              f"{acc['wall_s'] / k:7.2f} {acc['iterations'] / k:13.1f} {acc['turns'] / trajs:10.2f} "
              f"{acc['searches'] / trajs:13.2f} {acc['retriever_calls'] / k:5.1f} {acc['retrieve_wait_s'] / k:13.2f}")
    base = ("inprocess", min(lat for _, lat, _ in grid))
    ratio = grid[(*base, "turns")]["iterations"] / grid[(*base, "continuous")]["iterations"]
    ceiling = grid[(*base, "turns")]["iterations"] / grid[(*base, "turns")]["longest"]
    print(f"the longest trajectory's generated tokens bound any scheduler's decode iterations from below: turn-batched "
          f"iterations / that bound = {ceiling:.3f} (the most a scheduler could gain on these samples)")
    print(f"RESULT rollout_decode_iterations_turns_over_continuous {ratio:.3f}")
    for (transport, latency, scheduler), acc in grid.items():
        if scheduler != "continuous":
            continue
        turns = grid[(transport, latency, "turns")]
        speedup = median(acc["rates"]) / median(turns["rates"])
        name = f"rollout_continuous_over_turns_{latency}ms" if transport == "http" else \
            f"rollout_continuous_over_turns_inprocess_{latency}ms"
        print(f"RESULT {name} {speedup:.3f}")


def measure_schedulers(args: argparse.Namespace) -> None:
    engine, tok, rollout_cfg, rows, retrievers, service = build(args)
    try:
        grid = run_grid(args, engine, tok, rollout_cfg, rows, retrievers)
    finally:
        service.terminate()
        service.wait(timeout=30)
    report(grid)
