"""Adopt an existing FAISS index and its JSONL corpus as an index dir, without re-encoding the corpus.

For indexes built elsewhere, such as Search-R1's prebuilt wiki-18 ``e5_Flat.index`` with ``wiki-18.jsonl``:

    python -m retriever import --faiss-index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 \\
        --out indexes/e5-wiki18

The dir gets the layout of a built index (retriever/manifest.py): ``index.faiss`` (a hard link to the given index,
else a symbolic link), ``docs.jsonl`` (the corpus, linked the same way; a ``.gz`` corpus is decompressed),
``offsets.npy`` (byte offsets of its rows) and ``manifest.json`` with sizes and sha256 of those files.

Before writing the manifest the index is checked against what the caller says it was built with (a mismatch
raises ``AdoptMismatchError`` with one line saying what differs):

* its ``ntotal`` equals the corpus's row count, its dimension the encoder's, its metric is inner product;
* a sample of passages spread over the corpus (``sample`` rows), encoded here with the stated encoder, pooling and
  passage prefix, matches the index: where the index can return stored vectors (Flat) each fresh vector must have
  cosine >= ``MIN_COSINE`` with the stored one (and the stored ones unit norm: this project's encoder normalises);
  otherwise searching the fresh vector must return the passage's row among the best-scoring hits (a weaker
  check: a wrong prefix may still find its own passage first).

The query prefix cannot be checked from passage vectors; it is recorded as given (e5: ``query: ``).
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever.corpus import DOCS_FILE, OFFSETS_FILE, CorpusError, DocStore, file_sha256
from retriever.faiss_index import DEFAULT_SEARCH_PARAMS, read_faiss_index
from retriever.kinds.dense import FAISS_FILE, DenseKind
from retriever.layout import FORMAT_VERSION, MANIFEST_FILE, IndexMismatchError, write_json_atomic
from retriever.manifest import file_checksums

if TYPE_CHECKING:
    from retriever.encoders import E5Encoder

MIN_COSINE = 0.998  # the same encoder in fp16 (GPU) vs fp32 (CPU) is expected well above this; a missing 2-token prefix
# on a short passage measured 0.987 with MiniLM
DEFAULT_SAMPLE = 8


class AdoptMismatchError(IndexMismatchError):
    """The FAISS index does not match the corpus or the stated encoder conventions (the message says what)."""


def _place(src: Path, dst: Path) -> str:
    """Put ``src`` at ``dst`` without copying where possible: a hard link, else a symbolic link. Returns which."""
    if dst.exists() and os.path.samefile(src, dst):
        return "in place"
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError:
        os.symlink(src.resolve(), dst)
        return "symlink"


def _place_corpus(corpus: Path, out_dir: Path) -> str:
    dst = out_dir / DOCS_FILE
    if corpus.suffix != ".gz":
        return _place(corpus, dst)
    tmp = out_dir / (DOCS_FILE + ".tmp")
    with gzip.open(corpus, "rb") as src, open(tmp, "wb") as f:
        shutil.copyfileobj(src, f, 1 << 22)
    os.replace(tmp, dst)
    return "decompressed"


def write_offsets(docs_path: Path, out_dir: Path) -> int:
    """Byte offsets of the non-blank lines of ``docs_path`` -> ``offsets.npy`` (row i = bytes offsets[i]:offsets[i+1];
    blank lines fall inside the previous row's range, which JSON parsing ignores). Returns the row count."""
    starts, pos = [], 0
    with open(docs_path, "rb") as f:
        for line in f:
            if line.strip():
                starts.append(pos)
            pos += len(line)
    ends = starts + [pos]
    tmp = out_dir / (OFFSETS_FILE + ".tmp.npy")
    np.save(tmp, np.asarray(ends, dtype=np.int64))
    os.replace(tmp, out_dir / OFFSETS_FILE)
    return len(ends) - 1


def _sample_rows(n: int, sample: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, num=min(sample, n))})


def _read_rows(store: DocStore, rows: list[int], corpus: Path) -> list[str]:
    texts = []
    for r in rows:
        try:
            doc = store.get(r)
        except ValueError as e:
            raise CorpusError(f"{corpus}: row {r} is not valid JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str) or "id" not in doc:
            raise CorpusError(f"{corpus}: row {r} must be an object with 'id' and string 'contents'")
        texts.append(doc["contents"])
    return texts


def _stored_vectors(index, rows: list[int]) -> np.ndarray | None:
    try:
        return np.stack([index.reconstruct(r) for r in rows]).astype(np.float32)
    except RuntimeError:  # index types that keep no full vectors (PQ) or no direct map (IVF)
        return None


def check_convention(index: Any, texts: list[str], rows: list[int], encoder: E5Encoder, *, what: str) -> dict[str, Any]:
    """Raise AdoptMismatchError unless the index's vectors of ``rows`` are ``encoder``'s passage vectors."""
    fresh = encoder.encode(texts, kind="passage", batch_size=len(texts))
    stored = _stored_vectors(index, rows)
    if stored is not None:
        norms = np.linalg.norm(stored, axis=1)
        if np.abs(norms - 1.0).max() > 1e-2:
            raise AdoptMismatchError(f"the index's vectors are not L2-normalised (norms {norms.min():.3f}.."
                                     f"{norms.max():.3f}); this project encodes normalised vectors ({what})")
        cos = (stored * fresh).sum(axis=1) / norms
        worst = int(np.argmin(cos))
        if cos[worst] < MIN_COSINE:
            raise AdoptMismatchError(f"passage vectors do not match the index: row {rows[worst]} encoded with "
                                     f"{what} has cosine {cos[worst]:.4f} with its stored vector (need >= "
                                     f"{MIN_COSINE}); wrong encoder, passage prefix or pooling")
        return {"method": "reconstruct", "rows": rows, "min_cosine": round(float(cos.min()), 6)}
    scores, found = index.search(np.ascontiguousarray(fresh), 10)
    for i, r in enumerate(rows):
        hits = found[i][scores[i] >= scores[i][0] - 1e-3]  # ties: duplicate passages share the top score
        if r not in hits:
            raise AdoptMismatchError(f"passage vectors do not match the index: row {r} encoded with {what} "
                                     f"finds row {int(found[i][0])} first, not itself; wrong encoder, passage "
                                     "prefix or pooling")
    return {"method": "search_rank1", "rows": rows}


def adopt_index(faiss_index: str | Path, corpus: str | Path, out_dir: str | Path, *, encoder: str,
                query_prefix: str = "query: ", passage_prefix: str = "passage: ", pooling: str = "mean",
                max_length: int = 256, device: str | None = None, sample: int = DEFAULT_SAMPLE,
                show_progress: bool = True) -> Path:
    """Write an index dir around an existing FAISS index and its corpus (see the module doc). Returns the dir."""
    from retriever.encoders import get_encoder  # deferred: torch

    faiss_index, corpus, out_dir = Path(faiss_index), Path(corpus), Path(out_dir)
    _prepare_out_dir(faiss_index, corpus, out_dir)
    t0 = time.time()
    index, _ = read_faiss_index(faiss_index, mmap=True)
    corpus_placement = _place_corpus(corpus, out_dir)
    num_rows = write_offsets(out_dir / DOCS_FILE, out_dir)
    _check_rows_and_metric(index, num_rows, corpus)
    enc = get_encoder(encoder, device=device, max_length=max_length, query_prefix=query_prefix,
                      passage_prefix=passage_prefix, pooling=pooling)
    if enc.dim != index.d:
        raise AdoptMismatchError(f"dimension mismatch: the FAISS index has dim {index.d}, encoder {encoder!r} "
                                 f"gives dim {enc.dim}; the index was built with another encoder")
    rows = _sample_rows(num_rows, sample)
    texts = _read_sample(out_dir, rows, corpus)
    what = f"encoder {encoder!r}, passage prefix {passage_prefix!r}, {pooling} pooling"
    check = check_convention(index, texts, rows, enc, what=what)
    _place(faiss_index, out_dir / FAISS_FILE)
    manifest = _adopted_manifest(index, enc, num_rows, encoder=encoder, max_length=max_length, pooling=pooling,
                                 query_prefix=query_prefix, passage_prefix=passage_prefix)
    manifest.update(corpus_path=str(corpus.resolve()), created_unix=int(time.time()),
                    imported_from={"faiss_index": str(faiss_index.resolve()), "corpus": corpus_placement,
                                   "convention_check": check})
    manifest["checksums"] = file_checksums(out_dir, DenseKind.name, show_progress=show_progress)
    linked = corpus_placement != "decompressed"  # docs.jsonl is the corpus file itself: hashed once, not twice
    manifest["corpus_sha256"] = (manifest["checksums"][DOCS_FILE]["sha256"] if linked
                                 else file_sha256(corpus, show_progress=show_progress))
    manifest["build_seconds"] = round(time.time() - t0, 2)
    write_json_atomic(out_dir / MANIFEST_FILE, manifest)
    if show_progress:
        print(f"[retriever] imported {type(index).__name__} index of {num_rows} docs into {out_dir} "
              f"(sample check: {check['method']})", flush=True)
    return out_dir


def _prepare_out_dir(faiss_index: Path, corpus: Path, out_dir: Path) -> None:
    """Check the inputs exist; create ``out_dir`` and remove a manifest there (it would describe other files)."""
    for path, what in ((faiss_index, "FAISS index"), (corpus, "corpus")):
        if not path.is_file():
            raise FileNotFoundError(f"{what} file not found: {path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / MANIFEST_FILE).exists():
        (out_dir / MANIFEST_FILE).unlink()


def _check_rows_and_metric(index: Any, num_rows: int, corpus: Path) -> None:
    """The index holds one vector per corpus row and searches by inner product (AdoptMismatchError otherwise)."""
    import faiss

    if num_rows == 0:
        raise CorpusError(f"corpus {corpus} has no rows")
    if index.ntotal != num_rows:
        raise AdoptMismatchError(f"row count mismatch: the FAISS index holds {index.ntotal} vectors but corpus "
                                 f"{corpus} has {num_rows} rows; they are not the same corpus")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise AdoptMismatchError(f"metric mismatch: the FAISS index uses metric {index.metric_type}, this project "
                                 "searches by inner product (metric 0)")


def _read_sample(out_dir: Path, rows: list[int], corpus: Path) -> list[str]:
    store = DocStore(out_dir)
    try:
        return _read_rows(store, rows, corpus)
    finally:
        store.close()


def _adopted_manifest(index: Any, enc: E5Encoder, num_rows: int, *, encoder: str, max_length: int, pooling: str,
                      query_prefix: str, passage_prefix: str) -> dict[str, Any]:
    """The manifest fields of the dense index adopted (``enc``: the encoder loaded to check it)."""
    import faiss

    return {
        "format_version": FORMAT_VERSION, "retriever": DenseKind.name, "num_docs": num_rows,
        "encoder": encoder, "encoder_path": enc.path, "dim": enc.dim, "index_type": type(index).__name__,
        "max_length": int(max_length), "pooling": pooling, "query_prefix": query_prefix,
        "passage_prefix": passage_prefix, "normalize": True, "metric": "inner_product",
        "search_params": dict(DEFAULT_SEARCH_PARAMS), "faiss_version": faiss.__version__,
        "files": {"index": FAISS_FILE, "docs": DOCS_FILE, "offsets": OFFSETS_FILE},
    }
