"""The one reader of the project's row files: JSONL (one JSON object a line) and parquet.

``read_jsonl``: every non-blank line is a JSON value; a bad line raises ``ValueError("path:line: ...")``, except a
bad *last* line when ``partial_tail=True`` (a file another process is still appending to, or a crash mid-write:
that line is dropped). ``read_rows``: QA rows (JSONL or parquet) with the project schema checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QA_KEYS = ("id", "question", "golden_answers")


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
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({e.msg})") from None
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """QA rows from a JSONL or parquet file (project schema: id, question, golden_answers, data_source)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"rows file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        rows = read_jsonl(path)
    for r in rows:
        missing = [k for k in QA_KEYS if k not in r]
        if missing:
            raise ValueError(f"{path}: row {r.get('id')!r} lacks {missing}")
    return rows


def read_rows_files(paths: list[str]) -> list[dict]:
    """The rows of JSONL/parquet files, in order; a missing file is an error naming it."""
    rows: list[dict] = []
    for f in paths:
        if not Path(f).is_file():
            raise FileNotFoundError(f"rows file {f} not found")
        rows += read_rows(f)
    return rows
