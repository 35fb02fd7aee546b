"""Train GRPO / GRPO+LLDS on Search-R1 rollouts.

    python train.py --config configs/tiny.yaml [dotted.key=value ...]
    accelerate launch --config_file configs/accelerate/zero2_8gpu.yaml train.py --config configs/... [overrides]

Prints the run directory at start and end; evaluates greedy test EM before and after training (synthetic world test
split) and writes the before/after table to RUN/eval.md. The Python API is ``searchr1_lld.trainer.train(cfg)``.
"""

from __future__ import annotations

import argparse
import sys

from searchr1_lld.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny.yaml", help="YAML experiment config")
    parser.add_argument("--no-eval", action="store_true", help="skip the before/after test evaluation")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    from searchr1_lld.trainer import Trainer

    trainer = Trainer(cfg)
    main_proc = trainer.accelerator.is_main_process
    if main_proc:
        print(f"run directory: {trainer.run_dir}", flush=True)
    result = trainer.run(evaluate=not args.no_eval)
    if main_proc:
        print(f"steps: {result.steps}  skipped updates: {result.skipped_steps}")
        print(f"run directory: {result.run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
