"""The trajectories file of an evaluation (append-only, resumable, shardable), its provenance, and the merge of
shards into results."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.bookkeeping.files import write_json_atomic
from searchr1_lld.config import RolloutConfig
from searchr1_lld.evaluation.metrics import (RESULTS_CSV, RESULTS_JSON, RESULTS_MD, TRAJECTORIES, EvalError,
                                             summarize)
from searchr1_lld.evaluation.tables import write_results
from searchr1_lld.data.jsonl import read_jsonl


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a trajectories file; a truncated final line (crash mid-write) is ignored, any other bad line raises."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        return read_jsonl(path, partial_tail=True)
    except ValueError as e:
        raise EvalError(f"corrupt trajectories file: {e}") from None


class TrajectoryLog:
    """Append-only JSONL of evaluation records keyed by (dataset, id); flushed and fsynced after every batch."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records = read_records(self.path)
        self.done: set[tuple[str, str]] = {(r["dataset"], str(r["id"])) for r in records}
        # Drop a partial last line so appends start on a fresh line.
        if self.path.exists():
            text = self.path.read_text()
            if text and not text.endswith("\n"):
                self.path.write_text(text[: text.rfind("\n") + 1])

    def is_done(self, dataset: str, row_id: Any) -> bool:
        return (dataset, str(row_id)) in self.done

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        with open(self.path, "a") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done.update((r["dataset"], str(r["id"])) for r in records)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path)


# Files of a model directory that define its behaviour (hashed in full).
MODEL_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "config.json", "generation_config.json")
# Rollout settings that change what a greedy evaluation produces.
DECODING_KEYS = ("max_turns", "max_tokens_per_turn", "max_obs_length", "max_total_length", "topk")


def sha256_file(path: str | Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_fingerprint(model_path: str | Path) -> dict[str, Any]:
    """``{"model": path or hub id, "weights_sha256": ...}``: SHA-256 over the weight and config files of a local
    model dir (names + contents); a hub id is recorded as it is (its hash is ``None``)."""
    path = Path(model_path)
    if not path.is_dir():
        return {"model": str(model_path), "weights_sha256": None}
    files = sorted({f for pat in MODEL_FILE_PATTERNS for f in path.glob(pat) if f.is_file()})
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return {"model": str(path.resolve()), "weights_sha256": h.hexdigest() if files else None}


def rows_sha256(rows: Sequence[dict[str, Any]]) -> str:
    """Hash of the evaluated rows (ids, questions, gold answers): a rebuilt world or another split changes it."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([str(r["id"]), r["question"], list(r["golden_answers"])], ensure_ascii=False).encode())
    return h.hexdigest()


def eval_provenance(*, model_path: str | Path, tokenizer_path: str | Path, rows_by_dataset: dict[str, Sequence[dict]],
                    rollout_cfg: RolloutConfig, template: str, backend: str, dtype: str, retriever: str) -> dict[str, Any]:
    """Everything that determines an evaluation's records (a JSON-able dict, compared key by key on resume)."""
    return {
        **model_fingerprint(model_path),
        "tokenizer": str(Path(tokenizer_path).resolve()) if Path(tokenizer_path).exists() else str(tokenizer_path),
        "datasets": {name: {"n": len(rows), "rows_sha256": rows_sha256(rows)} for name, rows in rows_by_dataset.items()},
        "decoding": {"greedy": True, "template": template, "backend": backend, "dtype": dtype,
                     **{k: getattr(rollout_cfg, k) for k in DECODING_KEYS}},
        "retriever": retriever,
    }


def provenance_path(out_dir: str | Path, shard: tuple[int, int] | None = None) -> Path:
    traj = trajectories_path(out_dir, shard)
    return traj.with_name(traj.name.removesuffix(".jsonl") + ".provenance.json")


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(old.keys() | new.keys())
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_provenance(out_dir: str | Path, shard: tuple[int, int] | None, provenance: dict[str, Any],
                     overwrite: bool = False) -> None:
    """Refuse to resume a trajectories file written by another model, data or decoding settings.

    Records present and provenance equal: resume. Records present and provenance different (or unknown: a file from
    before provenance was recorded): :class:`EvalError` listing the differences, unless ``overwrite``, which deletes
    the file (and this output's results) and starts over. Then the provenance is written next to the file.
    """
    traj, prov = trajectories_path(out_dir, shard), provenance_path(out_dir, shard)
    if overwrite:
        targets = [traj, prov] + ([] if shard else [Path(out_dir) / n for n in (RESULTS_JSON, RESULTS_MD, RESULTS_CSV)])
        for f in targets:
            f.unlink(missing_ok=True)
    if read_records(traj):
        if not prov.is_file():
            raise EvalError(f"{traj} holds results of an unknown model and settings (no {prov.name}); "
                            "rerun with --overwrite to start over, or pick another --out")
        diffs = _differences(json.loads(prov.read_text()), provenance)
        if diffs:
            raise EvalError(f"{traj} was produced by a different evaluation, refusing to mix results: "
                            + "; ".join(diffs) + ". Rerun with --overwrite to start over, or pick another --out")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(prov, provenance, indent=1, sort_keys=True)


def drop_unused_provenance(out_dir: str | Path, shard: tuple[int, int] | None) -> None:
    """After a failed evaluation: remove the provenance :func:`check_provenance` wrote when no record followed it
    (the run failed before its first question), and ``out_dir`` when that leaves it empty; nothing is left that
    looks like a started evaluation."""
    if read_records(trajectories_path(out_dir, shard)):
        return
    provenance_path(out_dir, shard).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(out_dir).rmdir()  # only when empty


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/k"`` (0 <= i < k) -> (i, k); None -> None."""
    if text is None:
        return None
    try:
        i, k = (int(p) for p in text.split("/"))
    except ValueError:
        raise EvalError(f"--shard must look like i/k (e.g. 0/4), got {text!r}") from None
    if not (k >= 1 and 0 <= i < k):
        raise EvalError(f"--shard {text!r}: need 0 <= i < k")
    return i, k


def shard_rows(rows: Sequence[dict], shard: tuple[int, int] | None) -> list[dict]:
    """Rows i, i+k, i+2k, ... (the k shards partition the rows)."""
    if shard is None:
        return list(rows)
    i, k = shard
    return list(rows[i::k])


def trajectories_path(out_dir: str | Path, shard: tuple[int, int] | None = None) -> Path:
    if shard is None:
        return Path(out_dir) / TRAJECTORIES
    return Path(out_dir) / f"trajectories.shard-{shard[0]}-of-{shard[1]}.jsonl"


def count_pending(rows_by_dataset: dict[str, Sequence[dict[str, Any]]], out_dir: str | Path,
                  shard: tuple[int, int] | None = None) -> int:
    """How many rows (of this shard) are not yet in the trajectories file."""
    path = trajectories_path(out_dir, shard)
    done = {(r["dataset"], str(r["id"])) for r in read_records(path)}
    return sum((d, str(r["id"])) not in done for d, rows in rows_by_dataset.items() for r in shard_rows(rows, shard))


def merge_shards(out_dir: str | Path, order: Sequence[str] | None = None, name: str = "") -> dict[str, Any]:
    """Combine every ``trajectories.shard-*.jsonl`` (and an existing trajectories.jsonl) in ``out_dir`` into
    trajectories.jsonl (one record per (dataset, id)), then write results.json / .md / .csv. Returns the results."""
    out_dir = Path(out_dir)
    shard_files = sorted(out_dir.glob("trajectories.shard-*-of-*.jsonl"))
    if not shard_files and not (out_dir / TRAJECTORIES).exists():
        raise EvalError(f"no trajectories or shard files in {out_dir}")
    counts = {int(p.name.split("-of-")[1].split(".")[0]) for p in shard_files}
    if len(counts) > 1:
        raise EvalError(f"shard files in {out_dir} disagree on the shard count: {sorted(counts)}")
    _merge_provenance(out_dir, shard_files)
    log = TrajectoryLog(out_dir / TRAJECTORIES)
    for p in shard_files:
        log.append([r for r in read_records(p) if not log.is_done(r["dataset"], r["id"])])
    return finalize(out_dir, order=order, name=name)


def _merge_provenance(out_dir: Path, shard_files: Sequence[Path]) -> None:
    """All shards (and an existing merged file) must come from the same evaluation; the merged file gets it too."""
    provs = {}
    for p in list(shard_files) + [out_dir / TRAJECTORIES]:
        prov = p.with_name(p.name.removesuffix(".jsonl") + ".provenance.json")
        if prov.is_file():
            provs[p.name] = json.loads(prov.read_text())
    if not provs:
        return
    first_name, first = next(iter(provs.items()))
    for name, prov in provs.items():
        diffs = _differences(first, prov)
        if diffs:
            raise EvalError(f"{first_name} and {name} in {out_dir} come from different evaluations: " + "; ".join(diffs))
    provenance_path(out_dir).write_text(json.dumps(first, indent=1, sort_keys=True) + "\n")


def finalize(out_dir: str | Path, order: Sequence[str] | None = None, name: str = "") -> dict[str, Any]:
    """Recount everything from trajectories.jsonl and write results.json / results.md / results.csv."""
    out_dir = Path(out_dir)
    records = read_records(out_dir / TRAJECTORIES)
    if not records:
        raise EvalError(f"{out_dir / TRAJECTORIES} has no records")
    results = summarize(records, order=order, name=name or out_dir.name)
    write_results(out_dir, results)
    return results
