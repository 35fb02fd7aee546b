"""Corpus I/O: streaming JSONL reading, checksums, and an on-disk document store.

Corpus format (wiki-18 style): one JSON object per line, ``{"id": str, "contents": "\\"Title\\"\\ntext"}``.
Extra keys are ignored. Rows are read one at a time, so a 21M-passage corpus is never held as Python objects.

The document store (``docs.jsonl`` + ``offsets.npy``) is what serving reads: row ``i`` of the index is the byte
range ``offsets[i]:offsets[i+1]`` of ``docs.jsonl``. ``offsets.npy`` is memory-mapped and the text is read with
``os.pread``, so serving Wikipedia needs ~170 MB of offsets in page cache, not the 14 GB of text in RAM.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "offsets.npy"


class CorpusError(ValueError):
    """The corpus file is missing or has a malformed row (the message names file and line)."""


def file_sha256(path: str | Path, *, show_progress: bool = False, chunk_bytes: int = 1 << 22) -> str:
    """sha256 hex digest of a file, read in chunks."""
    path = Path(path)
    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}",
                                     disable=not show_progress) as bar:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def count_rows(path: str | Path) -> int:
    """Number of non-blank lines (rows) in a JSONL file, counted without parsing."""
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                n += 1
    return n


def iter_corpus(path: str | Path, *, show_progress: bool = False, total: int | None = None) -> Iterator[tuple[str, str]]:
    """Yield ``(id, contents)`` for each row of a JSONL corpus, streaming, with clear errors on bad rows."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    with open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(tqdm(f, total=total, desc=f"read {path.name}", unit="doc",
                                           disable=not show_progress), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or "contents" not in row or "id" not in row:
                raise CorpusError(f"{path}:{lineno}: each row must be an object with 'id' and 'contents'")
            contents = row["contents"]
            if not isinstance(contents, str):
                raise CorpusError(f"{path}:{lineno}: 'contents' must be a string (got {type(contents).__name__})")
            yield str(row["id"]), contents


class DocStoreWriter:
    """Append ``(id, contents)`` rows to ``docs.jsonl`` and record byte offsets; ``close()`` writes ``offsets.npy``.

    Files are written under temporary names and renamed on close, so a crash never leaves a half store that looks
    complete.
    """

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tmp_docs = self.out_dir / (DOCS_FILE + ".tmp")
        self._f = open(self._tmp_docs, "wb")
        self._offsets = array.array("q", [0])  # 8 bytes per row (21M rows = 170 MB), not a list of Python ints
        self._end = 0

    def add(self, doc_id: str, contents: str) -> None:
        line = json.dumps({"id": doc_id, "contents": contents}, ensure_ascii=False).encode("utf-8") + b"\n"
        self._f.write(line)
        self._end += len(line)
        self._offsets.append(self._end)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def close(self) -> None:
        self._f.close()
        tmp_offsets = self.out_dir / (OFFSETS_FILE + ".tmp.npy")
        np.save(tmp_offsets, np.frombuffer(self._offsets, dtype=np.int64))
        os.replace(self._tmp_docs, self.out_dir / DOCS_FILE)
        os.replace(tmp_offsets, self.out_dir / OFFSETS_FILE)


class DocStore:
    """Read-only random access to the documents of an index dir (memory-mapped offsets + ``os.pread``)."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        docs_path, offsets_path = index_dir / DOCS_FILE, index_dir / OFFSETS_FILE
        if not docs_path.is_file() or not offsets_path.is_file():
            raise FileNotFoundError(f"{index_dir}: document store missing ({DOCS_FILE} / {OFFSETS_FILE})")
        self.offsets = np.load(offsets_path, mmap_mode="r")
        self._fd = os.open(docs_path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        if int(self.offsets[-1]) != size:
            raise ValueError(f"{index_dir}: {OFFSETS_FILE} does not match {DOCS_FILE} "
                             f"({int(self.offsets[-1])} != {size} bytes); rebuild the index")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, i: int) -> dict:
        """Row ``i`` as ``{"id", "contents"}``."""
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} out of range [0, {len(self)})")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return json.loads(os.pread(self._fd, end - start, start))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
