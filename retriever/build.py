"""Index build, whatever the kind (retriever/kinds/: e5 + FAISS, BM25): checksum + count the corpus -> skip the build
if the dir's manifest already records the same corpus and settings -> the kind writes the doc store and its files
-> hash every file the index is served from -> write the manifest (the dir's layout and the manifest:
retriever/layout.py, retriever/manifest.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from retriever.corpus import DOCS_FILE, OFFSETS_FILE, count_rows, file_sha256
from retriever.kinds import CorpusFacts, IndexKind, KindName, kind_named, settings_for
from retriever.layout import FORMAT_VERSION, MANIFEST_FILE, write_json_atomic
from retriever.manifest import file_checksums


def build_index(corpus_path: str | Path, out_dir: str | Path, *, retriever: KindName = "e5",
                show_progress: bool = True, **settings: Any) -> Path:
    """Build a retriever index dir from a JSONL corpus; returns the dir (with ``manifest.json``).

    ``settings``: the kind's build settings by name, the fields of its settings dataclass
    (:class:`~retriever.kinds.dense.DenseSettings`: ``encoder``, ``index_type``, ``devices``, ``shard_size``, ...;
    :class:`~retriever.kinds.bm25.BM25Settings`: ``bm25_k1``, ``bm25_b``); another kind's settings are ignored.
    Rebuilding into a dir whose manifest already matches (same corpus checksum and settings) returns at once; an
    interrupted e5 build resumes from its complete embedding shards.
    """
    kind = kind_named(retriever)
    options = settings_for(kind, settings)
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if not corpus_path.is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    corpus = _corpus_facts(corpus_path, show_progress=show_progress)
    options = kind.prepare(options, corpus.num_rows)
    recorded = {"retriever": kind.name, "corpus_sha256": corpus.sha256, "num_docs": corpus.num_rows,
                **kind.manifest_settings(options)}
    if _already_built(out_dir, kind, recorded, show_progress=show_progress):
        return out_dir
    manifest: dict[str, Any] = {"format_version": FORMAT_VERSION, **recorded, "corpus_path": str(corpus_path.resolve()),
                                "created_unix": int(time.time())}
    manifest.update(kind.build(corpus, out_dir, options, show_progress=show_progress))
    manifest["files"].update(docs=DOCS_FILE, offsets=OFFSETS_FILE)
    manifest["checksums"] = file_checksums(out_dir, kind.name, show_progress=show_progress)
    manifest["build_seconds"] = round(time.time() - t0, 2)
    write_json_atomic(out_dir / MANIFEST_FILE, manifest)
    if show_progress:
        encoder = f" (encoder {manifest['encoder']})" if manifest.get("encoder") else ""
        print(f"[retriever] built {kind.name} index{encoder} of {corpus.num_rows} docs in {out_dir} "
              f"({manifest['build_seconds']} s)", flush=True)
    return out_dir


def _corpus_facts(corpus_path: Path, *, show_progress: bool) -> CorpusFacts:
    """The corpus's sha256 and row count (ValueError for an empty corpus)."""
    sha = file_sha256(corpus_path, show_progress=show_progress)
    num_rows = count_rows(corpus_path)
    if num_rows == 0:
        raise ValueError(f"corpus {corpus_path} has no rows")
    return CorpusFacts(corpus_path, sha, num_rows)


def _already_built(out_dir: Path, kind: IndexKind, recorded: dict[str, Any], *, show_progress: bool) -> bool:
    """True if ``out_dir``'s manifest already records ``recorded`` (checksums are added to one built before they were
    recorded); otherwise its manifest, if any, is removed: it is about to describe other files."""
    manifest_path = out_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        return False
    try:
        old = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        old = {}
    if all(old.get(k) == v for k, v in recorded.items()):
        if "checksums" not in old:  # built before checksums were recorded: record them for the files as they are
            old["checksums"] = file_checksums(out_dir, kind.name, show_progress=show_progress)
            write_json_atomic(manifest_path, old)
        if show_progress:
            print(f"[retriever] {out_dir} already holds this index; nothing to do", flush=True)
        return True
    manifest_path.unlink()  # about to be rebuilt; never leave a manifest describing other files
    return False
