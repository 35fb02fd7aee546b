"""The embedded default, end to end on a CPU (what `make demo` runs):

    1. build (or reuse) the synthetic search world: corpus, retriever index, QA splits (train / validation / test),
       tokenizer, warm-started policy (``python -m searchr1_lld.world build``; configs/world/default.yaml into
       .cache/world); for the default world the policy is the one shipped in assets/warm-start (checked to be built
       for this world on the same data; training it anew takes ~20 min on 2 cores)
    2. train GRPO + LLDS on it (configs/tiny.yaml) at the learning rate and step count chosen on the validation split
       (``docs/demo/select/``); when the warm start (step 0) scored best there, nothing is trained
    3. score the warm start and the trained policy greedily on the validation split: the gain is claimed only where
       its interval excludes 0; then score the test split, once, next to the baselines (the majority training answer
       per question type, the warm start without retrieval), by hop and on the not-guessable slice (test questions
       whose gold answer is no training answer), print the table and one trajectory, and write the result's figure:
       warm start vs trained test EM by hop with 95 % intervals (``RUN/demo-eval/em_by_hop.png``)

    python -m searchr1_lab.demo [--config configs/tiny.yaml] [--world FILE] [--world-dir DIR] [--report DIR]
                                [--select-dir DIR] [--seeds 0,1,2] [dotted.key=value ...]
    python -m searchr1_lab.demo --select-lr 1e-3 [--select-steps 30] [--select-eval-every 5]   # one selection run

How the settings are chosen (validation only): the warm start's greedy validation EM (step 0) and one run per
learning rate of ``--select-steps`` steps at a constant learning rate, its greedy validation EM every
``--select-eval-every`` steps (``--select-lr``, one file per rate in ``--select-dir``); the demo then trains at the
(learning rate, step) with the highest validation EM (ties: fewer steps, so the warm start wins a tie; then the lower
rate). With a constant rate and no warm-up a run of N steps is the first N steps of the selection run, so the chosen
policy is the one the selection measured. The test split is scored once, at the end.

Every interval is a 95 % paired bootstrap that resamples the questions' subjects, not the questions
(:mod:`searchr1_lab.stats.bootstrap`): questions about one entity stand or fall together.

``--report DIR`` also writes the result as ``DIR/summary.json``, ``DIR/em_by_hop.png`` and ``DIR/README.md``
(docs/demo/ holds the committed one; the README quotes its line, :func:`readme_line`, and shows its figure); with
``--seeds`` one report per seed in ``DIR/seed<N>/`` and the spread over the seeds in ``DIR/README.md`` and
``DIR/seeds.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from searchr1_lld.bookkeeping.checkpoint import latest_checkpoint
from searchr1_lld.bookkeeping.files import write_json_atomic
from searchr1_lld.cli import run_main
from searchr1_lld.bookkeeping.tracking import describe_machine, quiet_library_output, read_metrics
from searchr1_lld.config import Config, ConfigError, load_config
from searchr1_lld.config.loading import save_config
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lab.baselines import NoRetrieval, majority_correct, question_table, read_split
from searchr1_lab.evaluating import evaluate_policy, load_policy
from searchr1_lab.methods import REPO_ROOT, parse_seeds
from searchr1_lab.demo.report import (INTERVAL_TEXT, RESULT_FIGURE, claimed, em_intervals, em_table,
                                      format_example, gain_intervals, pick_example, question_slices, readme_line,
                                      replace_readme_line, repo_relative, seeds_summary, write_figure,
                                      write_report, write_seeds_report)
from searchr1_lab.demo.selection import (SELECT_EVAL_EVERY, SELECT_OVERRIDES, SELECT_STEPS, choose,
                                         read_warm_start, selection_file, selection_overrides, warm_start_file)
from searchr1_lld.learner.trainer import RunResult, train
from searchr1_lld.world import ensure_world, is_built, load_world_config, read_card, trainer_overrides
from searchr1_lld.world.build import warm_start_shortfalls
from searchr1_lld.world.config import WorldConfig

SPLIT_FILES = {"val": "val.jsonl", "test": "test.jsonl"}
def _read_trajectories(eval_dir: Path) -> dict[str, dict]:
    path = eval_dir / "trajectories.jsonl"
    return {r["id"]: r for r in read_jsonl(path)} if path.is_file() else {}


def _evaluate(cfg_file: Path, world: Path, split: str, policies: dict[str, Path], out: Path,
              limit: int = 0) -> dict[str, dict]:
    """Greedy ``eval.py`` of ``policies`` (name -> policy dir) on the world's ``split`` (the first ``limit``
    questions; 0 = every one) into ``out/<name>``; per name, the trajectories by question id. Its progress bars
    (``logging.progress_bar`` of ``cfg_file``) and errors go to this process's stderr; RuntimeError when it fails."""
    cmd = [sys.executable, str(REPO_ROOT / "eval.py"), "--datasets", f"synthetic={world / 'qa' / SPLIT_FILES[split]}",
           "--config", str(cfg_file), "--out", str(out), "--limit", str(limit), "--overwrite",
           "--compare", *(f"{name}={path}" for name, path in policies.items())]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE)
    if proc.returncode != 0:
        raise RuntimeError(f"eval.py on {split} failed (exit status {proc.returncode}; its error is above)")
    (out / "table.md").write_text(proc.stdout.strip() + "\n")
    return {name: _read_trajectories(out / name) for name in policies}


def _correct(trajectories: dict[str, dict]) -> dict[str, int]:
    return {i: int(r["em"] > 0.5) for i, r in trajectories.items()}


def measure_warm_start(cfg: Config, world: Path, select_dir: Path, out: Path) -> dict[str, Any]:
    """Step 0 of the selection: the warm start's greedy validation EM and per-question result on the questions the
    selection runs score, in :func:`warm_start_file` (measured once per world: reused while the world's config hash
    is the same)."""
    world_hash = (read_card(world) or {}).get("config_hash")
    known = read_warm_start(select_dir)
    if known is not None and known.get("world_hash") == world_hash:
        return known
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    limit = cfg.trainer.eval_limit or cfg.eval.limit  # the questions the selection runs' curves score
    correct = _correct(_evaluate(out / "config.yaml", world, "val", {"warm_start": world / "model"}, out,
                                 limit)["warm_start"])
    record = {"val_em": sum(correct.values()) / len(correct), "world_hash": world_hash, "correct": correct}
    path = warm_start_file(select_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)  # the grid runs two selection runs at once: each writes it whole
    return record


def select_run(cfg_path: str, world: Path, lr: float, select_dir: Path, overrides: list[str],
               steps: int = SELECT_STEPS, eval_every: int = SELECT_EVAL_EVERY) -> Path:
    """One selection run at ``lr`` (``steps`` steps, validation EM every ``eval_every``); resumes an interrupted one;
    writes its validation curve to :func:`selection_file`, and the warm start's (step 0) when it is not measured."""
    cfg = load_config(cfg_path, trainer_overrides(world) + [
        *SELECT_OVERRIDES, f"trainer.lr={lr}", f"trainer.total_steps={steps}",
        f"trainer.eval_every={eval_every}", "trainer.save_every=5", "trainer.keep_last_k=1",
        f"trainer.run_name=demo-select-lr{lr:g}", *overrides])
    result = train(cfg, evaluate=False)
    measure_warm_start(cfg, world, select_dir, Path(result.run_dir) / "eval-step0")
    records = read_metrics(Path(result.run_dir) / "metrics.jsonl")
    curve = [[int(r["step"]), r["eval/val_em"]] for r in records if "eval/val_em" in r]
    out = selection_file(select_dir, lr)
    out.write_text(json.dumps({"lr": lr, "seed": cfg.trainer.seed, "steps": steps, "eval_every": eval_every,
                               "world_hash": (read_card(world) or {}).get("config_hash"), "val_curve": curve},
                              indent=2) + "\n")
    return out


def baselines(world: Path, cfg: Config, out: Path) -> dict[str, dict[str, int]]:
    """Per test question, 0/1 of the majority training answer and of the warm start without retrieval."""
    test_rows = read_split(world, "test")
    model, tokenizer = load_policy(world / "model", world)
    evaluate_policy(model, tokenizer, NoRetrieval(), cfg, world, out / "warm_start_no_retrieval",
                    name="warm start, no retrieval", limit=0)
    return {"majority": majority_correct(test_rows, read_split(world, "train")),
            "warm_start_no_retrieval": _correct(_read_trajectories(out / "warm_start_no_retrieval"))}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "tiny.yaml"), help="the run config")
    parser.add_argument("--world", default=str(REPO_ROOT / "configs" / "world" / "default.yaml"),
                        help="the synthetic world's config (configs/world/*.yaml)")
    parser.add_argument("--world-dir", default=".cache/world", help="where the world is built (or reused)")
    parser.add_argument("--report", help="also write summary.json and README.md of the result into this dir")
    parser.add_argument("--select-dir", default=str(REPO_ROOT / "docs" / "demo" / "select"),
                        help="the selection's results (step 0 and one file per rate): the demo trains at their best")
    parser.add_argument("--select-lr", type=float, help="run the selection run at this learning rate and stop")
    parser.add_argument("--select-steps", type=int, default=SELECT_STEPS, help="with --select-lr: steps of the run")
    parser.add_argument("--select-eval-every", type=int, default=SELECT_EVAL_EVERY,
                        help="with --select-lr: validation EM every N steps")
    parser.add_argument("--seeds", help="comma list of training seeds: the chosen settings trained and scored once "
                        "per seed (with --report: DIR/seed<N>/ and the spread in DIR/README.md)")
    parser.add_argument("--readme", help="with --report: also replace this README's 'Demo result:' line")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    return parser


def _settings(args: argparse.Namespace, world: Path) -> tuple[dict | None, WorldConfig, Config]:
    """The settings chosen on validation (None for a selection run, or when there are no selection runs: then a
    warning), the world's config and the run config on the world in ``world``; raises ConfigError or ValueError."""
    chosen = choose(args.select_dir) if args.select_lr is None else None
    if args.select_lr is None and chosen is None:
        print(f"WARNING: no selection runs in {args.select_dir}: training with {args.config} as it is, settings not "
              "chosen on validation (python -m searchr1_lab.demo --select-lr LR, one per rate; docs/demo/README.md)",
              flush=True)
    world_cfg = load_world_config(args.world)
    extra = selection_overrides(chosen) if chosen else []
    return chosen, world_cfg, load_config(args.config, trainer_overrides(world) + extra + list(args.overrides))


def _prepare_world(world: Path, world_cfg: WorldConfig) -> bool:
    """Step 1: the world in ``world``, built unless it was built earlier (then True), with the repository's shipped
    warm start when it was made for this world (:mod:`searchr1_lld.world.shipped`); its warm start's shortfalls as
    warnings."""
    world_reused = is_built(world, world_cfg)
    print(f"[1/3] synthetic world in {world}{' (built earlier)' if world_reused else ''}", flush=True)
    ensure_world(world, world_cfg)  # takes the shipped warm start itself when there is one for this world
    shipped = None if world_reused else _shipped_policy(world)
    if shipped:
        print(f"      its policy: the warm start shipped in {shipped}", flush=True)
    for line in warm_start_shortfalls(read_card(world) or {}):
        print(f"WARNING: {line} (the warm start's targets; what it means for RL: docs/lab.md)", flush=True)
    return world_reused


def _shipped_policy(world: Path) -> str | None:
    """Where the world's policy was shipped from (repository-relative), None when its build trained it."""
    shipped = ((read_card(world) or {}).get("warm_start_from") or {}).get("dir")
    return repo_relative(Path(shipped)) if shipped else None


def _train(cfg: Config, chosen: dict | None) -> tuple[RunResult | None, Path]:
    """Step 2: GRPO + LLDS at the chosen settings (a finished run with the same settings is reused as it is); the
    run (None when the warm start was chosen) and the policy to score."""
    if chosen is not None and chosen["steps"] == 0:
        print(f"[2/3] the warm start (step 0) scored best on validation (EM {chosen['val_em']:.2f}): nothing to "
              "train", flush=True)
        return None, Path(cfg.model.path)
    how = f"chosen on validation: EM {chosen['val_em']:.2f}" if chosen else "not chosen on validation"
    print(f"[2/3] training GRPO + LLDS (configs: algorithm.llds.*) at lr {cfg.trainer.lr:g} for "
          f"{cfg.trainer.total_steps} steps, seed {cfg.trainer.seed} ({how})", flush=True)
    result = train(cfg, evaluate=False)
    if not result.history:
        print(f"training was already complete in {result.run_dir} (the same settings map to the same run "
              f"directory); delete it to train again", flush=True)
    ckpt = latest_checkpoint(result.run_dir)
    if ckpt is None:
        raise RuntimeError(f"no checkpoint was written in {result.run_dir}")
    return result, ckpt / "policy"


def _score(cfg_file: Path, world: Path, split: str, policy: Path, out: Path) -> dict[str, dict]:
    """The warm start's and the trained ``policy``'s trajectories on ``split`` (one evaluation when they are one)."""
    same = policy.resolve() == (world / "model").resolve()
    policies = {"warm_start": world / "model", **({} if same else {"trained": policy})}
    traj = _evaluate(cfg_file, world, split, policies, out)
    return {"warm_start": traj["warm_start"], "trained": traj["warm_start" if same else "trained"]}


def validate(cfg_file: Path, world: Path, policy: Path, out: Path) -> dict[str, Any]:
    """Step 3a: the warm start and ``policy`` on the validation split, each slice's gain with its interval, and
    where it is claimed (the interval above 0)."""
    questions = question_table(read_split(world, "val"))
    traj = _score(cfg_file, world, "val", policy, out)
    before, after = _correct(traj["warm_start"]), _correct(traj["trained"])
    gain = gain_intervals(before, after, questions)
    return {"questions": len(questions), "subjects": len({q["subject"] for q in questions}),
            "slice_n": {k: len(v) for k, v in question_slices(questions).items()},
            "em": {"warm_start": em_intervals(before, questions), "trained": em_intervals(after, questions)},
            "gain": gain, "claimed": claimed(gain)}


def score_test(cfg_file: Path, cfg: Config, world: Path, policy: Path, out: Path) -> tuple[dict[str, Any], dict]:
    """Step 3b, after the claim: the test split, scored once: every policy and baseline by slice with intervals,
    the trained policy's paired gain; and the two policies' trajectories."""
    questions = question_table(read_split(world, "test"))
    traj = _score(cfg_file, world, "test", policy, out)
    correct = {**baselines(world, cfg, out), **{k: _correct(v) for k, v in traj.items()}}
    return {"test_em": {k: em_intervals(c, questions) for k, c in correct.items()},
            "test_gain": gain_intervals(correct["warm_start"], correct["trained"], questions),
            "slice_n": {k: len(v) for k, v in question_slices(questions).items()},
            "test_subjects": len({q["subject"] for q in questions})}, traj


def _print_result(figures: dict[str, Any], validation: dict[str, Any], traj: dict, result: RunResult | None,
                  out: Path) -> str:
    """The validation claim, the test table, one test question before and after, where everything is; returns the
    example's text."""
    print("\n" + em_table(validation["em"], validation["gain"], validation["slice_n"], "validation"))
    print("claimed on validation (interval above 0): "
          + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in validation["claimed"].items()))
    print("\n" + em_table(figures["test_em"], figures["test_gain"], figures["slice_n"], "test") + "\n")
    print(f"{INTERVAL_TEXT}; not guessable: the {figures['slice_n']['not_guessable']} test questions whose gold answer "
          "is no training question's answer (the majority baseline scores 0 there by construction)\n")
    before, after = traj["warm_start"], traj["trained"]
    rid = pick_example(before, after)
    example = (format_example(rid, before[rid], after[rid]) if rid is not None
               else "(no test question that the trained policy answers and the warm start does not)")
    print(example + "\n")
    if result is not None:
        m = result.final_metrics
        keys = [k for k in ("reward/em_mean", "rollout/valid_searches_mean", "llds/active_token_frac",
                            "actor/grad_norm", "actor/entropy") if k in m]
        print("last training step: " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
        print(f"run directory: {result.run_dir} (training curves: {Path(result.run_dir) / 'plots'})")
    print(f"tables: {out / 'test' / 'table.md'} {out / 'val' / 'table.md'}")
    return example


def run_recipe(args: argparse.Namespace, cfg: Config, chosen: dict | None, world: Path) -> tuple[dict, str, str]:
    """Steps 2 and 3 for one seed: train at the chosen settings, claim on validation, test once; the summary, the
    evaluator's test table and the example."""
    t0 = time.time()
    result, policy = _train(cfg, chosen)
    t_train = time.time() - t0
    out = (Path(result.run_dir) if result else Path(cfg.trainer.output_dir) / "demo-warm-start") / "demo-eval"
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    print("[3/3] greedy evaluation: validation (the claim), then the test split, once", flush=True)
    validation = validate(out / "config.yaml", world, policy, out / "val")
    figures, traj = score_test(out / "config.yaml", cfg, world, policy, out / "test")
    example = _print_result(figures, validation, traj, result, out)
    summary = {"machine": describe_machine(), "torch": torch.__version__, "seed": cfg.trainer.seed,
               "steps": result.steps if result else 0,
               "method": "grpo+llds" if cfg.algorithm.llds.enabled else "grpo", "selection": chosen,
               "overrides": list(args.overrides), "validation": validation, **figures,
               "world_config_hash": (read_card(world) or {}).get("config_hash"),
               "time_s": {"training": round(result.train_s, 1) if result else 0, "train_call": round(t_train, 1),
                          "eval": round(time.time() - t0 - t_train)}}
    print(f"figure of the result (test EM by hop, warm start vs trained): {write_figure(summary, out / RESULT_FIGURE)}")
    return summary, (out / "test" / "table.md").read_text().strip(), example


def command_line(args: argparse.Namespace) -> str:
    """The command that makes the report of ``args``: every option that differs from its default (paths relative
    to the repository), ``--seeds``, ``--report``, ``--readme`` and the overrides."""
    defaults = _parser().parse_args([])
    parts = ["python -m searchr1_lab.demo"]
    for name in ("config", "world", "world_dir", "select_dir"):
        value = getattr(args, name)
        if Path(value).resolve() != Path(getattr(defaults, name)).resolve():
            parts += [f"--{name.replace('_', '-')}", repo_relative(Path(value))]
    parts += ["--seeds", args.seeds] if args.seeds else []
    parts += ["--report", repo_relative(Path(args.report))]
    parts += ["--readme", repo_relative(Path(args.readme))] if args.readme and not args.seeds else []
    return " ".join(parts + list(args.overrides))


def _write_outputs(args: argparse.Namespace, report: Path, summary: dict, table: str, example: str) -> int:
    """``--report``: the report (refused when the settings were not chosen on validation) and, with ``--readme``,
    the README's demo line."""
    if summary["selection"] is None:
        print("no report: the settings were not chosen on validation", file=sys.stderr)
        return 2
    if args.seeds:
        command = f"`{command_line(args)}`, seed {summary['seed']}"
    else:
        command = f"`{command_line(args)}` (what `make demo` runs, plus the report)"
    write_report(report, summary, table, example, command)
    print(f"report: {report / 'README.md'}")
    print(readme_line(summary))
    if args.readme and not args.seeds:
        path = Path(args.readme)
        path.write_text(replace_readme_line(path.read_text(), readme_line(summary)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C -> one line, exit status 130 (:func:`searchr1_lld.cli.run_main`)."""
    return run_main(_main, argv, prog="python -m searchr1_lab.demo")


def _main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    world = Path(args.world_dir)
    try:
        chosen, world_cfg, cfg = _settings(args, world)
        seeds = parse_seeds(args.seeds) if args.seeds else [cfg.trainer.seed]
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    quiet_library_output()
    t0 = time.time()
    world_reused = _prepare_world(world, world_cfg)
    t_world = time.time() - t0
    if args.select_lr is not None:
        path = select_run(args.config, world, args.select_lr, Path(args.select_dir), list(args.overrides),
                          args.select_steps, args.select_eval_every)
        print(f"selection run at lr {args.select_lr:g}: {path}")
        return 0
    summaries = []
    for seed in seeds:
        seed_cfg = cfg if not args.seeds else load_config(args.config, trainer_overrides(world) + (
            selection_overrides(chosen) if chosen else []) + list(args.overrides) + [f"trainer.seed={seed}"])
        try:
            summary, table, example = run_recipe(args, seed_cfg, chosen, world)
        except RuntimeError as e:
            print(str(e), file=sys.stderr)
            return 1
        summary.update(world_reused=world_reused, world_policy_shipped=_shipped_policy(world),
                       time_s={"world": round(t_world), **summary["time_s"]})
        summaries.append(summary)
        if args.report:
            rc = _write_outputs(args, Path(args.report) / f"seed{seed}" if args.seeds else Path(args.report),
                                summary, table, example)
            if rc:
                return rc
    if args.report and args.seeds:
        write_seeds_report(Path(args.report), seeds_summary(summaries), command_line(args))
        print(f"seeds: {Path(args.report) / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
