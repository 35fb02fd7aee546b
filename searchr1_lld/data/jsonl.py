"""The one reader of the project's row files: JSONL (one JSON object a line) and parquet.

``read_jsonl``: every non-blank line is a JSON value; a bad line raises ``DataFileError("path:line: ...")``, except
a bad *last* line when ``partial_tail=True`` (a file another process is still appending to, or a crash mid-write:
that line is dropped). ``read_rows``: QA rows (JSONL or parquet) with the project schema checked; Search-R1's own
data files are read as they are (:func:`from_search_r1`). A file that is not what its reader expects is a
:class:`DataFileError` naming the file (and the line), a mistake the user fixes (the entry points print it as one
line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QA_KEYS = ("id", "question", "golden_answers")


class DataFileError(ValueError):
    """A data file that is not what its reader expects (not JSON lines, not parquet, rows without the QA keys); the
    message names the file and, for JSONL, the line."""


def read_jsonl(path: str | Path, *, partial_tail: bool = False) -> list[Any]:
    """The values of a JSONL file, in order (see the module docstring for ``partial_tail``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    lines = path.read_text(encoding="utf-8").split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if partial_tail and i == len(lines) - 1:  # no newline after it: a partial write
                break
            raise DataFileError(f"{path}:{i + 1}: not valid JSON ({e.msg})") from None
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """QA rows from a JSONL or parquet file: the project's schema (id, question, golden_answers, data_source), which
    FlashRAG's files share, or Search-R1's (its data scripts' ``train.parquet`` / ``test.parquet``), taken as the
    project's by :func:`from_search_r1`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"rows file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except pyarrow.ArrowException as e:
            raise DataFileError(f"{path}: not a readable parquet file ({e})") from None
    else:
        rows = read_jsonl(path)
    not_objects = [i + 1 for i, r in enumerate(rows) if not isinstance(r, dict)]
    if not_objects:
        raise DataFileError(f"{path}: row {not_objects[0]} is not a JSON object; QA rows are objects with keys "
                            f"{', '.join(QA_KEYS)}")
    rows = [from_search_r1(r, i, path.stem) for i, r in enumerate(rows)]
    for r in rows:
        missing = [k for k in QA_KEYS if k not in r]
        if missing:
            raise DataFileError(f"{path}: row {r.get('id')!r} lacks {missing}")
    return rows


def from_search_r1(row: dict, index: int, source: str) -> dict:
    """A row in Search-R1's schema as a project row; other rows unchanged.

    Search-R1's rows carry the golden answers in ``reward_model.ground_truth.target`` (FlashRAG's ``golden_answers``
    column is kept only by some of its scripts) and their position in ``extra_info.{split,index}``; the stored
    ``prompt`` (its instruction, chat-formatted) is never used: the prompt is rebuilt from ``question`` and
    ``data.prompt_template``. Missing ``golden_answers`` <- the target; missing ``id`` <- ``<data_source>-<split>-
    <index>`` (else ``<source>-<index>``, ``source`` = the file's stem)."""
    out = dict(row)
    target = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if "golden_answers" not in out and target is not None:
        out["golden_answers"] = [target] if isinstance(target, str) else list(target)
    if "id" not in out and ("golden_answers" in out and "question" in out):
        extra = row.get("extra_info") or {}
        parts = [row.get("data_source"), extra.get("split"), extra.get("index")]
        out["id"] = "-".join(str(p) for p in parts) if all(p is not None for p in parts) else f"{source}-{index}"
    return out


def read_rows_files(paths: list[str]) -> list[dict]:
    """The rows of JSONL/parquet files, in order (:func:`read_rows` each: a missing file is an error naming it)."""
    return [row for f in paths for row in read_rows(f)]
