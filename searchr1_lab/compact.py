"""The lab's compact results: one small gzipped JSON file per finished run (and one for the baselines) under
``docs/lab/runs/``, from which the report and every figure quoted from it are rebuilt (:mod:`.claims`).

A run's file holds its identity (method, seed, learning rate), the per-step series the phase detector reads (reward,
likelihood of correct responses, probe set, gradient norm, entropy, valid searches) and the validation curve, and
its test result question by question (the bootstrap resamples the questions' subjects, which the baselines' file
records per question). Written once, when the run has finished.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
from pathlib import Path
from typing import Any

from searchr1_lab.methods import Method

BASELINES_FILE = "baselines.json.gz"
SERIES_KEYS = ("reward/em_mean", "lld/correct_logp_old_per_token", "lld/incorrect_logp_old_per_token",
               "probe/logp_per_token", "probe/initial_logp_per_token", "actor/grad_norm", "actor/grad_norm_signal",
               "adv/nonzero_frac", "actor/entropy", "rollout/valid_searches_mean", "eval/val_em", "lld/step_kl",
               "eval/val_sub_em", "actor/lr", "step_size/lr_multiplier", "step_size/target_kl")


def lr_tag(lr: float) -> str:
    """``5e-4`` -> ``"0.0005"``: how a learning rate names its runs and directories."""
    return f"{lr:g}"


def compact_name(method: str, lr: float, seed: int) -> str:
    return f"{method}-lr{lr_tag(lr)}-seed{seed}.json.gz"


def write_gz_json(path: str | Path, obj: Any) -> None:
    """Gzipped JSON, byte-identical for the same object (no name or timestamp in the gzip header), written
    atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
        f.write(data)
    tmp.replace(path)


def read_gz_json(path: str | Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _round(x: Any) -> Any:
    """A float to 5 significant digits (NaN / inf as None), other values as they are."""
    if isinstance(x, float):
        return float(f"{x:.5g}") if math.isfinite(x) else None
    return x


def compact_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: ``step`` and the :data:`SERIES_KEYS` it logged (rounded)."""
    return [{"step": int(r["step"]), **{k: _round(r[k]) for k in SERIES_KEYS if k in r}} for r in records]


def git_commit(cwd: str | Path) -> dict[str, Any]:
    """The commit the working tree at ``cwd`` is at and whether its tracked files differ from it (what a run
    records of the code it ran); ``{"commit": None, ...}`` outside a git checkout."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                           text=True)
    return {"commit": head.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}


def run_record(method: Method, seed: int, lr: float, lab_run: dict[str, Any], records: list[dict[str, Any]],
               test_correct: dict[str, int], world_hash: str | None, code: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """The compact record of one finished run: ``lab_run`` is its lab_run.json, ``records`` its metrics.jsonl,
    ``test_correct`` its greedy test EM per question id, ``code`` the commit it ran (:func:`git_commit`)."""
    ev = lab_run["eval"]
    return {
        "method": method.key, "label": method.label, "overrides": list(method.overrides), "seed": seed, "lr": lr,
        "steps": lab_run["steps"],
        "world_hash": world_hash, "settings": lab_run.get("settings"), "code": code,
        "records": compact_records(records),
        "test": {"em": ev["em"], "em_single_hop": ev.get("em_single_hop"), "em_multi_hop": ev.get("em_multi_hop"),
                 "mean_valid_searches": ev.get("mean_valid_searches"), "correct": test_correct},
        "train_s": lab_run.get("train_s"), "eval_s": lab_run.get("eval_s"),
    }


def read_runs(runs_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every compact run file in ``runs_dir`` (sorted by name) and the baselines file (None when absent)."""
    runs_dir = Path(runs_dir)
    runs = [read_gz_json(p) for p in sorted(runs_dir.glob("*.json.gz")) if p.name != BASELINES_FILE]
    base = runs_dir / BASELINES_FILE
    return runs, (read_gz_json(base) if base.is_file() else None)
