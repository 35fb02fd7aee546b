"""``python -m searchr1_lab``: the command line of the lab, one argparse subcommand per command (usage in the package
docstring). ``run`` (the lab's runs and report) is the default: a command line whose first word names no command is
``run``'s, so ``python -m searchr1_lab --quick`` is ``python -m searchr1_lab run --quick``. The other commands read
their own arguments with their module's parser (``python -m searchr1_lab grid --help``)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from searchr1_lld.cli import run_main
from searchr1_lab.comparison.report import main as report_main
from searchr1_lab.grid import main as grid_main
from searchr1_lab.prereg.report import main as prereg_main
from searchr1_lab.stepsize.report import main as stepsize_main
from searchr1_lab.stepsize.target import main as curve_main
from searchr1_lab.frontier.report import main as frontier_main
from searchr1_lab.spiral.report import main as spiral_main
from searchr1_lab.methods import FULL_CONFIG, METHODS, QUICK_CONFIG, parse_methods, parse_seeds
from searchr1_lab.running import run_lab

QUICK_TRAIN_EVAL = 16  # --quick's training questions evaluated per policy (quick.yaml scores 16 test questions)
PROG = "python -m searchr1_lab"
DEFAULT_COMMAND = "run"

# the commands besides run: name -> (its help line, its entry: the arguments after the name -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "grid": ("the comparison's resumable grid of worker processes, here or as a Slurm job array (--slurm)",
             lambda rest: grid_main(["grid", *rest])),
    "task": ("one task of a grid (a run or the baselines): what grid's workers run",
             lambda rest: grid_main(["task", *rest])),
    "report": ("the comparison's report and README block from its compact results", report_main),
    "prereg-report": ("the pre-registered comparison's registered analysis and report", prereg_main),
    "stepsize-report": ("the step-size study's registered analysis and report", stepsize_main),
    "step-kl-target": ("the per-step KL target a matched control follows, from a reference arm's runs",
                       lambda rest: curve_main("step-kl-target", rest)),
    "lr-curve": ("the per-step learning-rate multiplier an open-loop replay runs with, from a trust-region arm's runs",
                 lambda rest: curve_main("lr-curve", rest)),
    "frontier-report": ("the frontier study's registered analysis and report", frontier_main),
    "spiral-report": ("the death-spiral calibration's table and figures: which parts of the paper's signature each "
                      "setting showed", spiral_main),
}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``run``: the lab's runs and report."""
    p.add_argument("--quick", action="store_true",
                   help="a check of the pipeline in about a minute, not a comparison (configs/lab/quick.yaml: the "
                        "demo's world, seed 0, 3 tiny steps per method)")
    p.add_argument("--config", help="lab config (default: configs/lab/lab.yaml, or quick.yaml with --quick)")
    p.add_argument("--seeds", help="comma-separated seeds (default: 0,1, about an hour on 2 cores; 0 with --quick)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    p.add_argument("--out", help="report dir (default: docs/lab; runs/lab-quick/report with --quick)")
    p.add_argument("--runs-dir", help="where the runs go (default: runs/lab or runs/lab-quick)")
    p.add_argument("--world-dir", help="an existing world dir to use as is (default: .cache/lab-world-<hash>)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs in --runs-dir")
    p.add_argument("--sampled", type=int, default=4, metavar="N",
                   help="also score every policy sampled: N rollouts per test question at the rollout temperature "
                        "(0 = greedy EM only; finished runs are scored from their last checkpoint)")
    p.add_argument("--train-eval", type=int, default=None, metavar="N",
                   help="also evaluate every policy greedily on the first N training questions and report, for both "
                        "splits, whether the answers were copied from a retrieved passage (default 100, with --quick "
                        f"{QUICK_TRAIN_EVAL}: as many as it scores test questions; 0 = off; finished runs are "
                        "evaluated from their last checkpoint)")
    p.add_argument("--extend-from", metavar="DIR",
                   help="runs dir of this lab trained to fewer trainer.total_steps: missing runs are copied from there "
                        "and trained on from their last checkpoint (DIR is not changed)")
    p.add_argument("--fresh", action="store_true", help="retrain runs that already finished with the same config")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    p.add_argument("overrides", nargs="*", help="key=value config overrides applied to every method")


def command_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The lab's parser: ``run`` with its arguments, every other command of :data:`COMMANDS` by name (its arguments
    are its own parser's); the top-level help lists the commands and, after them, ``run``'s options."""
    p = argparse.ArgumentParser(prog=PROG, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND",
                           title=f"commands (without one: {DEFAULT_COMMAND})")
    run = sub.add_parser(DEFAULT_COMMAND, help="the lab's runs and report (the default command)",
                         description="The lab's runs (every method x seed) and their report.")
    add_run_arguments(run)
    run.set_defaults(entry=None)
    for name, (help_text, entry) in COMMANDS.items():
        # add_help=False: `NAME --help` is the command's own parser's help, which lists its arguments
        sub.add_parser(name, help=help_text, add_help=False).set_defaults(entry=entry)
    p.epilog = f"{DEFAULT_COMMAND} ({PROG} [{DEFAULT_COMMAND}] [options] [key=value ...]): " + (
        run.format_help().split("\n\n", 1)[1])  # its help without its usage line
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """The command line; ``description``: its help text (the package's docstring)."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser(description)
    if not words or words[0] not in (DEFAULT_COMMAND, *COMMANDS, "-h", "--help"):
        words = [DEFAULT_COMMAND, *words]
    if words[0] in COMMANDS:
        args, rest = parser.parse_known_args(words)
        return args.entry(rest)
    return run_main(lambda a: _lab(parser.parse_args(a), a), words, prog=PROG)


def _lab(args: argparse.Namespace, words: list[str]) -> int:
    """The lab's runs and report (``words``: the command line, recorded in the report); a config error or Ctrl-C ->
    one line (:func:`searchr1_lld.cli.run_main`)."""
    config = args.config or str(QUICK_CONFIG if args.quick else FULL_CONFIG)
    run_lab(
        config_path=config, overrides=args.overrides, seeds=parse_seeds(args.seeds or ("0" if args.quick else "0,1")),
        methods=parse_methods(args.methods),
        out_dir=args.out or ("runs/lab-quick/report" if args.quick else "docs/lab"),
        runs_dir=args.runs_dir or ("runs/lab-quick" if args.quick else "runs/lab"), world_dir=args.world_dir,
        quick=args.quick, report_only=args.report_only, fresh=args.fresh,
        sampled=args.sampled, extend_from=args.extend_from,
        train_eval=args.train_eval if args.train_eval is not None else (QUICK_TRAIN_EVAL if args.quick else 100),
        command=f"{PROG} " + " ".join(words[1:]),  # words[0] is run, typed or implied
    )
    return 0
