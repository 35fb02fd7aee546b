"""Train GRPO / GRPO+LLDS on Search-R1 rollouts.

    python train.py --config configs/tiny.yaml [dotted.key=value ...]
    accelerate launch --config_file configs/accelerate/zero2_8gpu.yaml train.py --config configs/... [overrides]

``--world configs/world/default.yaml [--world-dir .cache/world]`` first builds the synthetic world there if it is not
built yet (one process per machine builds, the others wait), then trains on it: its policy, index and splits are
named through the run config's own keys (model.path, retriever.index_dir, data.train_files, data.test_files).

The run directory is trainer.output_dir/trainer.run_name; without a run_name it is derived from the config
(``runs/<config name>-<hash of the settings>``), so rerunning the same command resumes the same run from its last
checkpoint. ``--resume RUN_DIR`` (or a checkpoint dir) continues a run with the config it was started with. A resumed
run whose config differs from its saved config.yaml is refused (the differing keys are listed); keys that are safe to
change (trainer.total_steps, ...) may be changed with ``--allow-change KEY``.

``--preflight`` checks everything a run needs (config, data files, retriever, model) and prints its resource plan
(GPU memory at the engine's start, at rollout and at update, host RAM, disk, evaluation cost) without training and
without a GPU:
``python train.py --config configs/paper/<run>.yaml --preflight --accelerate-config configs/accelerate/zero2_8gpu.yaml``
exits 0 when the run can start, 2 with one line per problem. Every launch on a GPU runs the same blocking checks
itself, on every rank, before the model loads and before any engine is built (its launch read from the running
accelerator, its GPU's own memory): one line per problem on rank 0 and exit 2 on every rank; ``--no-preflight`` skips
them. The learner's PyTorch allocator runs with ``expandable_segments`` unless PYTORCH_CUDA_ALLOC_CONF names it.

Prints the run directory at start and end; evaluates greedy EM on data.test_files before and after training and
writes the before/after table to RUN/eval.md. The Python API is ``searchr1_lld.learner.trainer.train(cfg)``.
"""

from __future__ import annotations

import argparse
import sys

from searchr1_lld.cli import options_parser, parse_options, run_main
from searchr1_lld.learner.command import DEFAULT_CONFIG, TrainOptions, run_train
from searchr1_lld.world.training import TrainingWorld


def build_parser() -> argparse.ArgumentParser:
    """train.py's parser, generated from :class:`TrainOptions` (its one declaration)."""
    return options_parser(TrainOptions, __doc__)


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(lambda a: run_train(parse_options(TrainOptions, a, __doc__), TrainingWorld()), argv,
                    prog="train.py")


if __name__ == "__main__":
    sys.exit(main())
