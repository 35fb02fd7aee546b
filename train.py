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
(GPU memory at rollout and at update, host RAM, disk, evaluation cost) without training and without a GPU:
``python train.py --config configs/paper/<run>.yaml --preflight --accelerate-config configs/accelerate/zero2_8gpu.yaml``
exits 0 when the run can start, 2 with one line per problem.

Prints the run directory at start and end; evaluates greedy EM on data.test_files before and after training and
writes the before/after table to RUN/eval.md. The Python API is ``searchr1_lld.learner.trainer.train(cfg)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from searchr1_lld.cli import UserError, check_model_source, run_main
from searchr1_lld.config import load_config

DEFAULT_CONFIG = "configs/tiny.yaml"


def _resume_target(path: str) -> tuple[Path, str]:
    """``--resume PATH`` -> (run dir, trainer.resume value): a run dir resumes its last checkpoint, a checkpoint dir
    that one."""
    from searchr1_lld.bookkeeping.checkpoint import COMPLETE

    p = Path(path)
    if (p / COMPLETE).is_file():
        return p.parent.parent, str(p)
    if (p / "config.yaml").is_file() or (p / "checkpoints").is_dir():
        return p, "auto"
    raise UserError(f"--resume {path}: neither a run directory (config.yaml, checkpoints/) nor a checkpoint "
                    f"(step_N/ with {COMPLETE})")


def config_reference() -> str:
    """The run config's keys, then the synthetic world's (configs/world/*.yaml, train.py --world)."""
    from searchr1_lld.config import format_help
    from searchr1_lld.world import WorldConfig

    return (format_help() + "\n# The synthetic world (configs/world/*.yaml, train.py --world FILE):\n\n"
            + format_help(WorldConfig, prefix="world."))


def world_overrides(world_config: str, world_dir: str) -> list[str]:
    """Build (local rank 0) or wait for (the other ranks) the world of ``world_config`` in ``world_dir``; return
    the run-config overrides that train on it."""
    from searchr1_lld.world import ensure_world_on_ranks, load_world_config, trainer_overrides

    ensure_world_on_ranks(world_dir, load_world_config(world_config))
    return trainer_overrides(world_dir)


def preflight(cfg, accelerate_config: str | None, gpu_memory_gib: float | None) -> int:
    """``--preflight``: the report on stdout, then each problem on stderr, one line each; 0 or 2."""
    from searchr1_lld.learner import preflight as pre
    launch = pre.read_launch(accelerate_config) if accelerate_config else None
    result = pre.run_preflight(cfg, launch=launch, device_gib=gpu_memory_gib)
    print(pre.format_report(result), flush=True)
    for problem in result.problems:
        print(f"train.py: preflight: {problem}", file=sys.stderr)
    return 2 if result.problems else 0


def _main(argv: list[str] | None = None) -> int:
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
    parser.add_argument("--accelerate-config", metavar="FILE",
                        help="with --preflight: the accelerate config the run will be launched with (processes, "
                             "ZeRO stage, offload; default: one process without DeepSpeed)")
    parser.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                        help="with --preflight: memory of one GPU in GiB (default: this machine's GPU, else an "
                             "80 GB H100's 79.6 GiB)")
    parser.add_argument("--help-config", action="store_true",
                        help="print every config key (by section, with type, default and help) and exit")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    args = parser.parse_args(argv)
    if args.help_config:
        print(config_reference())
        return 0
    run_dir = None
    overrides = list(args.overrides)
    config = args.config
    if args.resume:
        run_dir, resume = _resume_target(args.resume)
        if config is None and (run_dir / "config.yaml").is_file():
            config = str(run_dir / "config.yaml")
        overrides.append(f"trainer.resume={resume}")
    if args.world and args.preflight:  # named, not built: the preflight reports what is missing
        from searchr1_lld.world import trainer_overrides

        overrides = trainer_overrides(args.world_dir) + overrides
    elif args.world:
        overrides = world_overrides(args.world, args.world_dir) + overrides  # the command line's own keys win
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    if args.preflight:
        return preflight(cfg, args.accelerate_config, args.gpu_memory_gib)
    for value, key, is_tok in ((cfg.model.path, "model.path", False),
                               (cfg.model.tokenizer_path, "model.tokenizer_path", True)):
        try:
            check_model_source(value, key, tokenizer=is_tok)
        except UserError as e:
            raise UserError(f"{e} (a synthetic world's policy and tokenizer: train.py --world "
                            f"configs/world/default.yaml, or python -m searchr1_lld.world build)") from None

    from searchr1_lld.bookkeeping.tracking import quiet_library_output
    from searchr1_lld.learner.trainer import Trainer

    quiet_library_output()
    trainer = Trainer(cfg, run_dir=run_dir)
    main_proc = trainer.learner.dist.is_main
    if main_proc:
        print(f"run directory: {trainer.run_dir}", flush=True)
    result = trainer.run(evaluate=not args.no_eval, allow_changes=[k for a in args.allow_change for k in a.split(",")])
    if main_proc:
        print(f"steps: {result.steps}  skipped updates: {result.skipped_updates}")
        print(f"run directory: {result.run_dir}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(_main, argv, prog="train.py")


if __name__ == "__main__":
    sys.exit(main())
