"""The comparison's resumable grid: every (method, learning rate, seed) of a grid, the baselines, and optionally the
demo's selection runs, as separate worker processes, ``jobs`` at a time (the driver: :mod:`.driver`).

    python -m searchr1_lab grid --config configs/lab/compare.yaml --lrs 5e-4,1e-3,2e-3 --seeds 0,1,2 \\
        --methods grpo,llds_action --runs-dir runs/compare --compact docs/lab/runs --jobs 2 [--demo] [--commit]
    python -m searchr1_lab task --config ... --lr 1e-3 --method grpo --seed 0 --runs-dir ... --compact ...
    python -m searchr1_lab task --baselines --config ... --runs-dir ... --compact ...
    python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --jobs 2 --commit
    python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --slurm --submit   # a job array
    python -m searchr1_lab task --config ... --lr 2e-3 --method grpo --arm grpo_kl0.01 \\
        --set algorithm.kl_coef=0.01 --seed 100 --runs-dir ... --compact ...

A registration (:mod:`.registered.registration`) names the config, the arms (a method preset and the overrides that make
it a control, each arm at its own learning rates), the seeds and both directories; its grid refuses to start before
its status is ``registered``. Outside a registration, ``--arm NAME --set KEY=VALUE ...`` runs one such arm (a pilot).

Each worker runs ``--threads`` torch/BLAS threads (``OMP_NUM_THREADS``; default: the usable cores shared out over the
``--jobs``, at least 1): two single-threaded jobs keep a 2-core machine busy through each other's serial stretches,
where one two-threaded job leaves a core idle (docs/lab.md, "The lab's cost").

A task is done when its compact result exists (``docs/lab/runs/<method>-lr<lr>-seed<seed>.json.gz``,
``baselines.json.gz``; the demo's ``docs/demo/select/lr<lr>.json`` and ``docs/demo/summary.json``): a rerun of the
same command skips it. An interrupted run resumes from its last checkpoint in ``--runs-dir`` (the lab's own resume).
After each lab result the report and its block of docs/lab/results.md are rebuilt (:func:`finish`); with ``--commit``
the result and what was rebuilt from it are committed to the current git branch as they land (those paths only).

``--slurm`` writes the same tasks as a Slurm job array into ``RUNS_DIR/slurm`` instead (:mod:`.slurm`; ``--submit``
submits the tasks not done): one task per array task, skipped when done, resumed from its checkpoint when
interrupted; after each lab result its array task rebuilds the report (one at a time); commit once it has finished.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

from retriever import make_retriever
from searchr1_lld.config import ConfigError, config_from_dict
from searchr1_lab.analysis import load_records
from searchr1_lab.baselines import NoRetrieval, correct_by_id, majority_correct, question_table, read_split
from searchr1_lab.comparison.claims import DESIGN_FILE
from searchr1_lab.comparison.report import CURVES_FILE
from searchr1_lab.compact import BASELINES_FILE, compact_name, git_commit, lr_tag, run_record, write_gz_json
from searchr1_lab.driver import Task, check_jobs, commit, interleave, run_tasks
from searchr1_lab import fresh, slurm
from searchr1_lab.evaluating import evaluate_policy, load_policy
from searchr1_lab.methods import (ARMS, REPO_ROOT, Method, lab_config, parse_methods, parse_seeds,
                                  read_lab_config, shared_settings)
from searchr1_lab.prereg.registration import PREREG_FILE, check_registered, registration_of
from searchr1_lab.prereg.report import PHENOMENA_FIGURES
from searchr1_lab.running import prepare_world, read_run_record, repo_relative, resolve_world_dir, run_lab
from searchr1_lab.demo.selection import selection_file
from searchr1_lab.registered import registration as stepsize
from searchr1_lab.studies import RESULTS_PAGE, current_command
from searchr1_lld.world import read_card


def parse_lrs(text: str) -> list[float]:
    """``"5e-4,1e-3"`` -> ``[0.0005, 0.001]`` (distinct positive numbers)."""
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--lrs must be comma-separated numbers, got {text!r}") from None
    if not lrs or min(lrs) <= 0 or len({lr_tag(x) for x in lrs}) != len(lrs):
        raise ConfigError(f"--lrs must list distinct positive learning rates, got {text!r}")
    return lrs


def run_task(config_path: str, lr: float, method: Method, seed: int, runs_root: Path, compact_dir: Path,
             world_dir: str | None = None) -> Path:
    """Train (or resume, or reuse) one run of the arm ``method`` with the lab, then write its compact result; returns
    that file. ``world_dir``: an existing world to use as is (default: the lab config's world, built on first use)."""
    out = compact_dir / compact_name(method.key, lr, seed)
    if out.is_file():
        return out
    runs_dir = runs_root / f"lr{lr_tag(lr)}"
    code = git_commit(REPO_ROOT)  # the code this run starts from
    summary = run_lab(config_path=config_path, overrides=[f"trainer.lr={lr}"], seeds=[seed], methods=[method],
                      out_dir=runs_dir / f"report-{method.key}-seed{seed}", runs_dir=runs_dir, sampled=0,
                      train_eval=0, command="python -m searchr1_lab task", world_dir=world_dir)
    rec = summary["runs"][0]
    card = read_card(REPO_ROOT / summary["world"]["dir"]) or {}  # an absolute dir stays absolute
    # the run's own settings (a registered control's overrides included), not the lab config's shared ones
    trained = read_run_record(rec["run_dir"])["config"]
    lab_run = {**rec, "settings": dict(shared_settings(config_from_dict(trained)))}
    write_gz_json(out, run_record(method, seed, lr, lab_run, load_records(rec["run_dir"]),
                                  correct_by_id(Path(rec["run_dir"]) / "eval"), card.get("config_hash"),
                                  code=code))
    return out


def run_baselines(config_path: str, runs_root: Path, compact_dir: Path, world_dir: str | None = None) -> Path:
    """The baselines of the lab's world on its validation and test splits (:mod:`.baselines`), question by question,
    into ``compact_dir/baselines.json.gz``."""
    out = compact_dir / BASELINES_FILE
    if out.is_file():
        return out
    _, world_config, _ = read_lab_config(config_path, [])
    wdir = resolve_world_dir(world_config, world_dir)
    card = prepare_world(world_config, wdir, explicit=world_dir is not None)
    cfg = lab_config(config_path, [], wdir)
    retriever = make_retriever(cfg.retriever)
    model, tokenizer = load_policy(wdir / "model", wdir)
    train_rows = read_split(wdir, "train")
    result = {"world_hash": card.get("config_hash"), "world_config": world_config, "world_dir": repo_relative(wdir),
              "world_counts": card.get("counts", {}), "splits": {}}
    for split in ("val", "test"):
        rows = read_split(wdir, split)
        correct = {"majority": majority_correct(rows, train_rows)}
        for name, search in (("warm_start", retriever), ("warm_start_no_retrieval", NoRetrieval())):
            eval_dir = runs_root / "baselines" / split / name
            evaluate_policy(model, tokenizer, search, cfg, wdir, eval_dir, name=name, split=split, limit=0)
            correct[name] = correct_by_id(eval_dir)
        result["splits"][split] = {"questions": question_table(rows), "correct": correct}
    write_gz_json(out, result)
    return out


def write_design(compact_dir: Path, design: dict) -> None:
    """``compact_dir/design.json``: the grid the report measures completeness against. A different grid into the
    same directory is refused (its results would be mixed with this one's)."""
    path = compact_dir / DESIGN_FILE
    if path.is_file() and json.loads(path.read_text()) != design:
        raise ConfigError(f"{path} holds another design ({path.read_text().strip()}); use another --compact dir")
    compact_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(design, indent=2) + "\n")


@dataclass
class LabTask(Task):
    """A task of the lab's grid: what :func:`finish` does once it is done."""

    # what to commit when it is done (with --commit), besides ``done``; ``report``: rebuild the lab's report and the
    # README's lab block first (they must stay what the committed compact results compute)
    also_commit: tuple[Path, ...] = ()
    report: bool = False


def lab_tasks(config: str, lrs: Sequence[float], seeds: Sequence[int], methods: Sequence[str], runs_root: Path,
              compact_dir: Path) -> list[LabTask]:
    """The baselines, then every run, seed by seed (so that an unfinished grid has whole seeds)."""
    common = ["--config", config, "--runs-dir", str(runs_root), "--compact", str(compact_dir)]
    py = [sys.executable, "-m", "searchr1_lab", "task"]
    tasks = [LabTask("baselines", [*py, "--baselines", *common], compact_dir / BASELINES_FILE, report=True)]
    for seed in seeds:
        for lr in lrs:
            for m in methods:
                tasks.append(LabTask(f"{m}-lr{lr_tag(lr)}-seed{seed}",
                                     [*py, "--lr", repr(lr), "--method", m, "--seed", str(seed), *common],
                                     compact_dir / compact_name(m, lr, seed), report=True))
    return tasks


def registered_tasks(reg_path: Path, reg: dict) -> list[LabTask]:
    """The baselines, then every (arm, learning rate, seed) of a registration, seed by seed."""
    block = reg["registration"]
    compact_dir = REPO_ROOT / block["runs_dir"]
    common = ["--registration", str(reg_path), "--runs-dir", str(REPO_ROOT / block["train_dir"]),
              "--compact", str(compact_dir)]
    py = [sys.executable, "-m", "searchr1_lab", "task"]
    tasks = [LabTask("baselines", [*py, "--baselines", "--config", block["config"], *common[2:]],
                     compact_dir / BASELINES_FILE, report=True)]
    for arm, lr, seed in stepsize.cells(reg):
        tasks.append(LabTask(f"{arm}-lr{lr_tag(lr)}-seed{seed}",
                             [*py, "--arm", arm, "--lr", repr(lr), "--seed", str(seed), *common],
                             compact_dir / compact_name(arm, lr, seed), report=True))
    return tasks


def demo_tasks(lrs: Sequence[float], demo_dir: Path) -> list[LabTask]:
    """The demo's selection runs (one per learning rate) and then the demo itself with the chosen settings."""
    py = [sys.executable, "-m", "searchr1_lab.demo"]
    select = [LabTask(f"demo-select-lr{lr_tag(lr)}", [*py, "--select-lr", repr(lr), "--select-dir",
                                                       str(demo_dir / "select")],
                      selection_file(demo_dir / "select", lr)) for lr in lrs]
    final = LabTask("demo", [*py, "--select-dir", str(demo_dir / "select"), "--report", str(demo_dir), "--readme",
                             str(REPO_ROOT / "README.md")],
                    demo_dir / "summary.json", after=tuple(t.name for t in select),
                    also_commit=(demo_dir / "README.md", REPO_ROOT / "README.md"))
    return [*select, final]


# the report commands a registration of the step-size form may name as its analysis (each takes --registration, --out
# and --readme)
REGISTERED_REPORTS = ("stepsize-report", "frontier-report", "spiral-report")


def registered_report(reg: dict) -> str:
    """The lab subcommand that writes a registered study's report: the one its ``analysis_command`` names (read as it
    runs today), ``stepsize-report`` when it names none; ConfigError for any other command."""
    command = reg["registration"].get("analysis_command")
    words = current_command(command).split() if command else ["python", "-m", "searchr1_lab", "stepsize-report"]
    if words[:3] != ["python", "-m", "searchr1_lab"] or len(words) < 4 or words[3] not in REGISTERED_REPORTS:
        raise ConfigError(f"the registration's analysis_command {command!r} is not one of the lab's registered "
                          f"reports ({', '.join(REGISTERED_REPORTS)})")
    return words[3]


def report_command(compact_dir: Path, prereg_path: Path = REPO_ROOT / PREREG_FILE,
                   readme: Path = REPO_ROOT / RESULTS_PAGE,
                   stepsize_path: Path = REPO_ROOT / stepsize.STEPSIZE_FILE) -> tuple[list[str], list[Path]]:
    """The command that rebuilds the report the compact results in ``compact_dir`` feed, and the paths it writes.
    The pre-registered comparison's runs dir feeds its registered analysis (``prereg-report``, into its
    ``report_dir``), a registered study's runs dir its own (:func:`registered_report`, into the whole of its
    ``report_dir``), any other the comparison's report in docs/lab (``report``); each replaces its block of
    ``readme``. The command is a fresh interpreter, so a grid that runs for hours writes its reports with the code on
    disk, not the code it started with."""
    reg = registration_of(compact_dir, prereg_path)
    study = stepsize.registration_of(compact_dir, stepsize_path)
    if study is not None:
        out = REPO_ROOT / study["registration"]["report_dir"]
        argv = [registered_report(study), "--registration", str(stepsize_path), "--out", str(out)]
        written = [out]
    elif reg is not None:
        out = REPO_ROOT / reg["report_dir"]
        argv = ["prereg-report", "--prereg", str(prereg_path), "--runs", str(compact_dir), "--out", str(out)]
        written = [out / "summary.json", out / "README.md", *(out / f"{stem}.png" for stem in PHENOMENA_FIGURES)]
    else:
        out = REPO_ROOT / "docs" / "lab"
        argv = ["report", "--runs", str(compact_dir), "--out", str(out)]
        written = [out / "summary.json", out / "README.md", out / CURVES_FILE]
    return ([sys.executable, "-m", "searchr1_lab", *argv, "--readme", str(readme)],
            [compact_dir / DESIGN_FILE, *written, readme])


def rebuild_report(compact_dir: Path, prereg_path: Path = REPO_ROOT / PREREG_FILE,
                   readme: Path = REPO_ROOT / RESULTS_PAGE,
                   stepsize_path: Path = REPO_ROOT / stepsize.STEPSIZE_FILE) -> list[Path]:
    """The report the compact results in ``compact_dir`` feed, rebuilt from them by :func:`report_command`; the
    paths it wrote."""
    argv, written = report_command(compact_dir, prereg_path, readme, stepsize_path)
    subprocess.run(argv, cwd=REPO_ROOT, check=True)
    return written


def finish(task: LabTask, commit_results: bool, compact_dir: Path | None, registration: Path | None = None) -> None:
    """After a task is done: the report its results feed rebuilt (``task.report``, :func:`rebuild_report`), then,
    with ``commit_results``, its files committed. A report that fails to build is named in the log and the result
    is committed without it: one broken report must not stop a grid of hours (the next result rebuilds it)."""
    paths = [task.done, *task.also_commit]
    if task.report and compact_dir is not None:
        try:
            paths += rebuild_report(compact_dir, **({"stepsize_path": registration} if registration else {}))
        except subprocess.CalledProcessError as e:
            print(f"[grid] the report of {compact_dir} failed (exit {e.returncode}); committing the result alone",
                  flush=True)
    if commit_results:
        commit(paths, f"lab: result of {task.name}", REPO_ROOT)


def task_method(args: argparse.Namespace, reg: dict | None) -> Method:
    """The arm one ``task`` runs: a registered arm (``--registration`` + ``--arm``), or a method preset
    (``--method``) with ``--set`` overrides under the name ``--arm`` (default: the method's)."""
    if reg is not None:
        if args.arm not in reg["arms"] or args.method or args.set:
            raise ConfigError(f"with --registration, task needs --arm (one of {list(reg['arms'])}) and no --method "
                              f"or --set: the registration fixes the arm's settings")
        return stepsize.arm_method(args.arm, reg["arms"][args.arm])
    if args.method not in ARMS:
        raise ConfigError(f"task needs --lr, --method (one of {list(ARMS)}) and --seed, or --baselines")
    bad = [item for item in args.set if "=" not in item]
    if bad or (args.set and not args.arm):
        raise ConfigError(f"--set takes KEY=VALUE items and needs --arm naming the arm it makes (got {args.set})")
    method = ARMS[args.method]
    return Method(args.arm or method.key, method.label, (*method.overrides, *args.set))


def parser(mode: str) -> argparse.ArgumentParser:
    """The command line of ``grid`` or ``task``."""
    p = argparse.ArgumentParser(prog=f"python -m searchr1_lab {mode}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--registration", help="a registration file (docs/lab/stepsize/registration.json): its config, "
                   "arms, learning rates, seeds and directories (grid: instead of --config, --lrs, --methods, --seeds, "
                   "--runs-dir and --compact)")
    p.add_argument("--config", help="the lab config every run shares (e.g. configs/lab/compare.yaml)")
    p.add_argument("--runs-dir", help="where the runs train (checkpoints: an interrupted run resumes)")
    p.add_argument("--compact", help="where the compact results go (default docs/lab/runs)")
    if mode == "grid":
        p.add_argument("--lrs", help="comma-separated learning rates")
        p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
        p.add_argument("--methods", default="grpo,llds_action", help="comma-separated method presets")
        p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
        p.add_argument("--threads", type=int, default=0, help="torch/BLAS threads of each worker (default: the "
                       "usable cores / --jobs, at least 1)")
        p.add_argument("--demo", action="store_true", help="also the demo's selection runs (at --demo-lrs) and the "
                       "demo with the settings chosen on validation (docs/demo), interleaved with the lab's tasks")
        p.add_argument("--demo-lrs", default="5e-4,1e-3,2e-3", help="--demo: the learning rates of its selection runs")
        p.add_argument("--commit", action="store_true", help="git-commit each compact result as it lands")
        fresh.add_argument(p)
        p.add_argument("--slurm", action="store_true", help="write the tasks as a Slurm job array into "
                       "RUNS_DIR/slurm instead of running them here, one task per array task, resumable; each "
                       "result rebuilds its report (searchr1_lab/slurm.py; --submit submits it)")
        slurm.add_arguments(p)
    else:
        p.add_argument("--baselines", action="store_true", help="the baselines instead of a run")
        p.add_argument("--lr", type=float, help="the run's learning rate")
        p.add_argument("--method", help="a method preset (algorithm.method)")
        p.add_argument("--arm", help="the arm's name: a registered arm (with --registration), or the name of --method "
                       "with the --set overrides")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="an override that makes --method the arm --arm (repeatable)")
        p.add_argument("--seed", type=int, help="the run's seed")
        p.add_argument("--world-dir", help="an existing world dir to use as is (default: the config's world)")
    return p


def slurm_grid(args: argparse.Namespace, tasks: Sequence[LabTask], config: str, runs_root: Path,
               compact_dir: Path) -> int:
    """``grid --slurm``: the tasks as a job array in RUNS_DIR/slurm (:func:`searchr1_lab.slurm.write_and_submit`);
    after each lab result, its array task rebuilds the report the result feeds (:func:`report_command`)."""
    settings = slurm.ArraySettings.from_args(args)
    settings.check_runs({config: config_from_dict(read_lab_config(config, [])[0]).retriever})
    where = {"stepsize_path": Path(args.registration).resolve()} if args.registration else {}
    then = {t.name: report_command(compact_dir, **where)[0] for t in tasks if t.report}
    return slurm.write_and_submit(tasks, runs_root / "slurm", f"grid-{runs_root.name}", settings, args.submit,
                                  cwd=REPO_ROOT, then=then)


def places(args: argparse.Namespace, reg: dict | None, mode: str) -> tuple[str, Path, Path]:
    """(config, where runs train, where compact results go): the registration's unless given."""
    if reg is not None:
        block = reg["registration"]
        return (args.config or block["config"], Path(args.runs_dir or REPO_ROOT / block["train_dir"]),
                Path(args.compact or REPO_ROOT / block["runs_dir"]))
    if not args.config or not args.runs_dir:
        raise ConfigError(f"{mode} needs --config and --runs-dir (or --registration)")
    return args.config, Path(args.runs_dir), Path(args.compact or "docs/lab/runs")


def main(argv: list[str]) -> int:
    """``grid`` (the driver) and ``task`` (one worker)."""
    mode = argv[0]
    args = parser(mode).parse_args(argv[1:])
    try:
        if mode == "grid":
            slurm.refuse_without_slurm(args)
            if args.slurm and (args.commit or args.fresh):
                raise ConfigError("--slurm with --commit or --fresh: the array's tasks run on other nodes; commit "
                                  "(and compare a fresh rerun) here once the array has finished")
        reg = stepsize.load_registration(args.registration) if args.registration else None
        config, runs_root, compact_dir = places(args, reg, mode)
        rerun = fresh.prepare(args, compact_dir) if mode == "grid" else None
        if rerun is not None:
            runs_root, compact_dir, reg = rerun.runs_root, rerun.compact_dir, rerun.redirect(reg)
        if mode == "task":
            if args.baselines:
                print(run_baselines(config, runs_root, compact_dir, args.world_dir))
                return 0
            method = task_method(args, reg)
            if args.lr is None or args.seed is None:
                raise ConfigError("task needs --lr and --seed (or --baselines)")
            print(run_task(config, args.lr, method, args.seed, runs_root, compact_dir, args.world_dir))
            return 0
        check_jobs(args.jobs, args.threads)
        if reg is not None:
            stepsize.check_registered(reg, args.registration)
            design = {"registration": repo_relative(Path(args.registration)), "config": config,
                      "arms": reg["arms"], "seeds": reg["seeds"]}
            write_design(compact_dir, design)
            tasks = registered_tasks(Path(args.registration), reg)
        else:
            if not args.lrs:
                raise ConfigError("grid needs --lrs (or --registration)")
            check_registered(compact_dir)
            design = {"config": config, "methods": [m.key for m in parse_methods(args.methods)],
                      "lrs": parse_lrs(args.lrs), "seeds": parse_seeds(args.seeds)}
            write_design(compact_dir, design)
            tasks = lab_tasks(config, design["lrs"], design["seeds"], design["methods"], runs_root, compact_dir)
        if args.demo:
            tasks = interleave(tasks, demo_tasks(parse_lrs(args.demo_lrs), REPO_ROOT / "docs" / "demo"))
        if args.slurm:
            return slurm_grid(args, tasks, config, runs_root, compact_dir)
        on_done = partial(finish, commit_results=args.commit, compact_dir=None if rerun else compact_dir,
                          registration=Path(args.registration).resolve() if args.registration else None)
        failed = run_tasks(tasks, args.jobs, runs_root / "logs", on_done=on_done, threads=args.threads,
                           cwd=REPO_ROOT, label="grid")
        if rerun is not None:
            failed += rerun.finish(failed)
    except ConfigError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2
    print(f"[grid] finished; failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0
