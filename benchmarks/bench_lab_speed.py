"""The lab's cost: one training step and one validation pass, this tree against a baseline commit, one thread each.

Every scientific figure of this repository comes from CPU runs of the sandbox (the lab's grids, the demo), so their
cost per training step and per greedy validation pass is what limits its science. This benchmark measures both at
the configs the grid and the demo run (``configs/lab/prereg.yaml``, ``configs/tiny.yaml``), on the default world
(``.cache/world``, built by ``make world``; the configs' own ``world:`` is replaced by it, so both trees train the
same policy on the same data), for this working tree and for ``--baseline`` (a commit, checked out into
``.cache/bench-baseline-<commit>``), in alternating child processes with ``OMP_NUM_THREADS=1`` as the grid runs its
jobs. Each child builds the trainer, runs one warm-up step (step 0: the probe set fills), times ``--steps`` steps and
one greedy pass over the validation split (eval settings of the config; the retriever's memo is emptied first, as a
fresh process has it). Per pair, the ratio of median step times and of the pass times; the RESULT lines are the
median over ``--pairs`` pairs:

    RESULT lab_step_s_over_baseline_<config>   RESULT lab_eval_s_over_baseline_<config>
    RESULT lab_step_s_over_baseline            RESULT lab_eval_s_over_baseline   (the largest over the configs)

Both trees run the same seed on the same rows; the children also report the steps' metrics, and the benchmark prints
the largest relative difference of the shared ones (``same_metrics``), a check that the speed-up changed no result.

``--jobs-threads`` instead runs two runs of this tree as the grid can: two single-threaded jobs side by side, and one
two-threaded job after the other, and prints the wall time of each (``RESULT lab_two_jobs_s_over_one_job_two_threads_
<config>``: below 1, two jobs use the two cores better).

``--profile`` (one tree, default this one) instead prints where a step's and a pass's time goes: rollout generation
(of which token sampling), retrieval, the log-prob passes (old policy, reference, the monitor's after the update,
the probe set), the update (forward, backward and optimiser steps), the rest of the step, and the validation pass
split the same way. docs/lab_speed.md holds its tables.

    .venv/bin/python benchmarks/bench_lab_speed.py [--baseline COMMIT] [--configs prereg,tiny] [--pairs 3] [--steps 2]
    .venv/bin/python benchmarks/bench_lab_speed.py --profile [--tree DIR] [--configs prereg,tiny] [--steps 2]
    .venv/bin/python benchmarks/bench_lab_speed.py --jobs-threads [--configs prereg] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "15db4b9"  # the tree before the lab was made faster
CONFIGS = {"prereg": "configs/lab/prereg.yaml", "tiny": "configs/tiny.yaml"}
# metrics both trees report that must agree when nothing but speed changed (relative difference printed)
SHARED_METRICS = ("critic/score_mean", "rollout/response_length_mean", "rollout/generated_tokens_mean",
                  "actor/pg_loss", "actor/kl_ref", "actor/grad_norm", "actor/entropy", "llds/active_token_frac",
                  "lld/correct_logp_new_per_token", "probe/logp_per_token")


def baseline_tree(commit: str) -> Path:
    """``commit`` checked out (detached worktree) into ``.cache/bench-baseline-<commit>``, once."""
    out = ROOT / ".cache" / f"bench-baseline-{commit}"
    if not (out / "searchr1_lld").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(out), commit],
                       check=True, capture_output=True)
    return out


def start_child(tree: Path, config: str, world: Path, steps: int, profile: bool, tmp: str,
                threads: int = 1) -> subprocess.Popen:
    """A child process on ``tree``'s package with ``threads`` threads, reporting to ``tmp``/report.json."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(tree), WANDB_MODE="offline")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--config", str(ROOT / config),
           "--world", str(world), "--steps", str(steps), "--out", f"{tmp}/report.json", "--run-dir", f"{tmp}/run"]
    return subprocess.Popen(cmd + (["--profile"] if profile else []), env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def child_report(proc: subprocess.Popen, tmp: str) -> dict:
    """The report of a started child, once it has finished."""
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{err[-3000:]}")
    return json.loads(Path(f"{tmp}/report.json").read_text())


def run_child(tree: Path, config: str, world: Path, steps: int, profile: bool) -> dict:
    """One child process on ``tree``'s package (one thread); its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        return child_report(start_child(tree, config, world, steps, profile, tmp), tmp)


# ----------------------------------------------------------------------------------------------------------- child
class PhaseClock:
    """Wall time of named phases, exclusive: a phase's time excludes the phases timed inside it."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.stack: list[list] = []  # [start, time of the phases inside, phase] of each running call

    def inside(self) -> str:
        """The phase of the innermost running timed call ("" outside all)."""
        return self.stack[-1][2] if self.stack else ""

    def wrap(self, owner: object, name: str, phase: str | None = None, choose=None) -> None:
        """Time every call of ``owner.name`` as ``phase`` (or ``choose(*args)``'s phase)."""
        fn = getattr(owner, name)
        clock = self

        def timed(*args, **kwargs):
            key = choose(*args) if choose else phase
            clock.stack.append([time.perf_counter(), 0.0, key])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner, _ = clock.stack.pop()
                elapsed = time.perf_counter() - start
                clock.totals[key] = clock.totals.get(key, 0.0) + elapsed - inner
                if clock.stack:
                    clock.stack[-1][1] += elapsed

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        out, self.totals = self.totals, {}
        return out


def instrument(trainer) -> PhaseClock:
    """Time the phases of a step and of an evaluation pass (names that both trees have)."""
    from searchr1_lld.learner import step
    from searchr1_lld.rollout.backends import hf

    clock = PhaseClock()
    learner = trainer.learner
    clock.wrap(type(learner.backend), "generate", "rollout: generation")
    clock.wrap(hf, "sample_next_token", "rollout: generation, token sampling")
    clock.wrap(learner.retriever, "search", "rollout: retrieval")
    clock.wrap(step, "monitor_metrics", "monitor: log-probs after the update")
    clock.wrap(step, "probe_logprobs", "probe set: log-probs")
    clock.wrap(step, "update_policy", "update: forward, backward, optimiser")
    clock.wrap(step, "batch_logprobs", choose=lambda lrn, model, batch: clock.inside() or (
        "log-probs: reference" if model is lrn.ref_model else "log-probs: old policy"))
    return clock


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, args.child)
    import torch

    torch.set_num_threads(1)
    from searchr1_lld.config.loading import apply_overrides, config_from_dict, read_yaml
    from searchr1_lld.learner import factories
    from searchr1_lld.learner.trainer import Trainer

    values = read_yaml(args.config)
    values.pop("world", None)
    w = Path(args.world)
    world = [f"model.path={w / 'model'}", f"model.tokenizer_path={w / 'tokenizer'}", "retriever.mode=inprocess",
             f"retriever.index_dir={w / 'index'}", "data.source=files", f"data.train_files=[{w / 'qa/train.jsonl'}]",
             f"data.val_files=[{w / 'qa/val.jsonl'}]", f"data.test_files=[{w / 'qa/test.jsonl'}]",
             "logging.wandb=false", "logging.progress_bar=false", f"trainer.output_dir={args.run_dir}"]
    cfg = config_from_dict(apply_overrides(values, world))
    trainer = Trainer(cfg, run_dir=args.run_dir)
    clock = instrument(trainer) if args.profile else None
    trainer.train_step()  # step 0: warm-up (first calls, the probe set fills)
    step_s, metrics, phases = [], [], []
    for _ in range(args.steps):
        clock and clock.take()
        t0 = time.perf_counter()
        metrics.append({k: v for k, v in trainer.train_step().items() if isinstance(v, (int, float))})
        step_s.append(time.perf_counter() - t0)
        if clock:
            phases.append(clock.take())
    val_rows = factories.load_val_rows(cfg)
    clear_memo = getattr(trainer.learner.retriever, "clear_memo", None)  # the baseline's retriever has no memo
    if clear_memo is not None:
        clear_memo()  # as in a fresh process
    t0 = time.perf_counter()
    em = trainer.evaluate(val_rows, desc="val")["em"]
    eval_s = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps({"step_s": step_s, "eval_s": eval_s, "eval_em": em, "metrics": metrics,
                                          "phases": phases, "eval_phases": clock.take() if clock else {},
                                          "eval_questions": len(val_rows)}))


# ------------------------------------------------------------------------------------------------------------ main
def compare(args: argparse.Namespace, world: Path) -> None:
    base = baseline_tree(args.baseline)
    worst = {"step": 0.0, "eval": 0.0}
    for name in args.configs.split(","):
        step_ratio, eval_ratio, reports = [], [], []
        for pair in range(args.pairs):
            order = [("baseline", base), ("this tree", ROOT)]
            got = {label: run_child(tree, CONFIGS[name], world, args.steps, False)
                   for label, tree in (order if pair % 2 == 0 else order[::-1])}
            b, t = got["baseline"], got["this tree"]
            step_ratio.append(statistics.median(t["step_s"]) / statistics.median(b["step_s"]))
            eval_ratio.append(t["eval_s"] / b["eval_s"])
            reports.append(got)
            print(f"{name} pair {pair}: step {statistics.median(b['step_s']):.2f} s -> "
                  f"{statistics.median(t['step_s']):.2f} s, validation pass ({t['eval_questions']} questions) "
                  f"{b['eval_s']:.1f} s -> {t['eval_s']:.1f} s, EM {b['eval_em']:.4f} -> {t['eval_em']:.4f}",
                  flush=True)
        diffs = [abs(tm[k] - bm[k]) / max(abs(bm[k]), 1e-9) for r in reports
                 for bm, tm in zip(r["baseline"]["metrics"], r["this tree"]["metrics"]) for k in SHARED_METRICS
                 if k in bm and k in tm]
        print(f"{name}: same_metrics max relative difference {max(diffs, default=0.0):.2e} over {len(diffs)} values;"
              f" validation EM equal in every pair: "
              f"{all(r['baseline']['eval_em'] == r['this tree']['eval_em'] for r in reports)}")
        print(f"RESULT lab_step_s_over_baseline_{name} {statistics.median(step_ratio):.3f}")
        print(f"RESULT lab_eval_s_over_baseline_{name} {statistics.median(eval_ratio):.3f}")
        worst["step"] = max(worst["step"], statistics.median(step_ratio))
        worst["eval"] = max(worst["eval"], statistics.median(eval_ratio))
    print(f"RESULT lab_step_s_over_baseline {worst['step']:.3f}")
    print(f"RESULT lab_eval_s_over_baseline {worst['eval']:.3f}")


def jobs_and_threads(args: argparse.Namespace, world: Path) -> None:
    """Two runs of this tree's ``--configs`` (the first) as the grid would run them: two single-threaded jobs side by
    side, then one two-threaded job after the other; the wall time of each way."""
    name = args.configs.split(",")[0]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        t0 = time.perf_counter()
        procs = [(start_child(ROOT, CONFIGS[name], world, args.steps, False, d, threads=1), d) for d in (a, b)]
        side_by_side = [child_report(p, d) for p, d in procs]
        two_jobs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    one_after_other = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as d:
            one_after_other.append(child_report(start_child(ROOT, CONFIGS[name], world, args.steps, False, d,
                                                            threads=2), d))
    one_job_s = time.perf_counter() - t0
    step = lambda reps: statistics.median(s for r in reps for s in r["step_s"])  # noqa: E731
    print(f"{name}: 2 jobs x 1 thread: {two_jobs_s:.0f} s for two runs (a step {step(side_by_side):.2f} s, a "
          f"validation pass {statistics.median(r['eval_s'] for r in side_by_side):.1f} s); 1 job x 2 threads: "
          f"{one_job_s:.0f} s (a step {step(one_after_other):.2f} s, a validation pass "
          f"{statistics.median(r['eval_s'] for r in one_after_other):.1f} s)")
    print(f"RESULT lab_two_jobs_s_over_one_job_two_threads_{name} {two_jobs_s / one_job_s:.3f}")


def profile(args: argparse.Namespace, world: Path) -> None:
    tree = Path(args.tree).resolve() if args.tree else ROOT
    for name in args.configs.split(","):
        rep = run_child(tree, CONFIGS[name], world, args.steps, True)
        step = statistics.median(rep["step_s"])
        phases = {k: statistics.median(p.get(k, 0.0) for p in rep["phases"]) for k in rep["phases"][0]}
        phases["rest of the step (advantages, metrics, bookkeeping)"] = step - sum(phases.values())
        print(f"\n{name} ({CONFIGS[name]}), one thread: a training step {step:.2f} s (median of {len(rep['step_s'])})")
        print("| phase | s per step | share |\n|---|---|---|")
        for key, s in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"| {key} | {s:.2f} | {s / step:.0%} |")
        ev = dict(rep["eval_phases"])
        ev["rest of the pass (prompts, turns, EM)"] = rep["eval_s"] - sum(ev.values())
        print(f"\nvalidation pass, {rep['eval_questions']} questions, greedy: {rep['eval_s']:.1f} s")
        print("| phase | s | share |\n|---|---|---|")
        for key, s in sorted(ev.items(), key=lambda kv: -kv[1]):
            print(f"| {key} | {s:.1f} | {s / rep['eval_s']:.0%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    ap.add_argument("--configs", default="prereg,tiny", help=f"comma-separated, of {sorted(CONFIGS)}")
    ap.add_argument("--pairs", type=int, default=3, help="alternating (baseline, this tree) pairs per config")
    ap.add_argument("--steps", type=int, default=2, help="timed training steps per child (after one warm-up step)")
    ap.add_argument("--world", default=str(ROOT / ".cache" / "world"), help="a built world (make world)")
    ap.add_argument("--profile", action="store_true", help="the phase table of one tree instead of the comparison")
    ap.add_argument("--jobs-threads", action="store_true", help="two runs as 2 jobs x 1 thread and as 1 job x 2 "
                    "threads, on this tree (the first of --configs), instead of the comparison")
    ap.add_argument("--tree", default="", help="--profile: the tree to profile (default this one)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    world = Path(args.world).resolve()
    if not (world / "world.json").is_file():
        sys.exit(f"no world at {world}: build it with `make world` (or pass --world DIR)")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        sys.exit(f"unknown config(s) {sorted(unknown)}; known: {sorted(CONFIGS)}")
    (profile if args.profile else jobs_and_threads if args.jobs_threads else compare)(args, world)


if __name__ == "__main__":
    main()
