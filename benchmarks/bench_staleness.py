"""Tokens trained per second with the rollout beside the update (trainer.staleness = k) against the synchronous step,
on the tiny config at the same total threads.

    python benchmarks/bench_staleness.py [--staleness 0,1,2] [--steps 5] [--pairs 1] [--threads 2]

The demo's learner (configs/tiny.yaml: 16 prompts x 8 responses a step, HF rollout backend, in-process retriever) on
the synthetic world in ``--world-dir`` (default ``.cache/world``). k = 0 is the synchronous step on ``--threads``
torch threads; k >= 1 splits the same threads between the learner and one rollout worker process
(searchr1_lld/placement.thread_split) and adds the decoupled objective's behaviour weight
(algorithm.rollout_correction.preset=decoupled_token_is). Every run trains ``--steps`` steps from the same initial
weights; the first step of each (the worker's start, the first rollout that nothing overlaps) is not timed. Each
timed step's wall time is what the loop waited for ``Trainer.train_step`` (the learner's wait for its batch
included); tokens trained = generated tokens of the step's responses.

Runs are paired: each repeat runs every k once, the order reversed on every other repeat. Prints per run
``RESULT tokens_per_s_k<k>`` (median over repeats), ``RESULT speedup_k<k>_over_k0`` (geometric mean of the per-repeat
ratios), and the idle shares of the timed steps: ``RESULT learner_idle_share_k<k>`` (k = 0: the rollout's share of
the step, when the learner waits; k >= 1: async/learner_wait_s over the wall) and ``RESULT engine_idle_share_k<k>``
(k = 0: the rest of the step, when the engine waits; k >= 1: async/engine_wait_s over the wall);
``--baseline-threads 1`` adds a synchronous run on one thread (``..._k0_threads1``). The machine may be shared: only
ratios within one run mean anything, and a clean measurement needs a quiet machine. On a machine whose cores other
processes keep busy, one process's threads contend for them (OpenMP's barriers wait for the slowest), which slows the
synchronous baseline on all the threads far more than two processes on half as many each: compare with the
``--baseline-threads`` run before reading a speed-up as the overlap's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from searchr1_lld.config import load_config  # noqa: E402
from searchr1_lld.learner.trainer import Trainer  # noqa: E402
from searchr1_lld.world import trainer_overrides  # noqa: E402

DECOUPLED = ["trainer.placement.kind=split", "algorithm.rollout_correction.preset=decoupled_token_is"]


def run(k: int, steps: int, threads: int, world_overrides: list[str], out: Path) -> dict[str, float]:
    """One run of ``steps`` steps of configs/tiny.yaml with ``world_overrides`` (the world's paths, a device) at
    staleness ``k``: tokens per second and idle shares over the steps after the first."""
    torch.set_num_threads(threads)
    overrides = [*world_overrides, f"trainer.output_dir={out}", f"trainer.run_name=k{k}",
                 "trainer.resume=never", "trainer.save_every=0", "trainer.probe_every=0", "logging.progress_bar=false",
                 *([f"trainer.staleness={k}", *DECOUPLED] if k else [])]
    trainer = Trainer(load_config(REPO / "configs" / "tiny.yaml", overrides))
    responses = trainer.responses_per_step
    walls, tokens, learner_idle, engine_idle = [], [], [], []
    try:
        for i in range(steps):
            t0 = time.perf_counter()
            m = trainer.train_step()
            wall = time.perf_counter() - t0
            if i == 0:
                continue
            walls.append(wall)
            tokens.append(m["rollout/generated_tokens_mean"] * responses)
            if k:
                learner_idle.append(m["async/learner_wait_s"])
                engine_idle.append(m["async/engine_wait_s"])
            else:
                learner_idle.append(m["time/rollout_s"])
                engine_idle.append(wall - m["time/rollout_s"])
    finally:
        trainer.close_pipeline()
    total = sum(walls)
    out_row = {"tokens_per_s": sum(tokens) / total, "learner_idle_share": sum(learner_idle) / total,
               "engine_idle_share": sum(engine_idle) / total}
    print(f"k={k} steps={len(walls)} wall={total:.1f}s " + " ".join(f"{n}={v:.3f}" for n, v in out_row.items()),
          flush=True)
    return out_row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staleness", default="0,1", help="comma-separated k values; 0 is the baseline")
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first one untimed)")
    parser.add_argument("--pairs", type=int, default=1, help="repeats of every k")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all, both sides together")
    parser.add_argument("--baseline-threads", default="", help="comma-separated thread counts of further k = 0 runs "
                        "(e.g. 1: the synchronous step on one side's share, which separates the overlap from the "
                        "cost of running one process's threads on a shared machine)")
    parser.add_argument("--world-dir", default=str(REPO / ".cache" / "world"))
    args = parser.parse_args(argv)
    ks = sorted({0, *(int(k) for k in args.staleness.split(","))})
    runs = [(f"k{k}", k, args.threads) for k in ks]
    runs += [(f"k0_threads{n}", 0, int(n)) for n in args.baseline_threads.split(",") if n]
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.pairs):
            for label, k, threads in (runs if r % 2 == 0 else list(reversed(runs))):
                rows[label].append(run(k, args.steps, threads, trainer_overrides(args.world_dir), Path(tmp)))
    for name, value in summary(rows).items():
        print(f"RESULT {name} {value:.3f}")


def summary(rows: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """The figures of paired runs ``rows`` (per label, one dict per repeat; ``k0`` the baseline):
    ``tokens_per_s_<label>`` and the idle shares (medians over repeats), and for every other label
    ``speedup_<label>_over_k0`` (geometric mean of the per-repeat ratios)."""
    out: dict[str, float] = {}
    for label, runs in rows.items():
        out[f"tokens_per_s_{label}"] = statistics.median(x["tokens_per_s"] for x in runs)
        for share in ("learner_idle_share", "engine_idle_share"):
            out[f"{share}_{label}"] = statistics.median(x[share] for x in runs)
        if label != "k0":
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs, rows["k0"])]
            out[f"speedup_{label}_over_k0"] = math.exp(statistics.mean(math.log(x) for x in ratios))
    return out


if __name__ == "__main__":
    main()
