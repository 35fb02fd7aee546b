"""Small JSON records written whole or not at all (run records, cards, provenance, the best checkpoint's record)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | Path, obj: Any, *, indent: int = 2, sort_keys: bool = False) -> Path:
    """Write ``obj`` as JSON (``indent``, ``sort_keys``, a trailing newline) to ``path`` atomically: to a temporary
    file beside it named by this process, flushed to disk (``fsync``, as the checkpoint writer does: a machine that
    goes down after the move finds the new record, not an empty file), then moved over ``path``. A write cut off
    leaves the earlier file or none; two processes writing the same path at once each move a whole file (the last one
    wins). Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path
