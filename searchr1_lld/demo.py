"""The embedded default, end to end on a CPU (what `make demo` runs):

    1. build (or reuse) the synthetic search world: corpus, retriever index, QA splits, tokenizer, warm-started policy
    2. train GRPO + LLDS on it (configs/tiny.yaml): metrics.jsonl, plots, checkpoints in the run directory
    3. evaluate the warm start and the trained policy greedily on the world's test split and print the table

    python -m searchr1_lld.demo [--config configs/tiny.yaml] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from searchr1_lld.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


def _read_trajectories(eval_dir: Path) -> dict[str, dict]:
    from searchr1_lld.jsonl import read_jsonl

    path = eval_dir / "trajectories.jsonl"
    return {r["id"]: r for r in read_jsonl(path)} if path.is_file() else {}


def pick_example(before: dict[str, dict], after: dict[str, dict]) -> str | None:
    """The id of one test question the trained policy answers and the warm start does not: a multi-hop one answered
    after one search per hop first (a right answer after fewer searches is a lucky guess, not the second hop), then
    any multi-hop one, then the first id in order; None if there is none."""
    won = [i for i in sorted(after) if i in before and after[i]["em"] > before[i]["em"]]
    multi = [i for i in won if after[i].get("hops") == 2]
    searched = [i for i in multi if len(after[i].get("queries") or []) >= 2]
    return (searched or multi or won or [None])[0]


def format_example(rid: str, before: dict, after: dict, width: int = 600) -> str:
    """Question, gold answers and the two greedy trajectories (response text, observations included)."""
    def body(r: dict) -> str:
        text = r["response_text"].strip()
        return text if len(text) <= width else text[:width] + " ..."

    return "\n".join([
        f"example test question ({rid}, {before.get('hops')}-hop): {before['question']}  gold: {before['golden_answers']}",
        f"--- warm start (EM {before['em']:.0f}, queries {before['queries']}, answer {before['prediction']!r}):",
        body(before),
        f"--- trained (EM {after['em']:.0f}, queries {after['queries']}, answer {after['prediction']!r}):",
        body(after),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if cfg.data.source != "synthetic":
        print("the demo runs on the synthetic world (data.source=synthetic)", file=sys.stderr)
        return 2

    from searchr1_lld.factories import ensure_run_world
    from searchr1_lld.checkpoint import latest_checkpoint
    from searchr1_lld.tracking import quiet_library_output
    from searchr1_lld.trainer import train

    quiet_library_output()
    t0 = time.time()
    print(f"[1/3] synthetic world in {cfg.data.world_dir}", flush=True)
    world = ensure_run_world(cfg)  # data.world_config (configs/world/default.yaml) -> data.world_dir
    t_world = time.time() - t0
    from data.build_world import read_card, warm_start_shortfalls

    for line in warm_start_shortfalls(read_card(world) or {}):
        print(f"WARNING: {line} (the warm start's targets; what it means for RL: docs/lab.md)",
              flush=True)

    print("[2/3] training GRPO + LLDS (configs: algorithm.llds.*)", flush=True)
    result = train(cfg, evaluate=False)
    t_train = time.time() - t0 - t_world
    if not result.history:
        print(f"training was already complete in {result.run_dir} (the same settings map to the same run "
              f"directory); delete it to train again", flush=True)
    ckpt = latest_checkpoint(result.run_dir)
    if ckpt is None:
        print(f"no checkpoint was written in {result.run_dir}", file=sys.stderr)
        return 1

    print("[3/3] greedy evaluation on the test split: warm start vs trained", flush=True)
    out = Path(result.run_dir) / "eval"
    method = "grpo+llds" if cfg.algorithm.llds.enabled else "grpo"
    cmd = [sys.executable, str(REPO / "eval.py"), "--datasets", "synthetic", "--world-dir", str(world),
           "--config", str(Path(result.run_dir) / "config.yaml"), "--out", str(out),
           "--compare", f"warm_start={world / 'model'}", f"{method}={ckpt / 'policy'}"]
    if cfg.trainer.eval_limit:
        cmd += ["--limit", str(cfg.trainer.eval_limit)]
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return proc.returncode
    table = proc.stdout.strip()
    t_eval = time.time() - t0 - t_world - t_train

    plots = sorted((Path(result.run_dir) / "plots").glob("*.png"))
    print("\n" + table + "\n")
    before, after = _read_trajectories(out / "warm_start"), _read_trajectories(out / method)
    rid = pick_example(before, after)
    if rid is not None:
        print(format_example(rid, before[rid], after[rid]) + "\n")
    else:
        print("(no test question that the trained policy answers and the warm start does not)\n")
    m = result.final_metrics
    keys = [k for k in ("reward/em_mean", "rollout/valid_searches_mean", "llds/active_token_frac", "actor/grad_norm", "actor/entropy") if k in m]
    if keys:
        print("last training step: " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
    print(f"wall time: world {t_world:.0f}s, training {t_train:.0f}s ({result.steps} steps), eval {t_eval:.0f}s")
    print(f"run directory: {result.run_dir}")
    print(f"plots: {Path(result.run_dir) / 'plots'} ({', '.join(p.name for p in plots) if plots else 'none written'})")
    print(f"tables: {out / 'results.md'} {out / 'results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
