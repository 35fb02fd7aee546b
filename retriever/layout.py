"""What every index dir holds, whatever its kind: the manifest's name and format version, the errors raised when a dir
is not the one the build wrote, and the atomic JSON write the build finishes with.

An index dir holds

    manifest.json        what was built from what (written last: its presence means the build finished)
    docs.jsonl, offsets.npy   the documents, random access by row (see corpus.DocStore)

and the files of its kind (``retriever/kinds/``): ``index.faiss`` and ``embeddings/`` for a dense index
(``retriever=e5``), ``bm25/`` for a BM25 one. Reading and checking the manifest: retriever/manifest.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


class IndexMismatchError(ValueError):
    """The index dir does not match what the caller expects (encoder, corpus) or is internally inconsistent."""


class IndexIntegrityError(IndexMismatchError):
    """A file of the index dir is not the one the build wrote (size or sha256 differs); the message names it."""


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)
