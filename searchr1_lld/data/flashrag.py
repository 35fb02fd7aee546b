"""FlashRAG benchmark preparation: the paper's training mixes and seven evaluation sets in the project row schema.

Source: the FlashRAG collection on the HF hub, ``datasets.load_dataset("RUC-NLPIR/FlashRAG_datasets", name,
split=...)``, or -- for offline users -- a local mirror of FlashRAG-format files laid out as
``<local_dir>/<name>/<split>.jsonl`` (or ``.parquet``), rows ``{"id", "question", "golden_answers", ...}``.
``local_dir`` defaults to the environment variable ``FLASHRAG_LOCAL_DIR`` when set.

Row schema (training and evaluation alike)::

    {"id": str, "question": str (normalised: stripped, ends with "?"), "golden_answers": [str, ...],
     "data_source": name, "metadata": {"split": split, "source_metadata": <the FlashRAG row's metadata or null>}}

Splits: training = ``train`` of nq (mix ``nq``) or nq + hotpotqa (mix ``nq+hotpotqa``); evaluation = ``test`` if the
dataset has one, else ``dev`` (nq/triviaqa/popqa/bamboogle: test; hotpotqa/2wikimultihopqa/musique: dev).

CLI::

    python -m searchr1_lld.data.flashrag --out DIR [--local-dir DIR] [--datasets nq hotpotqa ...] [--train-mix nq+hotpotqa]
           [--format jsonl|parquet]

writes ``DIR/train/<name>.<fmt>`` per training set of the mix (``nq+hotpotqa``: ``train/nq`` and ``train/hotpotqa``;
the mix ``nq`` is the first file alone), ``DIR/test/<name>.<fmt>`` per evaluation set and ``DIR/data_card.json``
(counts per source/split, date, the hub dataset's revision). ``train.py`` reads them with ``data.source: files`` and
``data.train_files`` (the paper configs name ``data/flashrag/train/*.jsonl``), ``eval.py`` with ``--data FILE ...`` or
``eval.datasets: [NAME=PATH, ...]`` (the paper configs name ``data/flashrag/test/<name>.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.data.prompts import normalize_question

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
EVAL_DATASETS = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
TRAIN_MIXES = {"nq": ["nq"], "nq+hotpotqa": ["nq", "hotpotqa"]}
# The split each evaluation set is scored on (test if the dataset has one, else dev), as FlashRAG ships them.
EVAL_SPLITS = {"nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev", "2wikimultihopqa": "dev",
               "musique": "dev", "bamboogle": "test"}
EXPECTED_EVAL_COUNTS = {"nq": 3610, "triviaqa": 11313, "popqa": 14267, "hotpotqa": 7405, "2wikimultihopqa": 12576,
                        "musique": 2417, "bamboogle": 125}
LOCAL_DIR_ENV = "FLASHRAG_LOCAL_DIR"


class FlashRAGError(ValueError):
    """Bad input data or an unavailable dataset/split; the message names the dataset, split and row."""


# ----------------------------------------------------------------------------------------------------------------
# Conversion
# ----------------------------------------------------------------------------------------------------------------


def to_row(raw: dict[str, Any], data_source: str, split: str, index: int) -> dict[str, Any]:
    """One FlashRAG row -> the project schema (question normalised, answers a non-empty list of strings)."""
    where = f"{data_source}/{split} row {index}"
    if not isinstance(raw, dict):
        raise FlashRAGError(f"{where}: expected a mapping, got {type(raw).__name__}")
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise FlashRAGError(f"{where}: missing or empty 'question'")
    golds = raw.get("golden_answers")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, (list, tuple)) or not golds:
        raise FlashRAGError(f"{where}: 'golden_answers' must be a non-empty list of strings (got {golds!r})")
    golds = [str(g) for g in golds if g is not None and str(g).strip()]
    if not golds:
        raise FlashRAGError(f"{where}: 'golden_answers' has no non-empty answer")
    row_id = raw.get("id")
    row_id = f"{split}_{index}" if row_id is None or str(row_id) == "" else str(row_id)
    meta = raw.get("metadata")
    return {
        "id": row_id,
        "question": normalize_question(question),
        "golden_answers": golds,
        "data_source": data_source,
        "metadata": {"split": split, "source_metadata": meta if isinstance(meta, (dict, list)) or meta is None
                     else str(meta)},
    }


def convert(raws: Iterable[dict[str, Any]], data_source: str, split: str) -> list[dict[str, Any]]:
    rows = [to_row(r, data_source, split, i) for i, r in enumerate(raws)]
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise FlashRAGError(f"{data_source}/{split}: row ids are not unique")
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Sources: local FlashRAG-format files or the hub
# ----------------------------------------------------------------------------------------------------------------


def _resolve_local_dir(local_dir: Optional[str | Path]) -> Optional[Path]:
    if local_dir is None and os.environ.get(LOCAL_DIR_ENV):
        local_dir = os.environ[LOCAL_DIR_ENV]
    return Path(local_dir) if local_dir is not None else None


def _local_file(local_dir: Path, name: str, split: str) -> Optional[Path]:
    for ext in ("jsonl", "json", "parquet"):
        p = local_dir / name / f"{split}.{ext}"
        if p.is_file():
            return p
    return None


def local_splits(local_dir: str | Path, name: str) -> list[str]:
    d = Path(local_dir) / name
    return sorted({p.stem for p in d.glob("*") if p.suffix in (".jsonl", ".json", ".parquet")}) if d.is_dir() else []


def _read_local(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    try:
        return read_jsonl(path)
    except ValueError as e:
        raise FlashRAGError(str(e)) from None


def hub_splits(name: str, repo: str = HUB_REPO) -> list[str]:
    """Split names of ``name`` on the hub (needs network)."""
    from datasets import get_dataset_split_names

    return list(get_dataset_split_names(repo, name))


def resolve_eval_split(name: str, available: Optional[list[str]] = None) -> str:
    """test if available else dev; with ``available=None`` the known FlashRAG split of ``name``."""
    if available is None:
        if name not in EVAL_SPLITS:
            raise FlashRAGError(f"unknown dataset {name!r}; known: {EVAL_DATASETS} (or pass the split)")
        return EVAL_SPLITS[name]
    for split in ("test", "dev"):
        if split in available:
            return split
    raise FlashRAGError(f"{name}: neither a test nor a dev split (available: {available})")


def load_split(name: str, split: str, *, local_dir: Optional[str | Path] = None, repo: str = HUB_REPO,
               revision: Optional[str] = None) -> list[dict[str, Any]]:
    """Rows of one dataset split in the project schema, from ``local_dir`` if given (or $FLASHRAG_LOCAL_DIR),
    else from the hub via ``datasets.load_dataset(repo, name, split=split)``."""
    local = _resolve_local_dir(local_dir)
    if local is not None:
        path = _local_file(local, name, split)
        if path is None:
            raise FlashRAGError(f"{name}/{split}: no {local}/{name}/{split}.jsonl (or .parquet); "
                                f"available splits there: {local_splits(local, name) or 'none'}")
        return convert(_read_local(path), name, split)
    from datasets import load_dataset

    try:
        ds = load_dataset(repo, name, split=split, revision=revision)
    except Exception as e:  # offline, unknown config, missing split: say which and how to work offline
        raise FlashRAGError(f"cannot load {repo} config {name!r} split {split!r} from the hub ({type(e).__name__}: "
                            f"{e}). Offline? Mirror the FlashRAG files as <dir>/{name}/{split}.jsonl and pass "
                            f"<dir> as the local mirror (eval.py --flashrag-dir, python -m searchr1_lld.data.flashrag --local-dir; "
                            f"or set {LOCAL_DIR_ENV})") from e
    return convert(ds, name, split)


def load_eval_rows(name: str, split: Optional[str] = None, *, local_dir: Optional[str | Path] = None,
                   repo: str = HUB_REPO, revision: Optional[str] = None) -> list[dict[str, Any]]:
    """An evaluation set (split = test if it exists else dev, unless given)."""
    if split is None:
        local = _resolve_local_dir(local_dir)
        split = resolve_eval_split(name, local_splits(local, name) if local is not None else None)
    return load_split(name, split, local_dir=local_dir, repo=repo, revision=revision)


def load_train_rows(train_mix: str = "nq", *, local_dir: Optional[str | Path] = None, repo: str = HUB_REPO,
                    revision: Optional[str] = None) -> list[dict[str, Any]]:
    """The training mix: ``nq`` (nq train) or ``nq+hotpotqa`` (nq train followed by hotpotqa train)."""
    if train_mix not in TRAIN_MIXES:
        raise FlashRAGError(f"unknown train mix {train_mix!r}; expected one of {sorted(TRAIN_MIXES)}")
    rows: list[dict[str, Any]] = []
    for name in TRAIN_MIXES[train_mix]:
        rows += load_split(name, "train", local_dir=local_dir, repo=repo, revision=revision)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------------


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """JSONL (metadata as an object) or parquet (metadata as a JSON string column, since sources differ)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({
            "id": [r["id"] for r in rows], "question": [r["question"] for r in rows],
            "golden_answers": [r["golden_answers"] for r in rows], "data_source": [r["data_source"] for r in rows],
            "metadata": [json.dumps(r.get("metadata"), ensure_ascii=False) for r in rows],
        }, schema=pa.schema([("id", pa.string()), ("question", pa.string()),
                             ("golden_answers", pa.list_(pa.string())), ("data_source", pa.string()),
                             ("metadata", pa.string())]))
        pq.write_table(table, tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read project-schema rows written by :func:`write_rows` (JSONL or parquet; metadata back as an object)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"rows file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        for r in rows:
            if isinstance(r.get("metadata"), str):
                r["metadata"] = json.loads(r["metadata"])
        return rows
    return read_jsonl(path)


def hub_revision(repo: str = HUB_REPO) -> Optional[str]:
    """The commit the hub's dataset ``repo`` is at now (None when the hub cannot be asked: offline)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(repo).sha
    except Exception:  # offline or no such repo: the loads that follow say which
        return None


def prepare(out_dir: str | Path, *, local_dir: Optional[str | Path] = None, datasets: Optional[list[str]] = None,
            train_mix: Optional[str] = "nq", fmt: str = "jsonl", repo: str = HUB_REPO,
            revision: Optional[str] = None, progress: bool = True) -> dict[str, Any]:
    """Write the training mix and the evaluation sets under ``out_dir`` plus ``data_card.json``; return the card."""
    from tqdm.auto import tqdm

    if fmt not in ("jsonl", "parquet"):
        raise FlashRAGError(f"format must be jsonl or parquet (got {fmt!r})")
    datasets = list(EVAL_DATASETS if datasets is None else datasets)
    unknown = [d for d in datasets if d not in EVAL_SPLITS]
    if unknown:
        raise FlashRAGError(f"unknown dataset(s) {unknown}; known: {EVAL_DATASETS}")
    out_dir = Path(out_dir)
    local = _resolve_local_dir(local_dir)
    if local is None and revision is None:
        revision = hub_revision(repo)  # pinned: every split comes from the commit the card records
    counts: dict[str, dict[str, int]] = {}
    files: dict[str, str] = {}
    jobs = (["train"] if train_mix else []) + datasets
    for job in tqdm(jobs, desc="flashrag", disable=not progress):
        if job == "train":
            if train_mix not in TRAIN_MIXES:
                raise FlashRAGError(f"unknown train mix {train_mix!r}; expected one of {sorted(TRAIN_MIXES)}")
            for name in TRAIN_MIXES[train_mix]:
                rows = load_split(name, "train", local_dir=local, repo=repo, revision=revision)
                counts.setdefault(name, {})["train"] = len(rows)
                files[f"train/{name}"] = str(write_rows(rows, out_dir / "train" / f"{name}.{fmt}").relative_to(out_dir))
        else:
            rows = load_eval_rows(job, local_dir=local, repo=repo, revision=revision)
            split = rows[0]["metadata"]["split"] if rows else resolve_eval_split(job)
            counts.setdefault(job, {})[split] = len(rows)
            files[f"test/{job}"] = str(write_rows(rows, out_dir / "test" / f"{job}.{fmt}").relative_to(out_dir))
    card = {
        "source": repo if local is None else "local FlashRAG-format files",
        "source_revision": f"local:{local.resolve()}" if local is not None else f"{repo}@{revision or 'unknown'}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "train_mix": train_mix,
        "eval_datasets": datasets,
        "eval_splits": {d: next(iter(counts.get(d, {"?": 0}))) for d in datasets},
        "counts": counts,
        "expected_eval_counts": {d: EXPECTED_EVAL_COUNTS[d] for d in datasets},
        "format": fmt,
        "files": files,
        "schema": ["id", "question", "golden_answers", "data_source", "metadata"],
    }
    tmp = out_dir / "data_card.json.tmp"
    tmp.write_text(json.dumps(card, indent=2) + "\n")
    os.replace(tmp, out_dir / "data_card.json")
    return card


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lld.data.flashrag", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--local-dir", default=None, help=f"FlashRAG-format mirror <dir>/<name>/<split>.jsonl "
                                                     f"(default ${LOCAL_DIR_ENV}; unset = the HF hub)")
    p.add_argument("--datasets", nargs="*", default=None, help=f"evaluation sets (default: all of {EVAL_DATASETS})")
    p.add_argument("--train-mix", default="nq", help="nq | nq+hotpotqa | none")
    p.add_argument("--format", default="jsonl", choices=["jsonl", "parquet"])
    p.add_argument("--revision", default=None, help="hub dataset revision (commit/tag)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    try:
        card = prepare(args.out, local_dir=args.local_dir, datasets=args.datasets,
                       train_mix=None if args.train_mix == "none" else args.train_mix, fmt=args.format,
                       revision=args.revision, progress=not args.quiet)
    except FlashRAGError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"counts": card["counts"], "files": card["files"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
