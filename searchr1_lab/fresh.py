"""``grid --fresh DIR``: a committed study's grid rerun into a fresh directory.

A grid counts a task as done when its compact result exists, so the command that made a committed study reruns
nothing. ``--fresh DIR`` added to that command reruns every task of it into DIR instead: the runs train in
``DIR/train``, their compact results land in ``DIR/runs``, and once every task has finished the study's report is
written from them into ``DIR/report`` (the report the study's committed results feed: the registered analysis of a
registration, the pre-registered comparison's or the comparison's). The committed results, docs/ and README.md are
not written, nothing is committed, and the same command resumes the rerun. ``DIR/rerun.json`` names the results
the rerun repeats, so one DIR never mixes two studies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1_lld.config import ConfigError
from searchr1_lab.methods import REPO_ROOT
from searchr1_lab.prereg.registration import PREREG_FILE, registration_of
from searchr1_lab.running import repo_relative
from searchr1_lab.registered import registration as stepsize

MARKER = "rerun.json"


def add_argument(p: argparse.ArgumentParser) -> None:
    """The grid's ``--fresh DIR``."""
    p.add_argument("--fresh", metavar="DIR", help="rerun every task of this grid into DIR (runs in DIR/train, compact "
                   "results in DIR/runs, the study's report in DIR/report once all have finished), leaving the "
                   "committed results (--compact or the registration's), docs/ and README.md as they are; the same "
                   "command resumes it")


@dataclass(frozen=True)
class Rerun:
    """A rerun in ``dir`` of the study whose committed results are in ``study_runs`` (``registration``: the
    registration file of a registered grid)."""

    dir: Path
    study_runs: Path
    registration: Path | None = None

    @property
    def runs_root(self) -> Path:
        return self.dir / "train"

    @property
    def compact_dir(self) -> Path:
        return self.dir / "runs"

    @property
    def report_dir(self) -> Path:
        return self.dir / "report"

    def redirect(self, reg: dict[str, Any] | None) -> dict[str, Any] | None:
        """A registration whose grid trains and writes into the rerun's directories (None stays None)."""
        if reg is None:
            return None
        block = {**reg["registration"], "train_dir": str(self.runs_root), "runs_dir": str(self.compact_dir)}
        return {**reg, "registration": block}

    def report_argv(self) -> list[str]:
        """The ``python -m searchr1_lab`` arguments of the study's report, from the rerun's results into
        :attr:`report_dir` (no README)."""
        runs, out = ["--runs", str(self.compact_dir)], ["--out", str(self.report_dir)]
        if self.registration is not None and stepsize.registration_of(self.study_runs, self.registration):
            return ["stepsize-report", "--registration", str(self.registration), *runs, *out]
        if registration_of(self.study_runs, REPO_ROOT / PREREG_FILE) is not None:
            return ["prereg-report", "--prereg", str(REPO_ROOT / PREREG_FILE), *runs, *out]
        return ["report", *runs, *out]

    def finish(self, failed: list[str]) -> list[str]:
        """After the grid: the study's report of the rerun, written in a fresh interpreter as the grid writes its
        reports, once no task has failed; returns ``["report"]`` when it could not be written, else nothing."""
        if failed:
            return []
        proc = subprocess.run([sys.executable, "-m", "searchr1_lab", *self.report_argv()], cwd=REPO_ROOT)
        if proc.returncode != 0:
            print(f"[grid] the rerun's report failed (exit {proc.returncode})", flush=True)
            return ["report"]
        print(f"[grid] the rerun's report: {self.report_dir} (beside the committed results in "
              f"{repo_relative(self.study_runs)})", flush=True)
        return []


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or lies below it."""
    return a == b or a.is_relative_to(b)


def prepare(args: argparse.Namespace, compact_dir: Path) -> Rerun | None:
    """The rerun ``args.fresh`` asks for (None without it) of the study whose results are in ``compact_dir``;
    ConfigError for what a rerun cannot do: commit (``--commit``), rerun the demo (``--demo``), write into the
    committed results, or continue a rerun of another study."""
    if not getattr(args, "fresh", None):
        return None
    if args.commit or args.demo:
        raise ConfigError("--fresh reruns a study beside its committed results: without --commit (nothing of a rerun "
                          "is committed) and --demo (the demo reruns with its own --select-dir and --report)")
    rerun = Rerun(Path(args.fresh).resolve(), Path(compact_dir).resolve(),
                  Path(args.registration).resolve() if args.registration else None)
    if _inside(rerun.dir, rerun.study_runs) or _inside(rerun.study_runs, rerun.dir):
        raise ConfigError(f"--fresh {args.fresh} overlaps the committed results {repo_relative(rerun.study_runs)}: "
                          "give a directory of its own")
    marker = rerun.dir / MARKER
    record = {"reruns": repo_relative(rerun.study_runs)}
    if marker.is_file() and json.loads(marker.read_text()) != record:
        raise ConfigError(f"{args.fresh} holds a rerun of {json.loads(marker.read_text()).get('reruns')}, not of "
                          f"{record['reruns']}: give another --fresh directory")
    rerun.dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(record, indent=2) + "\n")
    return rerun
