"""What ``train.py`` does, as typed functions: its flags (:class:`TrainOptions`) and the synthetic world it may train
on (:class:`WorldSource`, supplied by the entry script: the core never imports the world) resolved into the run
config, then ``--help-config``, ``--preflight`` or the training run itself (:func:`run_train`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

from searchr1_lld.bookkeeping.checkpoint import COMPLETE
from searchr1_lld.bookkeeping.tracking import quiet_library_output
from searchr1_lld.cli import UserError, check_model_source, option
from searchr1_lld.config import Config, load_config
from searchr1_lld.preflight import run as pre
from searchr1_lld.preflight.allocator import use_expandable_segments
from searchr1_lld.preflight.startup import PreflightRefused
from searchr1_lld.learner.trainer import Trainer

DEFAULT_CONFIG = "configs/tiny.yaml"


@dataclass
class TrainOptions:
    """train.py's options, one field each: the declaration train.py's parser is generated from (cli.option)."""

    config: Optional[str] = option(help=f"YAML experiment config (default: {DEFAULT_CONFIG}; with --resume: the "
                                        "run's config.yaml)")
    resume: Optional[str] = option(metavar="PATH", help="continue this run directory (or checkpoint directory)")
    allow_change: list[str] = option([], action="append", metavar="KEY",
                                     help="on resume, accept a changed value of KEY (only keys that are safe to "
                                          "change, e.g. trainer.total_steps; repeat for several)")
    world: Optional[str] = option(metavar="FILE", help="train on the synthetic world of this world config "
                                                       "(configs/world/*.yaml), built into --world-dir first if needed")
    world_dir: str = option(".cache/world", help="where the --world world lives (default: %(default)s)")
    no_eval: bool = option(False, action="store_true", help="skip the test evaluation before and after training "
                                                            "(each scores every test question)")
    debug: bool = option(False, action="store_true", help="show tracebacks of user errors too")
    preflight: bool = option(False, action="store_true",
                             help="check the config, data files, retriever and model, print the resource plan (GPU "
                                  "memory at rollout and update, host RAM, disk, evaluation cost) and exit without "
                                  "training (no GPU needed): 0 when the run can start, 2 with one line per problem")
    no_preflight: bool = option(False, action="store_true",
                                help="skip the blocking checks (files, retriever, the memory plan of this GPU) that a "
                                     "launch on a GPU runs on every rank before the model loads")
    accelerate_config: Optional[str] = option(metavar="FILE",
                                              help="with --preflight: the accelerate config the run will be launched "
                                                   "with (processes, ZeRO stage, offload; default: one process "
                                                   "without DeepSpeed)")
    gpu_memory_gib: Optional[float] = option(type=float, metavar="GIB",
                                             help="with --preflight: memory of one GPU in GiB (default: this "
                                                  "machine's GPU, else an 80 GB H100's 79.6 GiB)")
    help_config: bool = option(False, action="store_true",
                               help="print every config key (by section, with type, default and help) and exit")
    overrides: list[str] = option([], positional=True, nargs="*",
                                  help="dotted key=value overrides, e.g. trainer.total_steps=10")


class WorldSource(Protocol):
    """The synthetic world a run may train on (``--world``): its config keys' help, and the run-config overrides
    that name its policy, index and splits (``build``: build it first if needed, else only name it)."""

    def reference(self) -> str: ...

    def overrides(self, world_config: str, world_dir: str, build: bool) -> list[str]: ...


def resume_target(path: str) -> tuple[Path, str]:
    """``--resume PATH`` -> (run dir, trainer.resume value): a run dir resumes its last checkpoint, a checkpoint dir
    that one."""
    p = Path(path)
    if (p / COMPLETE).is_file():
        return p.parent.parent, str(p)
    if (p / "config.yaml").is_file() or (p / "checkpoints").is_dir():
        return p, "auto"
    raise UserError(f"--resume {path}: neither a run directory (config.yaml, checkpoints/) nor a checkpoint "
                    f"(step_N/ with {COMPLETE})")


def run_config(opts: TrainOptions, world: WorldSource) -> tuple[Config, Optional[Path]]:
    """(the run config, the run dir to resume or None): --config (with --resume: the run's config.yaml), the world's
    overrides, then the command line's own keys (which win)."""
    run_dir = None
    overrides = list(opts.overrides)
    config = opts.config
    if opts.resume:
        run_dir, resume = resume_target(opts.resume)
        if config is None and (run_dir / "config.yaml").is_file():
            config = str(run_dir / "config.yaml")
        overrides.append(f"trainer.resume={resume}")
    if opts.world:  # with --preflight named, not built: the preflight reports what is missing
        overrides = world.overrides(opts.world, opts.world_dir, not opts.preflight) + overrides
    return load_config(config or DEFAULT_CONFIG, overrides), run_dir


def preflight(cfg: Config, accelerate_config: str | None, gpu_memory_gib: float | None) -> int:
    """``--preflight``: the report on stdout, then each problem on stderr, one line each; 0 or 2."""
    launch = pre.read_launch(accelerate_config) if accelerate_config else None
    result = pre.run_preflight(cfg, launch=launch, device_gib=gpu_memory_gib)
    print(pre.format_report(result), flush=True)
    for problem in result.problems:
        print(f"train.py: preflight: {problem}", file=sys.stderr)
    return 2 if result.problems else 0


def check_model_sources(cfg: Config) -> None:
    """model.path and model.tokenizer_path name a model and a tokenizer (a missing dir is named now)."""
    for value, key, is_tok in ((cfg.model.path, "model.path", False),
                               (cfg.model.tokenizer_path, "model.tokenizer_path", True)):
        try:
            check_model_source(value, key, tokenizer=is_tok)
        except UserError as e:
            raise UserError(f"{e} (a synthetic world's policy and tokenizer: train.py --world "
                            f"configs/world/default.yaml, or python -m searchr1_lld.world build)") from None


def run_train(opts: TrainOptions, world: WorldSource) -> int:
    """train.py with these flags: the config reference, the preflight, or the run (the run directory printed at start
    and end); 0 when done, 2 when the start-up preflight refused the run (its problems printed by rank 0). The
    learner's allocator gets expandable_segments before anything starts CUDA (preflight/allocator.py)."""
    use_expandable_segments()
    if opts.help_config:
        print(world.reference())
        return 0
    cfg, run_dir = run_config(opts, world)
    if opts.preflight:
        return preflight(cfg, opts.accelerate_config, opts.gpu_memory_gib)
    check_model_sources(cfg)
    quiet_library_output()
    try:
        trainer = Trainer(cfg, run_dir=run_dir, preflight=not opts.no_preflight)
    except PreflightRefused:
        return 2
    main_proc = trainer.learner.dist.is_main
    if main_proc:
        print(f"run directory: {trainer.run_dir}", flush=True)
    result = trainer.run(evaluate=not opts.no_eval, allow_changes=[k for a in opts.allow_change for k in a.split(",")])
    trainer.learner.close()
    if main_proc:
        print(f"steps: {result.steps}  skipped updates: {result.skipped_updates}")
        print(f"run directory: {result.run_dir}", flush=True)
    return 0
