"""The retriever kinds, registered by the name an index's manifest records as ``retriever``: ``e5`` (dense: an
encoder + FAISS; retriever/kinds/dense.py) and ``bm25`` (bm25s; retriever/kinds/bm25.py). Whatever differs between
kinds is asked of the kind (:class:`~retriever.kinds.base.IndexKind`); a new kind is one module and one entry in
:data:`KINDS` (and :data:`KindName`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from retriever.kinds.base import CorpusFacts, IndexKind, OpenOptions, SearchBackend, UsageError
from retriever.kinds.bm25 import BM25Kind
from retriever.kinds.dense import DenseKind
from retriever.layout import IndexMismatchError

__all__ = ["KINDS", "KindName", "CorpusFacts", "IndexKind", "OpenOptions", "SearchBackend", "UsageError",
           "kind_if_known", "kind_named", "kind_of_manifest", "settings_for"]

KINDS: dict[str, IndexKind] = {kind.name: kind for kind in (DenseKind(), BM25Kind())}
KindName = Literal["e5", "bm25"]  # the names of KINDS, as a config type (a config loader checks it)


def kind_named(name: str) -> IndexKind:
    """The kind registered as ``name`` (ValueError naming the kinds there are)."""
    if name not in KINDS:
        raise ValueError(f"retriever must be {' or '.join(repr(k) for k in KINDS)} (got {name!r})")
    return KINDS[name]


def kind_if_known(manifest: dict) -> IndexKind | None:
    """The kind the manifest names as ``retriever``, None if no registered kind has that name."""
    name = manifest.get("retriever")
    return KINDS.get(name) if isinstance(name, str) else None


def kind_of_manifest(manifest: dict, where: str) -> IndexKind:
    """The kind of the index whose manifest is ``manifest`` (IndexMismatchError for a kind this code lacks)."""
    kind = kind_if_known(manifest)
    if kind is None:
        raise IndexMismatchError(f"{where}: retriever {manifest.get('retriever')!r} is none of the kinds this code "
                                 f"reads ({', '.join(KINDS)}); rebuild the index")
    return kind


def settings_for(kind: IndexKind, named: dict[str, Any]) -> Any:
    """``kind``'s settings dataclass from settings by name. Names of the other kinds' settings are left out (one
    call can name the settings of every kind); a name no kind has is a TypeError."""
    own = {f.name for f in fields(kind.settings_type)}
    known = {f.name for k in KINDS.values() for f in fields(k.settings_type)}
    unknown = sorted(set(named) - known)
    if unknown:
        raise TypeError(f"unknown build setting(s) {unknown}; the kinds' settings are {sorted(known)}")
    return kind.settings_type(**{k: v for k, v in named.items() if k in own})
