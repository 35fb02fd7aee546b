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

from searchr1_lld.cli import run_main
from searchr1_lld.learner.command import DEFAULT_CONFIG, TrainOptions, run_train
from searchr1_lld.world.training import TrainingWorld


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None,
                        help=f"YAML experiment config (default: {DEFAULT_CONFIG}; with --resume: the run's config.yaml)")
    parser.add_argument("--resume", metavar="PATH", help="continue this run directory (or checkpoint directory)")
    parser.add_argument("--allow-change", action="append", default=[], metavar="KEY",
                        help="on resume, accept a changed value of KEY (only keys that are safe to change, e.g. "
                             "trainer.total_steps; repeat for several)")
    parser.add_argument("--world", metavar="FILE", help="train on the synthetic world of this world config "
                        "(configs/world/*.yaml), built into --world-dir first if needed")
    parser.add_argument("--world-dir", default=".cache/world", help="where the --world world lives (default: %(default)s)")
    parser.add_argument("--no-eval", action="store_true",
                        help="skip the test evaluation before and after training (each scores every test question)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    parser.add_argument("--preflight", action="store_true",
                        help="check the config, data files, retriever and model, print the resource plan (GPU memory "
                             "at rollout and update, host RAM, disk, evaluation cost) and exit without training (no "
                             "GPU needed): 0 when the run can start, 2 with one line per problem")
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the blocking checks (files, retriever, the memory plan of this GPU) that a launch on "
                             "a GPU runs on every rank before the model loads")
    parser.add_argument("--accelerate-config", metavar="FILE",
                        help="with --preflight: the accelerate config the run will be launched with (processes, "
                             "ZeRO stage, offload; default: one process without DeepSpeed)")
    parser.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                        help="with --preflight: memory of one GPU in GiB (default: this machine's GPU, else an "
                             "80 GB H100's 79.6 GiB)")
    parser.add_argument("--help-config", action="store_true",
                        help="print every config key (by section, with type, default and help) and exit")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(lambda a: run_train(TrainOptions(**vars(build_parser().parse_args(a))), TrainingWorld()), argv,
                    prog="train.py")


if __name__ == "__main__":
    sys.exit(main())
