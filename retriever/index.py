"""Open a built index dir for search: check it (retriever/manifest.py), load its documents and its search backend
(FAISS + the query encoder, on CPU or GPUs, or bm25s). ``open_index(dir) -> (backend, docstore, info)``; a backend's
``search(queries, k) -> (scores [Q,k], rows [Q,k])``. Building one: retriever/build.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retriever.corpus import DocStore
from retriever.faiss_index import FaissSetupError, read_faiss_index, require_gpus, set_search_params, to_gpus, use_blas_for_batches
from retriever.manifest import BM25_DIR, FAISS_FILE, IndexMismatchError, check_manifest, read_manifest, verify_files


@dataclass
class DenseBackend:
    """Encode queries, search FAISS by inner product. ``search(queries, k) -> (scores [Q,k], rows [Q,k])``."""

    encoder: Any  # anything with .encode(texts, kind="query") -> float32 [Q, D]
    index: Any  # a FAISS index
    encode_batch_size: int = 64

    def __post_init__(self) -> None:
        use_blas_for_batches()

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encoder.encode(queries, kind="query", batch_size=self.encode_batch_size)
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return scores, rows


@dataclass
class BM25Backend:
    """bm25s scoring. ``search(queries, k) -> (scores [Q,k], rows [Q,k])``."""

    model: Any  # bm25s.BM25
    tokenizer: Any  # bm25s.tokenization.Tokenizer with the corpus vocabulary

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        k = min(k, int(self.model.scores["num_docs"]))
        rows, scores = self.model.retrieve(ids, k=k, show_progress=False, n_threads=0)
        return np.asarray(scores, dtype=np.float32), np.asarray(rows, dtype=np.int64)


def open_index(index_dir: str | Path, *, device: str | None = None, encoder: str | None = None,
               corpus_path: str | Path | None = None, mmap: bool = True, use_gpu: bool = False,
               search_params: dict[str, Any] | None = None, skip_verify: bool = False,
               show_progress: bool = False) -> tuple[Any, DocStore, dict]:
    """Load an index dir -> ``(backend, docstore, info)``, checking the manifest against the files and expectations.

    ``encoder`` / ``corpus_path``: what the caller expects the index to have been built from (mismatch -> error).
    ``skip_verify``: check file sizes only, not their sha256 (saves ~1 s per GB at start-up).
    """
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    check_manifest(manifest, encoder=encoder, corpus_path=corpus_path, index_dir=index_dir)
    verified = verify_files(index_dir, manifest, skip_hash=skip_verify, show_progress=show_progress)
    docstore = DocStore(index_dir)
    n = manifest["num_docs"]
    if len(docstore) != n:
        raise IndexMismatchError(f"{index_dir}: doc store has {len(docstore)} rows, manifest says {n}; rebuild")
    info = {k: manifest.get(k) for k in ("retriever", "num_docs", "corpus_sha256", "corpus_path", "encoder", "dim",
                                         "index_type", "max_length", "pooling", "query_prefix", "passage_prefix")}
    info["index_dir"] = str(index_dir)
    info["verified"] = verified
    if manifest["retriever"] == "bm25":
        if use_gpu:
            raise FaissSetupError("--gpu-index / retriever.use_gpu_index: a bm25 index has no FAISS index to put on "
                                  "a GPU; drop the flag")
        import bm25s

        model = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=mmap, show_progress=False, verbosity=0)
        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        tokenizer.load_vocab(str(index_dir / BM25_DIR))
        tokenizer.load_stopwords(str(index_dir / BM25_DIR))
        if int(model.scores["num_docs"]) != n:
            raise IndexMismatchError(f"{index_dir}: bm25 model has {model.scores['num_docs']} docs, manifest {n}")
        info.update(index_type="bm25", encoder="bm25", load_mode="mmap" if mmap else "in_memory")
        return BM25Backend(model, tokenizer), docstore, info

    from retriever.encoders import get_encoder

    index, load_mode = read_faiss_index(index_dir / FAISS_FILE, mmap=mmap)
    if index.ntotal != n or index.d != manifest["dim"]:
        raise IndexMismatchError(f"{index_dir}: {FAISS_FILE} has {index.ntotal} vectors of dim {index.d}, manifest "
                                 f"says {n} x {manifest['dim']}; rebuild the index")
    applied = set_search_params(index, {**manifest.get("search_params", {}), **(search_params or {})})
    enc = get_encoder(manifest["encoder_path"] if Path(manifest.get("encoder_path", "")).is_dir() else manifest["encoder"],
                    device=device, max_length=manifest["max_length"], query_prefix=manifest["query_prefix"],
                    passage_prefix=manifest["passage_prefix"], pooling=manifest.get("pooling", "mean"))
    if enc.dim != manifest["dim"]:
        raise IndexMismatchError(f"{index_dir}: encoder {manifest['encoder']!r} now gives dim {enc.dim}, index has "
                                 f"dim {manifest['dim']}; the encoder changed since the build")
    if use_gpu:
        n_gpus = require_gpus("--gpu-index / retriever.use_gpu_index")
        try:
            index, load_mode = to_gpus(index), f"gpu x{n_gpus}"
        except RuntimeError as e:
            print(f"[retriever] keeping index on CPU: {str(e).strip().splitlines()[-1]}", flush=True)
    info.update(load_mode=load_mode, search_params=applied, device=enc.device)
    return DenseBackend(enc, index), docstore, info
