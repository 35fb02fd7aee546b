"""Run directory and resume safety: where a run lives, and refusing to resume it with a config that would mix two
runs' states (checkpoint files themselves: checkpoint.py)."""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.bookkeeping import checkpoint as ckpt
from searchr1_lld import distributed
from searchr1_lld.bookkeeping.best_checkpoint import BEST_FILE
from searchr1_lld.bookkeeping.tracking import WANDB_RUN_FILE
from searchr1_lld.protocols import Accelerator
from searchr1_lld.config import Config, ConfigError, config_differences, flatten_dict, read_yaml, save_config

# Keys that say where a run lives, not what it does: never compared on resume.
RESUME_IGNORED_KEYS = ("trainer.resume", "trainer.run_name", "trainer.output_dir")
# Keys that may change when a run is resumed, but only when asked for (train.py --allow-change KEY); a trailing ".*"
# covers a section. total_steps: the LR schedule is recomputed for the new length (warmup_ratio of the new total).
RESUME_SAFE_KEYS = ("trainer.total_steps", "trainer.save_every", "trainer.keep_last_k", "trainer.keep_best",
                    "trainer.keep_best_mode", "trainer.eval_every", "trainer.full_eval_steps",
                    "trainer.eval_limit", "trainer.probe_every", "logging.*", "eval.*")
INPUTS_FILE = "inputs_fingerprint.txt"  # what the run's local inputs held (resuming onto other contents is refused)
# A run's own files: moved aside when a run starts over in a used directory.
RUN_FILES = ("checkpoints", "metrics.jsonl", "eval_before.json", "eval.json", "eval.md", "plots", "config.yaml",
             INPUTS_FILE, BEST_FILE, WANDB_RUN_FILE, "wandb")


def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(key == p or (p.endswith(".*") and key.startswith(p[:-1])) for p in patterns)


def inputs_fingerprint(cfg: Config) -> str:
    """A short hash of what the run's local inputs hold: the JSON files (config, tokenizer, index manifest) of a
    local ``model.path``, ``model.tokenizer_path`` and ``retriever.index_dir``, and the contents of the rows files
    (``data.train_files``, ``data.val_files``, ``data.test_files``) and of the step-size target or multiplier file
    when one is set. Hub ids and absent paths enter by name. A model or index rebuilt in place (same paths, other
    contents) changes it."""
    h = hashlib.sha256()
    paths = [cfg.model.path, cfg.model.tokenizer_path, cfg.retriever.index_dir, *cfg.data.train_files,
             *cfg.data.val_files, *cfg.data.test_files]
    paths += [f for f in (cfg.trainer.step_size.target_file, cfg.trainer.step_size.multiplier_file) if f]
    for path in paths:
        p = Path(path) if path else None
        h.update(str(path).encode())
        files = sorted(p.glob("*.json")) if p is not None and p.is_dir() else [p] if p is not None and p.is_file() else []
        for f in files:
            h.update(f.name.encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:12]


def default_run_name(cfg: Config, inputs: str | None = None) -> str:
    """``<config name>-<8 hex>``: a hash of every setting except those of :data:`RESUME_IGNORED_KEYS` and
    :data:`RESUME_SAFE_KEYS`, and of the inputs' fingerprint (:func:`inputs_fingerprint`), so the same command (or
    one that only extends it) on the same inputs maps to the same run directory, and rebuilt inputs (another policy
    and index under the same paths) to a new one."""
    flat = {k: v for k, v in flatten_dict(cfg.to_dict()).items()
            if not _matches(k, RESUME_IGNORED_KEYS + RESUME_SAFE_KEYS)}
    if inputs is not None:
        flat["inputs"] = inputs
    digest = hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{cfg.name}-{digest}"


def run_dir_of(cfg: Config, inputs: str | None = None) -> Path:
    """``output_dir/run_name``; without a run_name ``output_dir/<config name>-<hash of the config and inputs>``, so
    rerunning the same command finds (and resumes) the same run (see :func:`default_run_name`)."""
    return Path(cfg.trainer.output_dir) / (cfg.trainer.run_name or default_run_name(cfg, inputs))


def check_inputs(run_dir: Path, inputs: str | None, resuming: bool) -> None:
    """Refuse to resume a run in ``run_dir`` on other inputs than those it started on (its
    ``inputs_fingerprint.txt``): the checkpoint's policy and the rollouts would come from two different setups."""
    path = run_dir / INPUTS_FILE
    recorded = path.read_text().strip() if path.is_file() else None
    if resuming and inputs is not None and recorded is not None and recorded != inputs:
        raise ConfigError(
            f"{run_dir} was trained on inputs with fingerprint {recorded}, but the model, index or rows files at "
            f"the same paths now hold {inputs} (rebuilt?); resuming would mix the two. Use another trainer.run_name "
            f"(or none: the default run directory follows the inputs), or trainer.resume=never to start over.")


def check_resume_config(saved: dict[str, Any], cfg: Config, allow: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Compare the config a run was started with (``saved``, its config.yaml) with ``cfg``. Returns the differing
    keys that are accepted (each in :data:`RESUME_SAFE_KEYS` and named in ``allow``); raises ConfigError listing the
    others, since resuming with them would mix two runs' states. A key that ``saved`` lacks and ``cfg`` holds at its
    default is a field added after the run started (its default keeps the old behaviour): not a difference."""
    bad_allow = [a for a in allow if not _matches(a, RESUME_SAFE_KEYS)]
    if bad_allow:
        raise ConfigError(f"--allow-change {', '.join(bad_allow)}: only these may change on resume: "
                          f"{', '.join(RESUME_SAFE_KEYS)}")
    defaults = flatten_dict(Config().to_dict())
    saved_keys = flatten_dict(saved).keys()
    # a key the saved config lacks, at its default: a field added to the code after the run started, whose default
    # is the behaviour the run had; not a change
    diffs = {k: v for k, v in config_differences(saved, cfg).items()
             if not _matches(k, RESUME_IGNORED_KEYS)
             and not (k not in saved_keys and k in defaults and v[1] == defaults[k])}
    refused = {k: v for k, v in diffs.items() if not _matches(k, allow)}
    if refused:
        listing = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        safe = [k for k in refused if _matches(k, RESUME_SAFE_KEYS)]
        hint = (f" To change {', '.join(safe)} on resume, pass --allow-change {' --allow-change '.join(safe)}."
                if safe else "")
        raise ConfigError(
            f"the run's saved config differs from this one in {listing}; resuming would mix the two runs' states. "
            f"For a new run use another trainer.run_name (or none: the default run directory follows the settings); "
            f"trainer.resume=never starts this one over.{hint}")
    return diffs


def settle_run_dir(cfg: Config, run_dir: Path, is_main: bool, allow_changes: Sequence[str],
                   inputs: str | None = None) -> list[str]:
    """Before (re)starting a run in ``run_dir``: refuse a config that differs from the one the checkpoint's run was
    started with (except keys in ``allow_changes``), or other inputs (:func:`check_inputs`); starting over in a used
    directory moves the earlier run's files to ``previous-<time>/``; then write config.yaml (an accepted change keeps
    the old file as ``config.before-step_N.yaml``) and ``inputs_fingerprint.txt``. Returns the lines to log."""
    resume_from = ckpt.resolve_resume(cfg.trainer.resume, run_dir)
    check_inputs(run_dir, inputs, resuming=resume_from is not None)
    path = run_dir / "config.yaml"
    saved_path = (resume_from.parent.parent / "config.yaml") if resume_from is not None else path
    notes: list[str] = []
    if resume_from is not None and saved_path.is_file():
        changed = check_resume_config(read_yaml(saved_path), cfg, allow_changes)
        if changed and is_main and saved_path == path:
            backup = run_dir / f"config.before-{resume_from.name}.yaml"
            backup.write_text(path.read_text())
            notes.append("config changed on resume (allowed): "
                         + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                         + f"; the earlier config is kept as {backup.name}")
            if any(k.startswith("eval.") or k == "trainer.eval_limit" for k in changed):
                (run_dir / "eval_before.json").unlink(missing_ok=True)  # measured with the old settings
    elif resume_from is None and is_main:
        # starting over in a used directory: keep the earlier run's files (a later resume=auto must not find its
        # checkpoints, its metrics must not be mixed with the new ones)
        earlier = [run_dir / n for n in RUN_FILES if (run_dir / n).exists()]
        if any(p.name in ("checkpoints", "metrics.jsonl") for p in earlier):
            archive = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
            archive.mkdir()
            for p in earlier:
                p.rename(archive / p.name)
            notes.append(f"starting over in {run_dir} (trainer.resume={cfg.trainer.resume}): the earlier "
                         f"run's checkpoints, metrics and config were moved to {archive.name}/")
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, path.with_name(path.name + ".part"))  # atomic: other ranks may be reading it
        path.with_name(path.name + ".part").rename(path)
        if inputs is not None:
            (run_dir / INPUTS_FILE).write_text(inputs + "\n")
    return notes


SHARED_MARKERS = ".ranks"  # check_run_dir_shared's markers (removed again when the check is done)


def check_run_dir_shared(accelerator: Accelerator, run_dir: Path) -> None:
    """Refuse (ConfigError, one line, on every process) a multi-process run whose processes do not all see the same
    ``run_dir``: checkpoints are written into the directory rank 0 makes (DeepSpeed: one shard per rank) and resumed
    by every rank from it, which node-local disks break. Each process writes a marker named by a nonce of this launch
    into ``run_dir/.ranks/``, then each counts the markers it sees. Draws no number from the seeded RNGs. No-op for
    one process."""
    n = accelerator.num_processes
    if n == 1:
        return
    rank = accelerator.process_index
    (nonce,) = distributed.agree_max(accelerator, [secrets.randbits(62) if rank == 0 else 0])
    marks = Path(run_dir) / SHARED_MARKERS
    marks.mkdir(parents=True, exist_ok=True)
    mine = marks / f"{nonce}.rank{rank}"
    mine.write_text(socket.gethostname() + "\n")
    accelerator.wait_for_everyone()
    seen = len(list(marks.glob(f"{nonce}.rank*")))
    (worst,) = distributed.agree_max(accelerator, [n - seen])
    accelerator.wait_for_everyone()
    mine.unlink(missing_ok=True)
    accelerator.wait_for_everyone()
    if rank == 0:
        try:
            marks.rmdir()
        except OSError:  # markers of another launch in the same directory
            pass
    if worst:
        raise ConfigError(
            f"trainer.output_dir: the run directory {run_dir} is not shared by the {n} processes (rank {rank} on "
            f"{socket.gethostname()} sees {seen} of their {n} markers; some rank sees only {n - worst}): checkpoints "
            f"and resume need one directory that every node mounts at the same path (docs/multinode.md)")
