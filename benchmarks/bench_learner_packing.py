"""The learner without padding: packed micro-batches (``trainer.pack_sequences=true``) against padded rows, in paired
training steps at the demo's shapes (configs/tiny.yaml: 16 prompts x 8 responses, 4 optimiser steps a step,
micro-batch token budget 4096, HF rollout, in-process retriever).

    .venv/bin/python benchmarks/bench_learner_packing.py [--world DIR] [--pairs 3] [key=value ...]

The world defaults to ``.cache/world`` (the demo's) when built, else the test world of tests/conftest.py (built on
demand). Paired steps as in benchmarks/bench_llds_step.py: the trainer's state is saved, the step runs padded, the
state is restored and the same step (same prompts, same sampled responses) runs packed; the order alternates; one
untimed warm-up pair first. Only ratios within one run mean anything (the machine may be shared).

Per variant: the share of the update's forward positions that are padding (``actor/padded_token_share``), the
update's tokens per second (the batch's prompt and response tokens over the wall time of ``step.update_policy``:
ppo_epochs x mini-batches x micro-batches of forward, objective, backward, optimiser step), and the instruments'
share of the step: the LLD monitor's forward (``time/monitor_forward_s``) plus the probe set's forward
(``time/probe_s``) divided by trainer.probe_every of the config (the probe is measured every step here, so that
every step times it, and counted at its configured rate), over the step's wall time with the probe counted the same
way.

    RESULT learner_padded_token_share_padded X      (before: padded rows)
    RESULT learner_padded_token_share X             (after: packed)
    RESULT update_tokens_per_s_packed_over_padded X (median of the per-pair ratios, wall time)
    RESULT update_tokens_per_cpu_s_packed_over_padded X (the same in the process's CPU time, less sensitive to
                                                        other work on a shared machine)
    RESULT monitor_share_of_step_padded X           (before)
    RESULT monitor_share_of_step X                  (after)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_llds_step import restore, snapshot  # noqa: E402
from bench_rollout import find_world  # noqa: E402

from searchr1_lld.config import load_config  # noqa: E402
from searchr1_lld.learner import step  # noqa: E402

VARIANTS = ("padded", "packed")


def instruments_share(m: dict[str, Any], probe_every: int) -> float:
    """(monitor forward + probe forward / probe_every) over the step with its probe counted the same way."""
    probe = m.get("time/probe_s", 0.0)
    amortised = probe / probe_every if probe_every else 0.0
    return (m["time/monitor_forward_s"] + amortised) / (m["time/step_s"] - probe + amortised)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--world", default=None, help="world dir (default: .cache/world when built, else the test world)")
    ap.add_argument("--pairs", type=int, default=3, help="timed pairs (after one untimed warm-up pair)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args()

    from searchr1_lld.learner.trainer import Trainer
    from searchr1_lld.world import trainer_overrides

    world = find_world(args.world)
    out = tempfile.mkdtemp(prefix="bench_learner_packing-")
    overrides = [f"trainer.output_dir={out}", "logging.progress_bar=false", "logging.plot_every=0",
                 "trainer.total_steps=1000", *trainer_overrides(world), *args.overrides]
    cfg = load_config(str(ROOT / args.config), overrides)
    probe_every = cfg.trainer.probe_every
    cfg.trainer.probe_every = 1  # timed at every step, counted at the configured rate (module docstring)
    tr = Trainer(cfg, run_dir=out)

    update_s: list[float] = []
    update_cpu_s: list[float] = []
    update_tokens: list[int] = []
    real_update = step.update_policy

    def timed_update(learner: Any, batch: Any, *a: Any, **k: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        result = real_update(learner, batch, *a, **k)
        update_s.append(time.perf_counter() - t0)
        update_cpu_s.append(time.process_time() - c0)
        update_tokens.append(int(batch.attention_mask.sum()))
        return result

    step.update_policy = timed_update
    share: dict[str, list[float]] = {v: [] for v in VARIANTS}
    tok_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    tok_cpu_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    monitor: dict[str, list[float]] = {v: [] for v in VARIANTS}
    print(f"config {args.config}, world {world}, {tr.updates_per_step} updates a step, {args.pairs} timed pairs "
          f"after 1 warm-up pair, probe counted every {probe_every} steps", flush=True)
    for pair in range(args.pairs + 1):
        order = VARIANTS if pair % 2 == 0 else VARIANTS[::-1]
        state = snapshot(tr)
        for k, name in enumerate(order):
            if k:
                restore(tr, state)
            tr.cfg.trainer.pack_sequences = name == "packed"
            m = tr.train_step()
            rate = update_tokens[-1] / update_s[-1]
            inst = instruments_share(m, probe_every)
            print(f"{'warm-up' if pair == 0 else f'pair {pair}'} {name:6s} step {m['time/step_s']:6.2f} s, update "
                  f"{update_s[-1]:6.2f} s wall {update_cpu_s[-1]:6.2f} s CPU ({update_tokens[-1]} tokens, {rate:7.1f} tokens/s), padded share "
                  f"{m['actor/padded_token_share']:.4f}, monitor {m['time/monitor_forward_s']:.2f} s + probe "
                  f"{m.get('time/probe_s', 0.0):.2f} s: instruments {inst:.4f} of the step; pg_loss "
                  f"{m['actor/pg_loss']:.6f}, llds/loss {m.get('llds/loss', 0.0):.6f}", flush=True)
            if pair:
                share[name].append(m["actor/padded_token_share"])
                tok_s[name].append(rate)
                tok_cpu_s[name].append(update_tokens[-1] / update_cpu_s[-1])
                monitor[name].append(inst)
    ratio = statistics.median(a / b for a, b in zip(tok_s["packed"], tok_s["padded"]))
    print(f"RESULT learner_padded_token_share_padded {statistics.mean(share['padded']):.4f}")
    print(f"RESULT learner_padded_token_share {statistics.mean(share['packed']):.4f}")
    print(f"RESULT update_tokens_per_s_padded {statistics.median(tok_s['padded']):.1f}")
    print(f"RESULT update_tokens_per_s_packed {statistics.median(tok_s['packed']):.1f}")
    print(f"RESULT update_tokens_per_s_packed_over_padded {ratio:.4f}")
    cpu_ratio = statistics.median(a / b for a, b in zip(tok_cpu_s["packed"], tok_cpu_s["padded"]))
    print(f"RESULT update_tokens_per_cpu_s_packed_over_padded {cpu_ratio:.4f}")
    print(f"RESULT monitor_share_of_step_padded {statistics.median(monitor['padded']):.4f}")
    print(f"RESULT monitor_share_of_step {statistics.median(monitor['packed']):.4f}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
