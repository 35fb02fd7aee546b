"""An index dir's manifest: reading it, and checking that the dir is the one the build wrote and the one the caller
expects (the layout: retriever/layout.py; the files and manifest keys of each kind: retriever/kinds/).

Integrity: the manifest records the size and sha256 of every served file: ``docs.jsonl``, ``offsets.npy`` and the
files of the index's kind (``index.faiss``; the ``bm25/`` files). Loading checks the sizes always and the hashes
unless ``skip_verify`` (a flipped byte or a file swapped in from another build fails with an error naming the file,
instead of serving wrong passages). sha256 runs at ~380 MB/s on one core here
(``benchmarks/bench_retriever_build.py``, ``RESULT index_verify_mb_per_s``): seconds for a small index, ~3 minutes
for wiki-18's 64.6 GB Flat index at every start; ``skip_verify`` (``--skip-verify``) saves that time and keeps only
the size check, at the cost of not noticing a damaged or same-size swapped file.
"""

from __future__ import annotations

import json
from pathlib import Path

from retriever.corpus import DOCS_FILE, OFFSETS_FILE, count_rows, file_sha256
from retriever.kinds import kind_if_known, kind_named
from retriever.layout import FORMAT_VERSION, MANIFEST_FILE, IndexIntegrityError, IndexMismatchError

REQUIRED_KEYS = ("format_version", "retriever", "num_docs", "corpus_sha256", "files")  # a kind requires its own too


def read_manifest(index_dir: str | Path) -> dict:
    """The index dir's manifest, with errors that name the file and the key (never a raw JSONDecodeError/KeyError)."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise FileNotFoundError(f"index dir {index_dir} does not exist; build one with `python -m retriever build "
                                "--corpus CORPUS.jsonl --out DIR` (see README: the retriever as a standalone service)")
    path = index_dir / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir}: no {MANIFEST_FILE}; not an index dir or the build did not finish "
                                "(run `python -m retriever build ...`)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexMismatchError(f"{path} is not valid JSON ({e}); the file is damaged: rebuild the index") from None
    if not isinstance(manifest, dict):
        raise IndexMismatchError(f"{path} must hold a JSON object (got {type(manifest).__name__}); rebuild the index")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexMismatchError(f"{path}: format_version {manifest.get('format_version')!r}, this code reads "
                                 f"{FORMAT_VERSION}; rebuild the index")
    kind = kind_if_known(manifest)
    keys = REQUIRED_KEYS + (kind.manifest_keys if kind else ())
    missing = [k for k in keys if k not in manifest]
    if missing:
        raise IndexMismatchError(f"{path} lacks key(s) {missing}; the manifest is damaged or from another tool: "
                                 "rebuild the index")
    return manifest


def served_files(index_dir: Path, retriever: str) -> list[Path]:
    """The files a search reads (what the manifest's checksums cover)."""
    return [index_dir / DOCS_FILE, index_dir / OFFSETS_FILE, *kind_named(retriever).served_files(index_dir)]


def file_checksums(index_dir: Path, retriever: str, *, show_progress: bool = False) -> dict[str, dict]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every served file."""
    return {str(p.relative_to(index_dir)): {"bytes": p.stat().st_size, "sha256": file_sha256(p, show_progress=show_progress)}
            for p in served_files(index_dir, retriever)}


def verify_files(index_dir: str | Path, manifest: dict, *, skip_hash: bool = False,
                 show_progress: bool = False) -> str:
    """Check every served file against the manifest's sizes and (unless ``skip_hash``) sha256.

    Returns what was checked: ``"sha256"``, ``"size"`` or ``"none"`` (an index built before checksums were
    recorded: a warning says so). Raises IndexIntegrityError naming the first file that differs.
    """
    index_dir = Path(index_dir)
    sums = manifest.get("checksums")
    if not sums:
        print(f"[retriever] warning: {index_dir} was built without file checksums; its files cannot be verified "
              "(rebuild it to record them)", flush=True)
        return "none"
    for rel, want in sums.items():
        path = index_dir / rel
        if not path.is_file():
            raise IndexIntegrityError(f"{path} is missing (listed in {index_dir / MANIFEST_FILE}); rebuild the index")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise IndexIntegrityError(f"{path} has {size} bytes, the build wrote {want['bytes']}: the file is "
                                      "truncated, damaged or from another build; rebuild the index")
    if skip_hash:
        return "size"
    for rel, want in sums.items():  # a progress bar only where hashing takes a while
        digest = file_sha256(index_dir / rel, show_progress=show_progress and want["bytes"] > (256 << 20))
        if digest != want["sha256"]:
            raise IndexIntegrityError(f"{index_dir / rel} has sha256 {digest[:16]}..., the build wrote "
                                      f"{want['sha256'][:16]}...: the file is damaged or from another build "
                                      "(same size); rebuild the index (or pass --skip-verify to skip hashing "
                                      "at your own risk)")
    return "sha256"


def check_manifest(manifest: dict, *, encoder: str | None = None, corpus_path: str | Path | None = None,
                   retriever: str | None = None, index_dir: str | Path = "") -> None:
    """Raise IndexMismatchError if the index was built from another encoder / corpus / retriever than expected."""
    where = f"index {index_dir}" if index_dir else "index"
    if retriever is not None and manifest["retriever"] != retriever:
        raise IndexMismatchError(f"{where} is a {manifest['retriever']!r} index, expected {retriever!r}")
    kind = kind_if_known(manifest)
    if encoder is not None and kind is not None:
        kind.check_encoder(manifest, encoder, where)
    if corpus_path is not None:
        rows = count_rows(corpus_path)
        if rows != manifest["num_docs"]:
            raise IndexMismatchError(f"{where} holds {manifest['num_docs']} documents but corpus {corpus_path} has "
                                     f"{rows} rows; it was built from another corpus. Rebuild the index.")
        digest = file_sha256(corpus_path)
        if digest != manifest["corpus_sha256"]:
            raise IndexMismatchError(f"{where} was built from a corpus with sha256 {manifest['corpus_sha256'][:12]}..., "
                                     f"but {corpus_path} has sha256 {digest[:12]}...; rebuild the index.")
