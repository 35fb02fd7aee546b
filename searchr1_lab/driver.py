"""A resumable driver of worker processes: each :class:`Task` is a command line, done when its ``done`` file exists,
so a rerun of the same tasks skips the finished ones (and each unfinished one resumes as its own command does).

:func:`run_tasks` starts the tasks not yet done, ``jobs`` at a time, each after the tasks it waits for, each with
:func:`threads_per_job` torch/BLAS threads (:func:`worker_env`), its output in ``log_dir/<name>.log``; a failed task
is named and the others go on. What happens once a task is done (a report rebuilt, its files committed with
:func:`commit`) is the caller's, a callback. The lab's grid (:mod:`.grid`) and the sweeps' ``--local``
(:mod:`.sweep`) both run through it.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from retriever.runtime import THREAD_ENV_VARS, usable_cores
from searchr1_lld.config import ConfigError


@dataclass
class Task:
    """One worker process: ``argv``, done when ``done`` exists; starts after the tasks named in ``after``."""

    name: str
    argv: list[str]
    done: Path
    after: tuple[str, ...] = ()


def interleave(first: Sequence[Task], second: Sequence[Task]) -> list[Task]:
    """``first[0], second[0], first[1], second[1], ...`` then the rest of the longer one: two kinds of work share the
    job slots from the start."""
    out: list[Task] = []
    for i in range(max(len(first), len(second))):
        out += [*first[i:i + 1], *second[i:i + 1]]
    return out


def commit(paths: Sequence[Path], message: str, repo: Path) -> None:
    """``git commit`` of ``paths`` alone in the repository at ``repo`` (retried while another git command holds the
    index; a path git ignores is refused at once, with git's words, since no retry can commit it). Paths that an
    earlier commit already holds as they are (two tasks that end together: the first one's report directory took
    both results) are said so and left, not retried."""
    names = sorted({str(p) for p in paths if Path(p).exists()})
    for attempt in range(5):
        proc = subprocess.run(["git", "add", "--", *names], cwd=repo, capture_output=True, text=True)
        if proc.returncode == 0:
            if subprocess.run(["git", "diff", "--cached", "--quiet", "--", *names], cwd=repo).returncode == 0:
                print(f"[commit] nothing new to commit for {message!r}: an earlier commit holds its files as they are",
                      flush=True)
                return
            proc = subprocess.run(["git", "commit", "-q", "-m", message, "--", *names], cwd=repo,
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                return
        if "ignored by one of your .gitignore files" in proc.stderr:
            break
        time.sleep(5 * (attempt + 1))
    print(f"[commit] could not commit {names}: {proc.stderr.strip() or proc.stdout.strip()}", flush=True)


def check_jobs(jobs: int, threads: int) -> None:
    """ConfigError unless ``jobs >= 1`` and ``threads >= 0`` (the ``--jobs`` / ``--threads`` of a command that runs
    tasks), before anything is written."""
    if jobs < 1 or threads < 0:
        raise ConfigError(f"--jobs must be >= 1 and --threads >= 0, got {jobs} and {threads}")


def threads_per_job(jobs: int, threads: int = 0) -> int:
    """Intra-op threads of each of ``jobs`` workers: ``threads`` when given (> 0), else the usable cores shared out
    over the jobs (at least 1)."""
    return threads if threads > 0 else max(1, usable_cores() // max(jobs, 1))


def worker_env(threads: int) -> dict[str, str]:
    """The driver's environment with every thread-count variable (OMP, MKL, OpenBLAS) set to ``threads``."""
    return {**os.environ, **{name: str(threads) for name in THREAD_ENV_VARS}}


def time_left(task_seconds: Sequence[float], pending: int, running_elapsed: Sequence[float], jobs: int) -> float | None:
    """Seconds until the last task ends, estimated from the durations of the tasks finished so far: the ``pending``
    tasks at their mean each, the running ones for what is left of it (elapsed ``running_elapsed``), shared over
    ``jobs`` slots. None before any task has finished."""
    if not task_seconds:
        return None
    mean = sum(task_seconds) / len(task_seconds)
    return (pending * mean + sum(max(mean - e, 0.0) for e in running_elapsed)) / max(jobs, 1)


def _progress(done: int, total: int, left_s: float | None) -> str:
    """``12 of 52 tasks done, about 3.4 h left``."""
    if left_s is None:
        return f"{done} of {total} tasks done"
    left = f"{left_s / 3600:.1f} h" if left_s >= 5400 else f"{left_s / 60:.0f} min"
    return f"{done} of {total} tasks done, about {left} left"


def run_tasks(tasks: Sequence[Task], jobs: int, log_dir: Path, on_done: Callable[[Task], None] | None = None,
              poll_s: float = 10.0, threads: int = 0, cwd: Path | None = None,
              extra_env: Mapping[str, str] | None = None, label: str = "driver") -> list[str]:
    """Run the tasks not yet done, ``jobs`` at a time (each with :func:`threads_per_job` threads and ``extra_env``, in
    ``cwd``, default this process's directory), each after the tasks it waits for; returns the names of the tasks
    that failed (a task depending on a failed one is not started). ``on_done(task)`` after each task that finished
    with its done file; ``label`` prefixes the progress lines."""
    env = {**worker_env(threads_per_job(jobs, threads)), **(extra_env or {})}
    log_dir.mkdir(parents=True, exist_ok=True)
    by_name = {t.name: t for t in tasks}
    pending = [t for t in tasks if not t.done.exists()]
    running: dict[str, tuple[subprocess.Popen, object, float]] = {}  # name -> (process, log, start time)
    failed: list[str] = []
    task_seconds: list[float] = []  # the durations of the tasks finished here
    print(f"[{label}] {len(tasks) - len(pending)} of {len(tasks)} tasks done earlier; {len(pending)} to run, {jobs} "
          f"at a time with {env['OMP_NUM_THREADS']} thread(s) each", flush=True)
    while pending or running:
        for t in list(pending):
            if len(running) >= jobs:
                break
            if any(d in failed for d in t.after):
                pending.remove(t)
                failed.append(t.name)
                continue
            if not all(by_name[d].done.exists() for d in t.after if d in by_name):
                continue
            log = open(log_dir / f"{t.name}.log", "a")
            running[t.name] = (subprocess.Popen(t.argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env), log,
                               time.monotonic())
            pending.remove(t)
            print(f"[{label}] {time.strftime('%H:%M:%S')} started {t.name}", flush=True)
        if pending and not running:
            raise RuntimeError(f"tasks waiting on tasks that are not in the grid: {[t.name for t in pending]}")
        time.sleep(poll_s)
        for name, (proc, log, started) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            task = by_name[name]
            ok = proc.returncode == 0 and task.done.exists()
            if ok:
                task_seconds.append(time.monotonic() - started)
            now = time.monotonic()
            left = time_left(task_seconds, len(pending), [now - r[2] for r in running.values()], jobs)
            print(f"[{label}] {time.strftime('%H:%M:%S')} {name}: {'done' if ok else f'FAILED ({proc.returncode})'}; "
                  f"{_progress(sum(t.done.exists() for t in tasks), len(tasks), left)}", flush=True)
            if not ok:
                failed.append(name)
            elif on_done is not None:
                on_done(task)
    return failed
