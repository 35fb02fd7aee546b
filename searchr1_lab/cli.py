"""``python -m searchr1_lab``: the command line of the lab (usage in the package docstring)."""

from __future__ import annotations

import argparse
import sys

from searchr1_lld.cli import run_main
from searchr1_lab.comparison.report import main as report_main
from searchr1_lab.grid import main as grid_main
from searchr1_lab.prereg.report import main as prereg_main
from searchr1_lab.stepsize.report import main as stepsize_main
from searchr1_lab.stepsize.target import main as target_main
from searchr1_lab.frontier.report import main as frontier_main
from searchr1_lab.spiral.report import main as spiral_main
from searchr1_lab.methods import FULL_CONFIG, METHODS, QUICK_CONFIG, parse_methods, parse_seeds
from searchr1_lab.running import run_lab

# the subcommands that take the rest of the command line: name -> its main
SUBCOMMANDS = {"report": report_main, "prereg-report": prereg_main, "stepsize-report": stepsize_main,
               "step-kl-target": target_main, "frontier-report": frontier_main, "spiral-report": spiral_main}
QUICK_TRAIN_EVAL = 16  # --quick's training questions evaluated per policy (quick.yaml scores 16 test questions)


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """The command line; ``description``: its help text (the package's docstring). ``grid`` / ``task``: the
    comparison's driver (:mod:`.grid`); ``report``: its report from the compact results (:mod:`.comparison.report`)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] in ("grid", "task"):
        return grid_main(args_in)
    if args_in and args_in[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args_in[0]](args_in[1:])
    return run_main(lambda a: _lab(a, description), argv, prog="python -m searchr1_lab")


def _lab(argv: list[str] | None, description: str | None) -> int:
    """The lab's runs and report; a config error or Ctrl-C -> one line (:func:`searchr1_lld.cli.run_main`)."""
    p = argparse.ArgumentParser(prog="python -m searchr1_lab", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = p.parse_args(argv)
    config = args.config or str(QUICK_CONFIG if args.quick else FULL_CONFIG)
    run_lab(
        config_path=config, overrides=args.overrides, seeds=parse_seeds(args.seeds or ("0" if args.quick else "0,1")),
        methods=parse_methods(args.methods),
        out_dir=args.out or ("runs/lab-quick/report" if args.quick else "docs/lab"),
        runs_dir=args.runs_dir or ("runs/lab-quick" if args.quick else "runs/lab"), world_dir=args.world_dir,
        quick=args.quick, report_only=args.report_only, fresh=args.fresh,
        sampled=args.sampled, extend_from=args.extend_from,
        train_eval=args.train_eval if args.train_eval is not None else (QUICK_TRAIN_EVAL if args.quick else 100),
        command="python -m searchr1_lab " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    return 0
