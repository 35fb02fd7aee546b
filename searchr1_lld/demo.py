"""The embedded default, end to end on a CPU (what `make demo` runs):

    1. build (or reuse) the synthetic search world: corpus, retriever index, QA splits (train / validation / test),
       tokenizer, warm-started policy (``python -m searchr1_lld.world build``; configs/world/default.yaml into
       .cache/world)
    2. train GRPO + LLDS on it (configs/tiny.yaml, with the learning rate and step count chosen on the validation
       split, ``docs/demo/select/``): metrics.jsonl, plots, checkpoints in the run directory
    3. evaluate the warm start and the trained policy greedily on the world's test split, next to the baselines
       (the majority training answer per question type, the warm start without retrieval) and on the not-guessable
       slice (test questions whose gold answer is no training answer), and print the table

    python -m searchr1_lld.demo [--config configs/tiny.yaml] [--world FILE] [--world-dir DIR] [--report DIR]
                                [--select-dir DIR] [dotted.key=value ...]
    python -m searchr1_lld.demo --select-lr 1e-3 [--select-dir docs/demo/select]   # one selection run

How the settings are chosen (validation only): one run per learning rate of ``SELECT_STEPS`` steps at a constant
learning rate, its greedy validation EM every ``SELECT_EVAL_EVERY`` steps (``--select-lr``, one file per rate in
``--select-dir``); the demo then trains at the (learning rate, step) with the highest validation EM (ties: fewer
steps, then the lower rate). With a constant rate and no warm-up a run of N steps is the first N steps of the
selection run, so the chosen policy is the one the selection measured. The test split is scored once, at the end.

``--report DIR`` also writes the result as ``DIR/summary.json`` and ``DIR/README.md`` (docs/demo/ holds the committed
one, which the README quotes: :func:`readme_line`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from searchr1_lld.bookkeeping.checkpoint import latest_checkpoint
from searchr1_lld.bookkeeping.tracking import describe_machine, quiet_library_output, read_metrics
from searchr1_lld.config import Config, ConfigError, load_config
from searchr1_lld.jsonl import read_jsonl
from searchr1_lld.lab.baselines import (NoRetrieval, correct_by_id, majority_correct, question_table, read_split,
                                        slice_em)
from searchr1_lld.lab.evaluating import evaluate_policy, load_policy
from searchr1_lld.lab.selection import (SELECT_EVAL_EVERY, SELECT_OVERRIDES, SELECT_STEPS, choose,
                                        selection_file, selection_overrides)
from searchr1_lld.learner.trainer import RunResult, train
from searchr1_lld.world import ensure_world, is_built, load_world_config, read_card, trainer_overrides
from searchr1_lld.world.build import warm_start_shortfalls
from searchr1_lld.world.config import WorldConfig

REPO = Path(__file__).resolve().parent.parent


def _read_trajectories(eval_dir: Path) -> dict[str, dict]:
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


BASELINE_LABELS = {"majority": "majority training answer per question type",
                   "warm_start_no_retrieval": "warm start, no retrieval", "warm_start": "warm start (step 0)",
                   "trained": "trained"}


def readme_line(summary: dict) -> str:
    """The README's one-line demo result, from the demo's summary.json."""
    em, ch = summary["test_em"], summary["selection"]
    before, after, n = em["warm_start"]["all"], em["trained"]["all"], summary["test_questions"]
    noise = 2 * math.sqrt(before * (1 - before) / n)  # two binomial standard errors of one run's EM on n questions
    change = round(after - before, 2)
    return (f"Demo result: test EM {before:.2f} -> {after:.2f}, not-guessable slice "
            f"{em['warm_start']['not_guessable']:.2f} -> {em['trained']['not_guessable']:.2f}, majority-answer "
            f"baseline {em['majority']['all']:.2f} (seed {summary['seed']}, lr {ch['lr']:g} and {ch['steps']} steps "
            f"chosen on validation, 2-core {summary['machine'].split(',')[0]}); the change, {change:+.2f}, is "
            f"{'within' if abs(change) <= noise else 'beyond'} ±{noise:.2f}, two binomial standard errors of one "
            f"run's EM on {n} questions")


def replace_readme_line(text: str, line: str) -> str:
    """``text`` with its one line that begins with ``Demo result:`` replaced by ``line``."""
    lines = text.split("\n")
    at = [i for i, old in enumerate(lines) if old.startswith("Demo result:")]
    if len(at) != 1:
        raise ValueError(f"the README must have exactly one 'Demo result:' line, found {len(at)}")
    lines[at[0]] = line
    return "\n".join(lines)


def slice_table(em: dict, n: dict) -> str:
    """Test EM of every policy and baseline: all questions, the not-guessable slice, by hop count."""
    cols = [k for k in ("all", "not_guessable", "1-hop", "2-hop") if k in em["trained"]]
    head = {"all": f"all ({n['all']})", "not_guessable": f"not guessable ({n['not_guessable']})"}
    lines = ["| test EM | " + " | ".join(head.get(c, c) for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for key, label in BASELINE_LABELS.items():
        lines.append(f"| {label} | " + " | ".join(f"{em[key][c]:.2f}" if em[key].get(c) is not None else "-"
                                                   for c in cols) + " |")
    return "\n".join(lines)


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (a committed report names no machine's dirs)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def write_report(report_dir: Path, summary: dict, table: str, example: str) -> None:
    """``summary.json`` and a README.md that shows it (the numbers README.md's demo line quotes)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    em, ch = summary["test_em"], summary["selection"]
    cand = "\n".join(f"| {c['lr']:g} | {c['steps']} | {c['val_em']:.2f} |" for c in ch["candidates"])
    lines = [
        "# The demo's result", "",
        f"Generated by `python -m searchr1_lld.demo --report {repo_relative(report_dir)}` (what `make demo` runs, "
        "plus the report).", "",
        f"- machine: {summary['machine']}; torch {summary['torch']}",
        f"- run: configs/tiny.yaml, seed {summary['seed']}, {summary['steps']} steps of GRPO + LLDS "
        f"({summary['method']}) at lr {ch['lr']:g} (constant), {summary['test_questions']} test questions, greedy",
        f"- chosen on the validation split (validation EM {ch['val_em']:.2f}): {ch['procedure']}",
        f"- test EM: warm start {em['warm_start']['all']:.2f} -> trained {em['trained']['all']:.2f} "
        f"({em['trained']['all'] - em['warm_start']['all']:+.2f}); on the {summary['slice_n']['not_guessable']} "
        f"not-guessable questions (gold answer is no training answer) {em['warm_start']['not_guessable']:.2f} -> "
        f"{em['trained']['not_guessable']:.2f}",
        f"- wall time: world {summary['time_s']['world']:.0f} s"
        f"{' (built earlier, reused)' if summary['world_reused'] else ''}, training {summary['time_s']['training']:.0f} s, "
        f"evaluation {summary['time_s']['eval']:.0f} s; world config hash {summary['world_config_hash']}", "",
        slice_table(em, summary["slice_n"]), "",
        "## The selection (validation split)", "", "| lr | step | validation EM |", "|---:|---:|---:|", cand, "",
        "## The evaluator's table", "", table, "", "## One test question", "", "```", example, "```", "",
    ]
    (report_dir / "README.md").write_text("\n".join(lines))


def select_run(cfg_path: str, world: Path, lr: float, select_dir: Path, overrides: list[str]) -> Path:
    """One selection run at ``lr`` (:data:`SELECT_STEPS` steps, validation EM every :data:`SELECT_EVAL_EVERY`);
    resumes an interrupted one; writes its validation curve to :func:`selection_file`."""
    cfg = load_config(cfg_path, trainer_overrides(world) + [
        *SELECT_OVERRIDES, f"trainer.lr={lr}", f"trainer.total_steps={SELECT_STEPS}",
        f"trainer.eval_every={SELECT_EVAL_EVERY}", "trainer.save_every=5", "trainer.keep_last_k=1",
        f"trainer.run_name=demo-select-lr{lr:g}", *overrides])
    result = train(cfg, evaluate=False)
    records = read_metrics(Path(result.run_dir) / "metrics.jsonl")
    curve = [[int(r["step"]), r["eval/val_em"]] for r in records if "eval/val_em" in r]
    out = selection_file(select_dir, lr)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"lr": lr, "seed": cfg.trainer.seed, "steps": SELECT_STEPS,
                               "eval_every": SELECT_EVAL_EVERY, "val_curve": curve}, indent=2) + "\n")
    return out


def baselines_and_slices(world: Path, cfg: Config, before: dict, after: dict, out: Path) -> tuple[dict, dict]:
    """Test EM (all, not-guessable slice, by hops) of the trained policy, the warm start, the warm start without
    retrieval and the majority training answer; and the slice sizes."""
    test_rows = read_split(world, "test")
    questions = question_table(test_rows)
    model, tokenizer = load_policy(world / "model", world)
    evaluate_policy(model, tokenizer, NoRetrieval(), cfg, world, out / "warm_start_no_retrieval",
                    name="warm start, no retrieval", limit=0)
    correct = {"majority": majority_correct(test_rows, read_split(world, "train")),
               "warm_start_no_retrieval": correct_by_id(out / "warm_start_no_retrieval"),
               "warm_start": {i: int(r["em"] > 0.5) for i, r in before.items()},
               "trained": {i: int(r["em"] > 0.5) for i, r in after.items()}}
    hops = {q["id"]: q["hops"] for q in questions}
    em = {}
    for key, c in correct.items():
        em[key] = slice_em(c, questions)
        for h in sorted(set(hops.values())):
            sel = [c[i] for i in hops if hops[i] == h]
            em[key][f"{h}-hop"] = sum(sel) / len(sel)
    n = {"all": len(questions), "not_guessable": sum(not q["train_answer"] for q in questions)}
    return em, n


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"))
    parser.add_argument("--world", default=str(REPO / "configs" / "world" / "default.yaml"),
                        help="the synthetic world's config (configs/world/*.yaml)")
    parser.add_argument("--world-dir", default=".cache/world", help="where the world is built (or reused)")
    parser.add_argument("--report", help="also write summary.json and README.md of the result into this dir")
    parser.add_argument("--select-dir", default=str(REPO / "docs" / "demo" / "select"),
                        help="the selection runs' results: the demo trains at the best of them")
    parser.add_argument("--select-lr", type=float, help="run the selection run at this learning rate and stop")
    parser.add_argument("--readme", help="with --report: also replace this README's 'Demo result:' line")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    return parser


def _settings(args: argparse.Namespace, world: Path) -> tuple[dict | None, WorldConfig, Config]:
    """The settings chosen on validation (None for a selection run, or when there are no selection runs: then a
    warning), the world's config and the run config on the world in ``world``; raises ConfigError."""
    chosen = choose(args.select_dir) if args.select_lr is None else None
    if args.select_lr is None and chosen is None:
        print(f"WARNING: no selection runs in {args.select_dir}: training with {args.config} as it is, settings not "
              "chosen on validation (python -m searchr1_lld.demo --select-lr LR, one per rate; docs/demo/README.md)",
              flush=True)
    world_cfg = load_world_config(args.world)
    extra = selection_overrides(chosen) if chosen else []
    return chosen, world_cfg, load_config(args.config, trainer_overrides(world) + extra + list(args.overrides))


def _prepare_world(world: Path, world_cfg: WorldConfig) -> bool:
    """Step 1: the world in ``world``, built unless it was built earlier (then True); its warm start's shortfalls as
    warnings."""
    world_reused = is_built(world, world_cfg)
    print(f"[1/3] synthetic world in {world}{' (built earlier)' if world_reused else ''}", flush=True)
    ensure_world(world, world_cfg)
    for line in warm_start_shortfalls(read_card(world) or {}):
        print(f"WARNING: {line} (the warm start's targets; what it means for RL: docs/lab.md)",
              flush=True)
    return world_reused


def _train(cfg: Config, chosen: dict | None) -> RunResult:
    """Step 2: GRPO + LLDS at the chosen settings (a finished run with the same settings is reused as it is)."""
    how = f"chosen on validation: EM {chosen['val_em']:.2f}" if chosen else "not chosen on validation"
    print(f"[2/3] training GRPO + LLDS (configs: algorithm.llds.*) at lr {cfg.trainer.lr:g} for "
          f"{cfg.trainer.total_steps} steps ({how})", flush=True)
    result = train(cfg, evaluate=False)
    if not result.history:
        print(f"training was already complete in {result.run_dir} (the same settings map to the same run "
              f"directory); delete it to train again", flush=True)
    return result


def _eval_command(cfg: Config, world: Path, run_dir: Path, policy: Path, out: Path, method: str) -> list[str]:
    """Step 3's ``eval.py`` call: the warm start and the trained ``policy`` (named ``method``) on the world's test
    split, greedily, into ``out``."""
    cmd = [sys.executable, str(REPO / "eval.py"), "--datasets", f"synthetic={world / 'qa' / 'test.jsonl'}",
           "--config", str(run_dir / "config.yaml"), "--out", str(out),
           "--compare", f"warm_start={world / 'model'}", f"{method}={policy}"]
    if cfg.trainer.eval_limit:
        cmd += ["--limit", str(cfg.trainer.eval_limit)]
    return cmd


def _print_result(result: RunResult, out: Path, em: dict, slice_n: dict, before: dict, after: dict,
                  times: tuple[float, float, float]) -> str:
    """The slice table, one test question before and after, the last training step and where everything is;
    returns the example's text."""
    plots = sorted((Path(result.run_dir) / "plots").glob("*.png"))
    print("\n" + slice_table(em, slice_n) + "\n")
    print(f"not guessable: the {slice_n['not_guessable']} test questions whose gold answer is no training question's "
          "answer (the majority baseline scores 0 there by construction)\n")
    rid = pick_example(before, after)
    example = (format_example(rid, before[rid], after[rid]) if rid is not None
               else "(no test question that the trained policy answers and the warm start does not)")
    print(example + "\n")
    m = result.final_metrics
    keys = [k for k in ("reward/em_mean", "rollout/valid_searches_mean", "llds/active_token_frac", "actor/grad_norm", "actor/entropy") if k in m]
    if keys:
        print("last training step: " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
    t_world, t_train, t_eval = times
    print(f"wall time: world {t_world:.0f}s, training {t_train:.0f}s ({result.steps} steps), eval {t_eval:.0f}s")
    print(f"run directory: {result.run_dir}")
    print(f"plots: {Path(result.run_dir) / 'plots'} ({', '.join(p.name for p in plots) if plots else 'none written'})")
    print(f"tables: {out / 'results.md'} {out / 'results.csv'}")
    return example


def _write_outputs(args: argparse.Namespace, summary: dict, table: str, example: str) -> int:
    """``--report``: the report (refused when the settings were not chosen on validation) and, with ``--readme``,
    the README's demo line."""
    if summary["selection"] is None:
        print("no report: the settings were not chosen on validation", file=sys.stderr)
        return 2
    write_report(Path(args.report), summary, table, example)
    print(f"report: {Path(args.report) / 'README.md'}")
    print(readme_line(summary))
    if args.readme:
        path = Path(args.readme)
        path.write_text(replace_readme_line(path.read_text(), readme_line(summary)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    world = Path(args.world_dir)
    try:
        chosen, world_cfg, cfg = _settings(args, world)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    quiet_library_output()
    t0 = time.time()
    world_reused = _prepare_world(world, world_cfg)
    t_world = time.time() - t0
    if args.select_lr is not None:
        path = select_run(args.config, world, args.select_lr, Path(args.select_dir), list(args.overrides))
        print(f"selection run at lr {args.select_lr:g}: {path}")
        return 0
    result = _train(cfg, chosen)
    t_train = time.time() - t0 - t_world
    ckpt = latest_checkpoint(result.run_dir)
    if ckpt is None:
        print(f"no checkpoint was written in {result.run_dir}", file=sys.stderr)
        return 1

    print("[3/3] greedy evaluation on the test split: baselines, warm start, trained", flush=True)
    out = Path(result.run_dir) / "eval"
    method = "grpo+llds" if cfg.algorithm.llds.enabled else "grpo"
    proc = subprocess.run(_eval_command(cfg, world, Path(result.run_dir), ckpt / "policy", out, method), cwd=REPO,
                          text=True, capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return proc.returncode
    before, after = _read_trajectories(out / "warm_start"), _read_trajectories(out / method)
    em, slice_n = baselines_and_slices(world, cfg, before, after, out)
    t_eval = time.time() - t0 - t_world - t_train
    example = _print_result(result, out, em, slice_n, before, after, (t_world, t_train, t_eval))
    if not args.report:
        return 0
    import torch

    summary = {"machine": describe_machine(), "torch": torch.__version__, "seed": cfg.trainer.seed, "steps": result.steps,
               "method": method, "test_questions": len(after), "test_em": em, "slice_n": slice_n,
               "selection": chosen, "overrides": list(args.overrides),
               "world_reused": world_reused, "world_config_hash": (read_card(world) or {}).get("config_hash"),
               "time_s": {"world": round(t_world), "training": round(t_train), "eval": round(t_eval)}}
    return _write_outputs(args, summary, proc.stdout.strip(), example)


if __name__ == "__main__":
    sys.exit(main())
