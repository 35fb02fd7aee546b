"""The driver's tasks (:mod:`.driver`) as a Slurm job array: one array task per task, resumable from the shared
filesystem. ``sweep expand --slurm`` and ``grid --slurm`` write it (and with ``--submit`` submit it):

    python -m searchr1_lab.sweep expand --base configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds.yaml \\
        --grid "algorithm.llds.lam=0.1,0.2" --slurm --submit --sbatch="--partition=gpu --gres=gpu:8 --time=2-00:00:00"
    python -m searchr1_lab grid --registration docs/lab/stepsize/registration.json --slurm --submit
    python -m searchr1_lab.slurm task DIR/tasks.json INDEX     # what array task INDEX runs

Files, in the array's directory DIR (``OUT/slurm`` of a sweep, ``RUNS_DIR/slurm`` of a grid; it must be on a
filesystem every node mounts, as the runs are): ``tasks.json`` (each task's command line, its done file, the tasks it
waits for, the command run after it is done), ``array.sbatch`` (the job script: ``#SBATCH --array=0-N``, the
``--sbatch`` options, logs in ``DIR/logs/<index>.log``, appended across resubmissions) and ``submitted.txt`` (one line
per submission: the job id and the indices).

Resuming: an array task whose done file exists exits at once; an interrupted one (cancelled, timed out, a node lost)
resumes from its run's last checkpoint when it runs again (the trainer's own resume). Running the same ``--slurm
--submit`` command again submits only the tasks that are not done; ``sbatch DIR/array.sbatch`` resubmits every index
(the finished ones exit at once). A task that waits for others (the demo's final run waits for its selection runs) is
submitted with ``--dependency=afterok`` on their array tasks.

The retriever: the runs' own setting (in-process, or ``retriever.url``) by default; ``--retriever-url URL`` points
every task at one running service (``$SEARCHR1_RETRIEVER_URL``); ``--retriever-index DIR`` starts ``python -m
retriever serve --index DIR`` in each array task, on a free port of its node, and points the task at it. Both need
runs whose ``retriever.mode`` is ``http``.

Threads: each task runs with ``$SLURM_CPUS_PER_TASK`` torch/BLAS threads (else the cores it may use).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from filelock import FileLock

from retriever import RetrieverSettings, retriever_mode
from retriever.runtime import usable_cores
from searchr1_lab.driver import Task, worker_env
from searchr1_lld.bookkeeping.files import write_json_atomic
from searchr1_lld.config import ConfigError
from searchr1_lld.distributed import free_ports

TASKS_FILE = "tasks.json"
SCRIPT_FILE = "array.sbatch"
SUBMITTED_FILE = "submitted.txt"
RETRIEVER_START_S = 900.0  # how long a task waits for its own retriever service to accept connections


@dataclass(frozen=True)
class ArraySettings:
    """How the array runs: ``sbatch``: extra sbatch options (``--partition=gpu --gres=gpu:8 ...``), written into the
    script as ``#SBATCH`` lines; ``retriever_url`` / ``retriever_index``: one service for all tasks / one started
    per task on that index (at most one of the two)."""

    sbatch: tuple[str, ...] = ()
    retriever_url: str | None = None
    retriever_index: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ArraySettings":
        if args.retriever_url and args.retriever_index:
            raise ConfigError("--retriever-url and --retriever-index: one or the other (a running service, or one "
                              "started per task)")
        if args.retriever_url and not args.retriever_url.startswith(("http://", "https://")):
            raise ConfigError(f"--retriever-url {args.retriever_url!r} must start with http:// or https://")
        return cls(tuple(shlex.split(args.sbatch or "")), args.retriever_url,
                   str(Path(args.retriever_index).resolve()) if args.retriever_index else None)

    def check_runs(self, retrievers: dict[str, RetrieverSettings]) -> None:
        """ConfigError when a retriever is given and a run (name -> its ``retriever`` settings) would not ask it (its
        mode asks no service)."""
        if not (self.retriever_url or self.retriever_index):
            return
        other = sorted(name for name, cfg in retrievers.items() if not retriever_mode(cfg).asks_service)
        if other:
            raise ConfigError(f"--retriever-url / --retriever-index serve runs with retriever.mode=http; "
                              f"{', '.join(other)} use{'s' if len(other) == 1 else ''} retriever.mode="
                              f"{retrievers[other[0]].mode} (set retriever.mode=http)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a command that writes an array (besides its ``--slurm``)."""
    p.add_argument("--submit", action="store_true", help="--slurm: also submit the array (sbatch), the tasks not done")
    p.add_argument("--sbatch", metavar="OPTIONS", help='--slurm: sbatch options for every task, written with = '
                   '(they start with --), e.g. --sbatch="--partition=gpu --gres=gpu:8 --time=2-00:00:00"')
    p.add_argument("--retriever-url", metavar="URL", help="--slurm: every task asks the service at URL "
                   "($SEARCHR1_RETRIEVER_URL; the runs need retriever.mode=http)")
    p.add_argument("--retriever-index", metavar="DIR", help="--slurm: each task starts `python -m retriever serve "
                   "--index DIR` on its node and asks it (the runs need retriever.mode=http)")


def refuse_without_slurm(args: argparse.Namespace) -> None:
    """ConfigError when an option of :func:`add_arguments` is given without ``--slurm``."""
    given = [f"--{name.replace('_', '-')}" for name in ("submit", "sbatch", "retriever_url", "retriever_index")
             if getattr(args, name)]
    if given and not args.slurm:
        raise ConfigError(f"{', '.join(given)}: options of --slurm; add --slurm")


def index_ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (sbatch's ``--array`` syntax)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def write_array(tasks: Sequence[Task], directory: Path, name: str, settings: ArraySettings, *, cwd: Path,
                then: dict[str, list[str]] | None = None, env: dict[str, str] | None = None) -> Path:
    """``directory/tasks.json`` and ``directory/array.sbatch`` for ``tasks`` (array index = position); ``then``: task
    name -> the command to run after that task is done (e.g. a report rebuilt); ``env``: variables every task gets.
    Returns the script."""
    directory = directory.resolve()
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(env or {})
    if settings.retriever_url:
        env["SEARCHR1_RETRIEVER_URL"] = settings.retriever_url
    record = {"name": name, "cwd": str(cwd), "env": env, "retriever_index": settings.retriever_index,
              "tasks": [{"name": t.name, "argv": list(t.argv), "done": str(Path(t.done).resolve()),
                         "after": list(t.after), "then": (then or {}).get(t.name)} for t in tasks]}
    write_json_atomic(directory / TASKS_FILE, record)  # an array task starting now reads the old file or this one
    lines = ["#!/bin/bash",
             f"# A Slurm job array of {len(tasks)} task(s) (searchr1_lab/slurm.py): array index i runs task i of",
             f"# {directory / TASKS_FILE}; a task whose done file exists exits at once, an interrupted run resumes",
             "# from its last checkpoint. Resubmit every index with `sbatch` on this file.",
             f"#SBATCH --job-name={name}",
             f"#SBATCH --array={index_ranges(range(len(tasks)))}",
             f"#SBATCH --output={directory / 'logs'}/%a.log",
             "#SBATCH --open-mode=append",
             *(f"#SBATCH {option}" for option in settings.sbatch),
             "set -euo pipefail",
             f"cd {shlex.quote(str(cwd))}",
             f"exec {shlex.quote(sys.executable)} -m searchr1_lab.slurm task {shlex.quote(str(directory / TASKS_FILE))}"
             ' "$SLURM_ARRAY_TASK_ID"', ""]
    script = directory / SCRIPT_FILE
    script.write_text("\n".join(lines))
    script.chmod(0o755)
    return script


def read_tasks(path: Path) -> dict:
    """A ``tasks.json`` written by :func:`write_array`."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such tasks file (written by --slurm)") from None


def sbatch(script: Path, array: str, dependency: str | None = None) -> str:
    """Submit ``script`` for the array indices ``array``; the job id."""
    cmd = ["sbatch", "--parsable", f"--array={array}", *([f"--dependency={dependency}"] if dependency else []),
           str(script)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise ConfigError("--submit: sbatch is not on PATH (is this a Slurm login node?)") from None
    if out.returncode:
        raise ConfigError(f"sbatch refused the array: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def submit(script: Path) -> list[tuple[str, list[int]]]:
    """Submit the tasks of ``script``'s array that are not done: those that wait for no pending task as one array
    job, each other one after the array tasks it waits for (``--dependency=afterok``). Returns (job id, indices) per
    submission, also appended to ``submitted.txt``."""
    record = read_tasks(script.parent / TASKS_FILE)
    tasks = record["tasks"]
    index_of = {t["name"]: i for i, t in enumerate(tasks)}
    pending = [i for i, t in enumerate(tasks) if not Path(t["done"]).exists()]
    waits = {i: [index_of[d] for d in tasks[i]["after"] if d in index_of and index_of[d] in pending] for i in pending}
    submissions: list[tuple[str, list[int]]] = []
    job_of: dict[int, str] = {}
    free = [i for i in pending if not waits[i]]
    if free:
        job = sbatch(script, index_ranges(free))
        submissions.append((job, free))
        job_of.update({i: f"{job}_{i}" for i in free})
    rest = [i for i in pending if waits[i]]
    while rest:
        ready = [i for i in rest if all(d in job_of for d in waits[i])]
        if not ready:
            raise ConfigError(f"tasks wait for each other: {[tasks[i]['name'] for i in rest]}")
        for i in ready:
            job = sbatch(script, str(i), "afterok:" + ":".join(job_of[d] for d in waits[i]))
            submissions.append((job, [i]))
            job_of[i] = f"{job}_{i}"
            rest.remove(i)
    with open(script.parent / SUBMITTED_FILE, "a") as log:
        for job, indices in submissions:
            log.write(f"{job}\t{index_ranges(indices)}\n")
    return submissions


def write_and_submit(tasks: Sequence[Task], directory: Path, name: str, settings: ArraySettings, submit_now: bool,
                     *, cwd: Path, then: dict[str, list[str]] | None = None,
                     env: dict[str, str] | None = None) -> int:
    """:func:`write_array`, then with ``submit_now`` :func:`submit`; prints what it wrote and submitted. Exit status."""
    script = write_array(tasks, directory, name, settings, cwd=cwd, then=then, env=env)
    done = sum(Path(t.done).exists() for t in tasks)
    print(f"[slurm] {script}: {len(tasks)} task(s), {done} done earlier; logs in {script.parent / 'logs'}")
    if not submit_now:
        print(f"[slurm] submit with the same command and --submit, or: sbatch {script}")
        return 0
    submissions = submit(script)
    for job, indices in submissions:
        print(f"[slurm] submitted job {job}: array tasks {index_ranges(indices)}")
    if not submissions:
        print("[slurm] every task is done: nothing submitted")
    return 0


# --------------------------------------------------------------------------------------------------------------------
# One array task
# --------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def task_retriever(index_dir: str | None, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """With ``index_dir``: ``python -m retriever serve`` on it, on a free port of this node, until the block ends;
    yields the variables that point a task at it (``$SEARCHR1_RETRIEVER_URL``). Without: yields nothing."""
    if not index_dir:
        yield {}
        return
    (port,) = free_ports(1)
    service = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", index_dir, "--host",
                                "127.0.0.1", "--port", str(port)], env=env)
    print(f"[slurm] retriever: serving {index_dir} on port {port} (pid {service.pid})", flush=True)
    try:
        deadline = time.monotonic() + RETRIEVER_START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if service.poll() is not None:
                raise RuntimeError(f"the retriever service on {index_dir} exited with {service.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the retriever service on {index_dir} did not listen within {RETRIEVER_START_S} s")
            time.sleep(1.0)
        yield {"SEARCHR1_RETRIEVER_URL": f"http://127.0.0.1:{port}"}
    finally:
        service.terminate()
        try:
            service.wait(60)
        except subprocess.TimeoutExpired:
            service.kill()


def run_task(tasks_file: Path, index: int) -> int:
    """Array task ``index`` of ``tasks_file``: nothing when its done file exists; exit 1 when a task it waits for is
    not done; else its command (its retriever
    started first when the array starts one per task), then, once its done file exists, its ``then`` command (one
    array task at a time: a lock beside the tasks file). Exit status: the command's; 1 when it exited 0 without its
    done file. A ``then`` command that fails is reported and does not fail the task."""
    record = read_tasks(tasks_file)
    if not 0 <= index < len(record["tasks"]):
        raise ConfigError(f"{tasks_file} has {len(record['tasks'])} tasks, no index {index}")
    task = record["tasks"][index]
    done = Path(task["done"])
    if done.exists():
        print(f"[slurm] task {index} ({task['name']}): done earlier ({done})", flush=True)
        return 0
    done_of = {t["name"]: Path(t["done"]) for t in record["tasks"]}
    waiting = [name for name in task["after"] if name in done_of and not done_of[name].exists()]
    if waiting:  # submitted without its dependency (`sbatch` on the whole array)
        print(f"[slurm] task {index} ({task['name']}) waits for {', '.join(waiting)}, not done yet: submit it with "
              f"the command that wrote this array (it waits for them)", flush=True)
        return 1
    threads = int(os.environ.get("SLURM_CPUS_PER_TASK") or 0) or usable_cores()
    env = {**worker_env(threads), **record["env"]}
    print(f"[slurm] task {index} ({task['name']}) on {socket.gethostname()}, {threads} thread(s): "
          f"{shlex.join(task['argv'])}", flush=True)
    with task_retriever(record.get("retriever_index"), env) as retriever_env:
        code = subprocess.run(task["argv"], cwd=record["cwd"], env={**env, **retriever_env}).returncode
    if code == 0 and not done.exists():
        print(f"[slurm] task {index} ({task['name']}) exited 0 without writing {done}", flush=True)
        code = 1
    if code == 0 and task.get("then"):
        with FileLock(str(Path(tasks_file).with_name("then.lock"))):
            then = subprocess.run(task["then"], cwd=record["cwd"], env=env).returncode
        if then:
            print(f"[slurm] task {index}: its follow-up failed (exit {then}): {shlex.join(task['then'])}", flush=True)
    print(f"[slurm] task {index} ({task['name']}): {'done' if code == 0 else f'FAILED ({code})'}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lab.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("task", help="run one array task (what array.sbatch runs)")
    t.add_argument("tasks_file", help="the array's tasks.json")
    t.add_argument("index", type=int, help="the array index ($SLURM_ARRAY_TASK_ID)")
    args = p.parse_args(argv)
    try:
        return run_task(Path(args.tasks_file), args.index)
    except ConfigError as err:
        print(f"slurm: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
