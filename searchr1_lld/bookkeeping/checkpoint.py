"""Checkpoints: written atomically, kept last-k, resumed exactly.

Layout of one checkpoint (``RUN/checkpoints/step_000010/``)::

    policy/            HF ``save_pretrained`` of the policy (loadable by from_pretrained / eval.py)
    optimizer.pt       optimiser state_dict            (plain accelerate / DDP)
    deepspeed/         engine.save_checkpoint: module + (partitioned) optimiser states   (DeepSpeed)
(the model's and the optimiser's part is the training engine's: ``engine.save_state`` / ``engine.load_state`` of
learner/engines; :func:`save_model_state` / :func:`load_model_state` are the plain one's)
    scheduler.pt       LR scheduler state_dict
    rng_rank{r}.pt     RNG states of rank r: python, numpy, torch CPU, torch CUDA
    trainer_state.json step, data position, probe set, phase-detector history, anything else the trainer passes
    COMPLETE           written last: the list of every file above with its size; a directory without it, or
                       with a listed file missing or of another size, is not a checkpoint (never resumed from)

Atomicity (a kill at any point leaves only complete ``step_*`` directories):
  save   everything is written to ``.tmp-step_000010`` next to the final directory, ``COMPLETE`` last, then the
         directory is renamed to ``step_000010`` (one atomic rename);
  prune  an old checkpoint is first renamed to ``.trash-step_000001`` (atomic: it stops being a checkpoint at once),
         then its contents are deleted; re-saving an existing step renames the old one to ``.trash-*`` the same way.
The next save removes leftover ``.tmp-*`` / ``.trash-*`` directories; a ``.tmp-*`` directory that is complete and whose
``step_*`` is missing (killed between the two renames of a re-save) is renamed into place first (by the next save, or
by ``resolve_resume("auto")``).
tests/test_checkpoint.py kills a save after each of its steps on disk (the temporary directory made, each file written,
each rename, the first file deleted from an old checkpoint, the return) and resumes from what is left.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Collection

import numpy as np
import torch

from searchr1_lld.distributed import any_rank
from searchr1_lld.protocols import Accelerator, ModelStateStore, Tokenizer

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP, _TRASH = ".tmp-", ".trash-"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


# --------------------------------------------------------------------------------------------------------------------
# RNG
# --------------------------------------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------------------------------------------------


def _marker_text(step: int, directory: Path) -> str:
    """``COMPLETE``: the step, then one ``size<TAB>relative path`` line per file of the checkpoint."""
    lines = [f"step {step}"]
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        lines.append(f"{f.stat().st_size}\t{f.relative_to(directory).as_posix()}")
    return "\n".join(lines) + "\n"


def incomplete_reason(path: str | Path) -> str | None:
    """None when ``path`` is a complete checkpoint, else why not (no marker, a listed file missing or truncated)."""
    path = Path(path)
    marker = path / COMPLETE
    if not marker.is_file():
        return f"no {COMPLETE} marker"
    for line in marker.read_text().splitlines()[1:]:  # markers of older versions hold only the step line
        size, _, rel = line.partition("\t")
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != int(size):
            return f"{rel} has {f.stat().st_size} bytes, {size} were written"
    return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (incomplete directories are ignored: see
    :func:`incomplete_reason`)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and incomplete_reason(p) is None:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def resolve_resume(resume: str, run_dir: str | Path) -> Path | None:
    """``trainer.resume`` -> checkpoint dir or None: ``auto`` = last complete one in run_dir, ``never`` = None,
    anything else = that path (must be a complete checkpoint)."""
    if resume == "never":
        return None
    if resume == "auto":
        _finish_interrupted_resave(checkpoint_root(run_dir))
        return latest_checkpoint(run_dir)
    path = Path(resume)
    reason = incomplete_reason(path)
    if reason:
        raise FileNotFoundError(f"trainer.resume={resume!r} is not a complete checkpoint ({reason})")
    return path


# --------------------------------------------------------------------------------------------------------------------
# Save / load
# --------------------------------------------------------------------------------------------------------------------


def tied_duplicate_names(model: torch.nn.Module) -> list[str]:
    """Names of parameters that are the same Parameter as an earlier name (tied embeddings: ``lm_head.weight``).
    DeepSpeed's gathered state dict holds them as separate tensors, so ``save_pretrained`` cannot see the tie."""
    seen: set[int] = set()
    dupes = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            dupes.append(name)
        seen.add(id(p))
    return dupes


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    trainer_state: dict[str, Any],
    accelerator: Accelerator | None = None,
    keep_last_k: int = 2,
    save_policy: bool = True,
    tokenizer: Tokenizer | None = None,
    keep_steps: Collection[int] = (),
    engine: ModelStateStore | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and prune to the last ``keep_last_k`` (the checkpoints of
    ``keep_steps`` are exempt: :func:`prune_checkpoints`); returns its final path.

    ``policy/`` is a complete HF model directory: the weights and config, the generation config, and (given a
    ``tokenizer``) the tokenizer with its chat template, so ``from_pretrained(policy_dir)`` and
    ``eval.py --model STEP/policy`` need nothing else.

    With an ``accelerator`` every process must call this (DeepSpeed writes one shard per rank); only the main
    process renames and prunes. ``engine``: the learner's training engine, which writes the model's and the
    optimiser's state (None: a plain model in this process, :func:`save_model_state`).
    """
    if keep_last_k < 1:
        raise ValueError("keep_last_k must be >= 1")
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:06d}"
    tmp = _open_tmp_dir(root, step, accelerator)
    is_main = accelerator is None or accelerator.is_main_process
    rank = 0 if accelerator is None else accelerator.process_index
    if engine is not None:
        engine.save_state(tmp, step, model, optimizer, tokenizer, save_policy)
    elif is_main:
        save_model_state(tmp, accelerator.unwrap_model(model) if accelerator is not None else model, optimizer,
                         tokenizer, save_policy)
    if is_main:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        with open(tmp / "trainer_state.json", "w") as f:
            json.dump({"step": step, **trainer_state}, f, default=_json_default)
    torch.save(capture_rng_state(), tmp / f"rng_rank{rank}.pt")
    _barrier(accelerator)
    if is_main:
        _write_atomic(tmp / COMPLETE, _marker_text(step, tmp))
        if final.exists():  # re-saving the same step (e.g. after a resume): move the old one out of the way first
            final.rename(root / f"{_TRASH}{final.name}")
        tmp.rename(final)
        prune_checkpoints(run_dir, keep_last_k, keep_steps)
    _barrier(accelerator)
    return final


def _open_tmp_dir(root: Path, step: int, accelerator: Accelerator | None) -> Path:
    """The checkpoint's temporary directory, made by the main process (leftovers of interrupted saves cleared) and
    verified visible on every rank: on node-local disks a rank would write its shard and RNG file where no one reads
    them, so every rank stops."""
    tmp = root / f".tmp-step_{step:06d}"
    if accelerator is None or accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(root)
        tmp.mkdir(parents=True)
    _barrier(accelerator)
    if accelerator is not None and any_rank(accelerator, not tmp.is_dir()):
        raise OSError(f"checkpoint directory {tmp} made by rank 0 is not visible on every rank (rank "
                      f"{accelerator.process_index}: {'visible' if tmp.is_dir() else 'missing'}): the run directory "
                      f"must be shared by every process (docs/multinode.md)")
    return tmp


def save_model_state(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     tokenizer: Tokenizer | None, save_policy: bool) -> None:
    """The plain model's part of a checkpoint: ``policy/`` (or ``policy_state.pt`` without ``save_policy``) and
    ``optimizer.pt``."""
    if save_policy:
        save_policy_dir(model, directory, tokenizer)
    else:
        torch.save(model.state_dict(), directory / "policy_state.pt")
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")


def save_policy_dir(model: torch.nn.Module, directory: Path, tokenizer: Tokenizer | None,
                    state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """``directory/policy``: the model's ``save_pretrained`` (of ``state_dict`` when given: a gathered one) and the
    tokenizer beside it."""
    model.save_pretrained(directory / "policy", state_dict=state_dict)
    _save_tokenizer(tokenizer, directory / "policy")


def load_model_state(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore what :func:`save_model_state` wrote into the plain ``model`` and ``optimizer``."""
    if (directory / "policy").is_dir():
        load_policy_weights(model, directory / "policy")
    else:
        model.load_state_dict(torch.load(directory / "policy_state.pt", map_location="cpu"))
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=False))


def checkpoint_step(path: str | Path) -> int:
    """``.../step_000010`` -> 10."""
    m = _STEP_DIR.match(Path(path).name)
    if not m:
        raise ValueError(f"{path} is not a checkpoint directory (step_N)")
    return int(m.group(1))


def prune_checkpoints(run_dir: str | Path, keep_last_k: int, keep_steps: Collection[int] = ()) -> list[Path]:
    """Delete every complete checkpoint except the last ``keep_last_k`` and those of ``keep_steps`` (the best
    checkpoint: searchr1_lld/bookkeeping/best_checkpoint.py); main process only. Returns the deleted paths."""
    if keep_last_k < 1:
        raise ValueError("keep_last_k must be >= 1")
    keep = set(keep_steps)
    removed = [old for old in list_checkpoints(run_dir)[:-keep_last_k] if checkpoint_step(old) not in keep]
    for old in removed:
        _remove(old)
    _remove_trash(checkpoint_root(run_dir))
    return removed


def _save_tokenizer(tokenizer: Tokenizer | None, policy_dir: Path) -> None:
    """The tokenizer (its chat template included) beside the weights; nothing without one."""
    if tokenizer is not None:
        tokenizer.save_pretrained(str(policy_dir))


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    with open(part, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    part.rename(path)


def _remove(checkpoint: Path) -> None:
    """Delete a checkpoint so that a kill at any moment leaves no incomplete ``step_*`` directory behind: one atomic
    rename out of the checkpoint namespace first, then the contents."""
    trash = checkpoint.parent / f"{_TRASH}{checkpoint.name}"
    if trash.exists():
        _rmtree(trash)
    checkpoint.rename(trash)
    _rmtree(trash)


def _rmtree(path: Path) -> None:
    """Delete ``path``: its files one at a time (reverse path order), then what is left."""
    for f in sorted((p for p in path.rglob("*") if not p.is_dir()), reverse=True):
        f.unlink()
    shutil.rmtree(path, ignore_errors=True)


def _remove_trash(root: Path) -> None:
    for trash in root.glob(f"{_TRASH}*"):
        _rmtree(trash)


def _finish_interrupted_resave(root: Path) -> None:
    """A complete ``.tmp-step_N`` whose ``step_N`` is missing (killed between the two renames of a re-save) is renamed
    into place. Several processes may race here: a rename that lost the race is fine."""
    if not root.is_dir():
        return
    for tmp in root.glob(f"{_TMP}*"):
        final = root / tmp.name[len(_TMP):]
        if _STEP_DIR.match(final.name) and not final.exists() and incomplete_reason(tmp) is None:
            try:
                tmp.rename(final)
            except OSError:
                pass


def _clean_leftovers(root: Path) -> None:
    """Before a save: finish an interrupted re-save, then delete every other ``.tmp-*`` and ``.trash-*`` directory."""
    _finish_interrupted_resave(root)
    for tmp in root.glob(f"{_TMP}*"):
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_trash(root)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _barrier(accelerator: Accelerator | None) -> None:
    if accelerator is not None:
        accelerator.wait_for_everyone()


def load_policy_weights(model: torch.nn.Module, policy_dir: str | Path) -> None:
    """Load ``save_pretrained`` safetensors into an existing model (strict except for tied weights)."""
    from safetensors.torch import load_file

    policy_dir = Path(policy_dir)
    files = sorted(policy_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {policy_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"checkpoint {policy_dir} has unexpected keys: {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    missing = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    missing = [k for k in missing if k in params]  # buffers (rotary caches) are rebuilt by the model
    if missing:
        raise RuntimeError(f"checkpoint {policy_dir} lacks weights: {missing[:5]}")


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    accelerator: Accelerator | None = None,
    engine: ModelStateStore | None = None,
) -> dict[str, Any]:
    """Restore policy, optimiser (through ``engine``, the training engine that wrote them; None: a plain model,
    :func:`load_model_state`), scheduler and this rank's RNG states; returns the trainer state dict."""
    path = Path(path)
    reason = incomplete_reason(path)
    if reason:
        raise FileNotFoundError(f"{path} is not a complete checkpoint ({reason})")
    rank = 0 if accelerator is None else accelerator.process_index
    if engine is not None:
        engine.load_state(path, model, optimizer)
    else:
        load_model_state(path, accelerator.unwrap_model(model) if accelerator is not None else model, optimizer)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
    rng_file = path / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        restore_rng_state(torch.load(rng_file, map_location="cpu", weights_only=False))
    with open(path / "trainer_state.json") as f:
        return json.load(f)
