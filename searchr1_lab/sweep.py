"""Experiment sweeps: expand a grid of config overrides into runs, launch them, collect the finished runs.

    # list (and validate) the runs of a grid
    python -m searchr1_lab.sweep expand --base configs/tiny.yaml --grid "algorithm.llds.lam=0,0.1 algorithm.llds.gate=none,action"
    # train them on this machine, one worker process per run, --jobs at a time, then collect
    python -m searchr1_lab.sweep expand --base configs/tiny.yaml --grid "..." --local --jobs 2 --out runs/sweep-lam
    # one `accelerate launch` command per run, for a cluster scheduler
    python -m searchr1_lab.sweep expand --base configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds.yaml --grid "..." --print-launch
    # a Slurm job array, one run per array task, resumable (searchr1_lab/slurm.py); --submit submits the runs not done
    python -m searchr1_lab.sweep expand --base configs/tiny.yaml --grid "..." --slurm --submit --sbatch="--time=1:00:00"
    # one table + one figure over finished runs: final EM and collapse step per setting
    python -m searchr1_lab.sweep collect runs/tiny-lam=0 runs/tiny-lam=0.1 --out runs/sweep-lam

Grid syntax: space-separated ``key=v1,v2,...`` items; the runs are the Cartesian product, in the order given (the last
key varies fastest). Each run is named ``<config name>-<leaf>=<value>_...`` (leaf = last part of the dotted key).

``--local`` runs through the lab's driver (:mod:`searchr1_lab.driver`): each run is a worker, ``python -m
searchr1_lab.sweep task``, that trains it (searchr1_lld.learner.trainer.train) with ``--threads`` torch/BLAS threads
(default: the usable cores shared out over the ``--jobs``) and writes its ``sweep_run.json`` when it has finished; its
output goes to ``OUT/logs/<run>.log``. A rerun of the same command skips the finished runs and resumes an interrupted
one from its checkpoint (the trainer's own resume). A failed run is named, the others still run, and the command
exits 1 after collecting those that finished.

``--slurm`` writes the same runs as a Slurm job array into ``OUT/slurm`` (:mod:`searchr1_lab.slurm`): array task i
runs ``sweep task`` for run i (one run per task, on the node's cores); a run whose marker exists is skipped, an
interrupted one resumes from its checkpoint; ``--retriever-url`` / ``--retriever-index`` give the runs a service (one
for all, or one started per task). Once the array has finished, ``collect`` (printed) makes the table.

Collapse step of a run: the first logged step whose monitor phase (``phase/name`` in metrics.jsonl) is
``accelerated_collapse``; "none" when it never is. Final EM: ``average_em`` of the run's final evaluation
(``results.json`` from eval.py in the run dir or below it), else ``em_after`` of the trainer's own ``eval.json``; the
last training reward ``reward/em_mean`` is reported beside it.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from searchr1_lab import slurm
from searchr1_lab.driver import Task, check_jobs, run_tasks
from searchr1_lab.methods import REPO_ROOT
from searchr1_lld.bookkeeping.resume import run_dir_of
from searchr1_lld.config import ConfigError, load_config
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.learner.trainer import train

COLLAPSE_PHASE = "accelerated_collapse"
DEFAULT_ACCELERATE_CONFIG = "configs/accelerate/zero2_8gpu.yaml"
# written into a run dir when the run has finished: the driver's done file, and the run's name and overrides for collect
SWEEP_MARKER = "sweep_run.json"
LOCAL_POLL_S = 2.0  # how often --local looks at its workers


@dataclass
class RunSpec:
    """One run of a sweep: the overrides that distinguish it and the name derived from them."""

    name: str
    overrides: list[str]


# --------------------------------------------------------------------------------------------------------------------
# Expansion (pure)
# --------------------------------------------------------------------------------------------------------------------


def parse_grid(text: str) -> list[tuple[str, list[str]]]:
    """``"a.b=0,0.1 c=x,y"`` -> ``[("a.b", ["0", "0.1"]), ("c", ["x", "y"])]`` (values stay strings; the config
    loader parses them as YAML)."""
    axes: list[tuple[str, list[str]]] = []
    for item in text.split():
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"grid item {item!r} must look like key.sub=v1,v2")
        vals = [v for v in values.split(",")]
        if any(v == "" for v in vals):
            raise ConfigError(f"grid item {item!r} has an empty value")
        if len(set(vals)) != len(vals):
            raise ConfigError(f"grid item {item!r} repeats a value")
        if key in (k for k, _ in axes):
            raise ConfigError(f"grid key {key!r} given twice")
        axes.append((key, vals))
    if not axes:
        raise ConfigError("empty grid")
    return axes


def _yaml_safe(value: str) -> str:
    """Quote words that YAML would read as booleans (``off``, ``on``, ``no``, ``yes``) but that are meant as strings,
    e.g. ``algorithm.llds.ma=off``; ``true``/``false`` stay booleans."""
    parsed = yaml.safe_load(value)
    if isinstance(parsed, bool) and value.lower() not in ("true", "false"):
        return f"'{value}'"
    return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "-", text)


def expand_grid(axes: Sequence[tuple[str, Sequence[str]]], base_name: str = "run") -> list[RunSpec]:
    """Cartesian product of the axes -> one :class:`RunSpec` per combination (last axis varies fastest)."""
    leaves = [k.split(".")[-1] for k, _ in axes]
    if len(set(leaves)) != len(leaves):  # two keys with the same leaf: use the full key in names
        leaves = [k for k, _ in axes]
    runs = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        overrides = [f"{k}={_yaml_safe(v)}" for (k, _), v in zip(axes, combo)]
        suffix = "_".join(f"{leaf}={v}" for leaf, v in zip(leaves, combo))
        runs.append(RunSpec(name=_slug(f"{base_name}-{suffix}"), overrides=overrides))
    return runs


def plan(base_config: str | Path, grid: str, extra_overrides: Sequence[str] = ()) -> list[RunSpec]:
    """Expand ``grid`` over ``base_config`` and validate every run's full config (fails before anything launches)."""
    base_cfg = load_config(base_config, list(extra_overrides))
    runs = expand_grid(parse_grid(grid), base_name=base_cfg.name)
    for run in runs:
        try:
            load_config(base_config, [*extra_overrides, *run.overrides])
        except ConfigError as e:
            raise ConfigError(f"run {run.name}: {e}") from e
    return runs


def launch_command(base_config: str | Path, run: RunSpec, *, accelerate_config: str = DEFAULT_ACCELERATE_CONFIG,
                   extra_overrides: Sequence[str] = ()) -> str:
    """The shell command that trains ``run`` on a cluster node (accelerate + DeepSpeed config)."""
    args = ["accelerate", "launch", "--config_file", accelerate_config, "train.py", "--config", str(base_config),
            *run_config_overrides(run, extra_overrides)]
    return " ".join(shlex.quote(a) for a in args)


def run_config_overrides(run: RunSpec, extra_overrides: Sequence[str] = ()) -> list[str]:
    """Every override of ``run``'s config: the shared ones, the run's own, its name as the run name."""
    return [*extra_overrides, *run.overrides, f"trainer.run_name={run.name}"]


def sweep_tasks(base_config: str | Path, grid: str, runs: Sequence[RunSpec],
                extra_overrides: Sequence[str] = ()) -> list[Task]:
    """One driver task per run: ``python -m searchr1_lab.sweep task`` (:func:`train_run`), done when the run's
    :data:`SWEEP_MARKER` exists."""
    tasks = []
    for run in runs:
        run_dir = run_dir_of(load_config(base_config, run_config_overrides(run, extra_overrides)))
        argv = [sys.executable, "-m", "searchr1_lab.sweep", "task", "--base", str(base_config), "--grid", grid,
                "--run", run.name, "--set", *extra_overrides]
        tasks.append(Task(run.name, argv, run_dir / SWEEP_MARKER))
    return tasks


def train_run(base_config: str | Path, grid: str, name: str, extra_overrides: Sequence[str] = ()) -> Path:
    """Train (or resume, as :func:`searchr1_lld.learner.trainer.train` does) the run ``name`` of the grid, then
    write its :data:`SWEEP_MARKER`, last: the marker says the run finished. Returns the marker."""
    runs = {run.name: run for run in plan(base_config, grid, extra_overrides)}
    if name not in runs:
        raise ConfigError(f"the grid has no run {name!r} (its runs: {', '.join(runs)})")
    run = runs[name]
    result = train(load_config(base_config, run_config_overrides(run, extra_overrides)))
    marker = Path(result.run_dir) / SWEEP_MARKER
    marker.write_text(json.dumps({"name": run.name, "overrides": run.overrides}) + "\n")
    return marker


def workers_code_path() -> str:
    """The PYTHONPATH of a sweep's workers: this checkout first, so that they import its searchr1_lab whichever
    directory the sweep runs in."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)


def run_local(base_config: str | Path, grid: str, runs: Sequence[RunSpec], out: Path,
              extra_overrides: Sequence[str] = (), jobs: int = 1, threads: int = 0) -> tuple[list[Path], list[str]]:
    """Train the runs on this machine through the driver (:func:`searchr1_lab.driver.run_tasks`), one worker process
    per run, ``jobs`` at a time, each run's log in ``out/logs``; a run finished earlier (its marker exists) is
    skipped. Returns the run dirs of the finished runs, in the grid's order, and the names of the failed ones."""
    tasks = sweep_tasks(base_config, grid, runs, extra_overrides)
    failed = run_tasks(tasks, jobs, out / "logs", poll_s=LOCAL_POLL_S, threads=threads,
                       extra_env={"PYTHONPATH": workers_code_path()}, label="sweep")
    return [t.done.parent for t in tasks if t.done.exists()], failed


# --------------------------------------------------------------------------------------------------------------------
# Collection
# --------------------------------------------------------------------------------------------------------------------


def collapse_step(metrics: Sequence[dict[str, Any]]) -> int | None:
    """First ``step`` whose ``phase/name`` is accelerated_collapse, or None."""
    for row in metrics:
        if row.get("phase/name") == COLLAPSE_PHASE:
            return int(row["step"])
    return None


def _find_results(run_dir: Path) -> Path | None:
    """The run's final evaluation results.json: run_dir/results.json, else the newest one below run_dir."""
    direct = run_dir / "results.json"
    if direct.is_file():
        return direct
    found = sorted(run_dir.rglob("results.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _run_setting(run_dir: Path) -> dict[str, Any]:
    """The LLDS settings of a run, from the config it saved (config.yaml / config.json) when present."""
    for name in ("config.yaml", "config.json"):
        p = run_dir / name
        if p.is_file():
            raw = yaml.safe_load(p.read_text()) or {}
            llds = (raw.get("algorithm") or {}).get("llds") or {}
            return {k: llds.get(k) for k in ("enabled", "lam", "gate", "ma")}
    return {}


def collect_run(run_dir: str | Path) -> dict[str, Any]:
    """Summary of one finished (or partial) run: setting, final EM, collapse step, last train reward."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ConfigError(f"{run_dir}: no metrics.jsonl (is this a run dir?)")
    metrics = read_jsonl(metrics_path, partial_tail=True)  # a run may still be writing it
    sweep_meta = run_dir / SWEEP_MARKER
    meta = json.loads(sweep_meta.read_text()) if sweep_meta.is_file() else {}
    results_path = _find_results(run_dir)
    final_em = json.loads(results_path.read_text())["average_em"] if results_path else None
    trainer_eval = run_dir / "eval.json"  # the trainer's own end-of-run greedy EM on the test split
    if final_em is None and trainer_eval.is_file():
        final_em = json.loads(trainer_eval.read_text()).get("em_after")
    train_em = [r["reward/em_mean"] for r in metrics if isinstance(r.get("reward/em_mean"), (int, float))]
    step = collapse_step(metrics)
    return {
        "run": meta.get("name") or run_dir.name,
        "run_dir": str(run_dir),
        "overrides": meta.get("overrides", []),
        **_run_setting(run_dir),
        "steps": int(metrics[-1]["step"]) if metrics else 0,
        "final_em": final_em,
        "final_train_em": train_em[-1] if train_em else None,
        "peak_train_em": max(train_em) if train_em else None,
        "collapse_step": step if step is not None else "none",
        "train_em_curve": [(int(r["step"]), r["reward/em_mean"]) for r in metrics
                           if isinstance(r.get("reward/em_mean"), (int, float))],
    }


TABLE_COLUMNS = ["run", "lam", "gate", "ma", "steps", "final_em", "final_train_em", "peak_train_em", "collapse_step"]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join(["---"] * len(TABLE_COLUMNS)) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in TABLE_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def sweep_figure(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Left: final EM per setting (eval EM; hatched = last train EM when no eval exists), collapse step annotated.
    Right: training reward curves with a cross at each run's collapse step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bar, ax_curve) = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(rows) + 6), 4.2))
    names = [r["run"] for r in rows]
    for i, r in enumerate(rows):
        em = r["final_em"] if r["final_em"] is not None else (r["final_train_em"] or 0.0)
        ax_bar.bar(i, em, color="#4c72b0" if r["final_em"] is not None else "#cccccc",
                   hatch=None if r["final_em"] is not None else "//", edgecolor="black")
        ax_bar.text(i, em, f"{em:.2f}\ncollapse: {r['collapse_step']}", ha="center", va="bottom", fontsize=7)
    ax_bar.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=7)
    ax_bar.set_ylabel("final EM")
    ax_bar.set_title("final EM per setting (grey = train EM, no eval)")
    ax_bar.set_ylim(0, max([0.1] + [(r["final_em"] or r["final_train_em"] or 0) * 1.3 for r in rows]))
    for r in rows:
        if r["train_em_curve"]:
            steps, ems = zip(*r["train_em_curve"])
            (line,) = ax_curve.plot(steps, ems, label=r["run"], lw=1.2, marker="o", ms=3)  # a 1-step run: a point
            if r["collapse_step"] != "none":
                k = list(steps).index(r["collapse_step"]) if r["collapse_step"] in steps else None
                if k is not None:
                    ax_curve.plot(steps[k], ems[k], "x", color=line.get_color(), ms=9, mew=2)
    ax_curve.set_xlabel("step")
    ax_curve.set_ylabel("train reward (EM)")
    ax_curve.set_title("training reward; x = accelerated collapse")
    if any(r["train_em_curve"] for r in rows):
        ax_curve.legend(fontsize=6)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def collect(run_dirs: Sequence[str | Path], out_dir: str | Path) -> list[dict[str, Any]]:
    """Summaries of ``run_dirs`` -> out_dir/sweep.md, sweep.csv, sweep.json, sweep.png. Returns the rows."""
    if not run_dirs:
        raise ConfigError("collect: no run dirs given")
    rows = [collect_run(d) for d in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.md").write_text(sweep_table(rows))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS + ["run_dir"], extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (out_dir / "sweep.csv").write_text(buf.getvalue())
    (out_dir / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    sweep_figure(rows, out_dir / "sweep.png")
    return rows


# --------------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The command line: ``expand``, ``task`` (one worker of ``expand --local``) and ``collect``."""
    p = argparse.ArgumentParser(prog="python -m searchr1_lab.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("expand", help="expand a grid into runs (list, run locally, or print launch commands)")
    t = sub.add_parser("task", help="train one run of a grid, then write its sweep_run.json (a worker of --local)")
    for cmd in (e, t):
        cmd.add_argument("--base", required=True, help="base YAML config")
        cmd.add_argument("--grid", required=True,
                         help='e.g. "algorithm.llds.lam=0,0.1 algorithm.llds.gate=none,action"')
        cmd.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides applied to every run")
    t.add_argument("--run", required=True, help="the run's name, as expand lists it")
    mode = e.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="train the runs here, one worker process per run, "
                      "--jobs at a time, then collect; a rerun skips the runs that finished")
    mode.add_argument("--print-launch", action="store_true", help="print one accelerate launch command per run")
    mode.add_argument("--slurm", action="store_true", help="write a Slurm job array of the runs into OUT/slurm, one "
                      "run per array task, resumable (searchr1_lab/slurm.py; --submit submits it)")
    slurm.add_arguments(e)
    e.add_argument("--jobs", type=int, default=1, help="--local: worker processes at a time")
    e.add_argument("--threads", type=int, default=0, help="--local: torch/BLAS threads of each worker (default: "
                   "the usable cores / --jobs, at least 1)")
    e.add_argument("--accelerate-config", default=DEFAULT_ACCELERATE_CONFIG,
                   help="--print-launch: the accelerate config of each launch command")
    e.add_argument("--out", help="--local: where the collected table and figure go, and the runs' logs (OUT/logs); "
                   "--slurm: where the array's files go (OUT/slurm) (default: OUTPUT_DIR/sweep-NAME)")
    c = sub.add_parser("collect", help="table + figure over finished run dirs")
    c.add_argument("run_dirs", nargs="+", help="the run directories to summarise")
    c.add_argument("--out", required=True, help="where sweep.md, sweep.csv, sweep.json and sweep.png go")
    return p


def sweep_out(args: argparse.Namespace) -> Path:
    """``--out``, default ``OUTPUT_DIR/sweep-NAME`` of the base config."""
    base_cfg = load_config(args.base, args.set)
    return Path(args.out or Path(base_cfg.trainer.output_dir) / f"sweep-{base_cfg.name}")


def slurm_sweep(args: argparse.Namespace, runs: Sequence[RunSpec]) -> int:
    """``expand --slurm``: the runs' tasks as a job array in OUT/slurm (:func:`searchr1_lab.slurm.write_and_submit`),
    then the command that collects them once they have finished."""
    settings = slurm.ArraySettings.from_args(args)
    settings.check_runs({run.name: load_config(args.base, run_config_overrides(run, args.set)).retriever
                         for run in runs})
    out = sweep_out(args)
    tasks = sweep_tasks(args.base, args.grid, runs, args.set)
    code = slurm.write_and_submit(tasks, out / "slurm", out.name, settings, args.submit, cwd=Path.cwd(),
                                  env={"PYTHONPATH": workers_code_path()})
    print("[slurm] once the array has finished: python -m searchr1_lab.sweep collect "
          f"{' '.join(shlex.quote(str(t.done.parent)) for t in tasks)} --out {shlex.quote(str(out))}")
    return code


def local_sweep(args: argparse.Namespace, runs: Sequence[RunSpec]) -> int:
    """``expand --local``: the runs through the driver, then the table and figure of those that finished; 1 when
    any failed (each named), else 0."""
    check_jobs(args.jobs, args.threads)
    out = sweep_out(args)
    run_dirs, failed = run_local(args.base, args.grid, runs, out, args.set, jobs=args.jobs, threads=args.threads)
    if run_dirs:
        print(sweep_table(collect(run_dirs, out)))
        print(f"[sweep] table and figure in {out}")
    if failed:
        print(f"[sweep] failed: {', '.join(failed)} (their logs: {out / 'logs'})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "collect":
            print(sweep_table(collect(args.run_dirs, args.out)))
            return 0
        if args.cmd == "task":
            print(train_run(args.base, args.grid, args.run, args.set))
            return 0
        if not args.local and (args.jobs != 1 or args.threads != 0):
            raise ConfigError("--jobs and --threads set how --local trains the runs: add --local")
        slurm.refuse_without_slurm(args)
        runs = plan(args.base, args.grid, args.set)
        if args.print_launch:
            for run in runs:
                print(launch_command(args.base, run, accelerate_config=args.accelerate_config, extra_overrides=args.set))
            return 0
        if args.local:
            return local_sweep(args, runs)
        if args.slurm:
            return slurm_sweep(args, runs)
        for run in runs:
            print(f"{run.name}\t{' '.join(run.overrides)}")
        return 0
    except ConfigError as err:
        print(f"sweep: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
