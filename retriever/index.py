"""Open a built index dir for search: check it (retriever/manifest.py), load its documents and the search backend of
its kind (retriever/kinds/: FAISS + the query encoder, on CPU or GPUs, or bm25s). ``open_index(dir) -> (backend,
docstore, info)``; a backend's ``search(queries, k) -> (scores [Q,k], rows [Q,k])``. Building one:
retriever/build.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retriever.corpus import DocStore
from retriever.kinds import OpenOptions, SearchBackend, kind_of_manifest
from retriever.layout import IndexMismatchError
from retriever.manifest import check_manifest, read_manifest, verify_files


def open_index(index_dir: str | Path, *, device: str | None = None, encoder: str | None = None,
               corpus_path: str | Path | None = None, mmap: bool = True, use_gpu: bool = False,
               search_params: dict[str, Any] | None = None, skip_verify: bool = False,
               show_progress: bool = False, gpu_placement: str = "all") -> tuple[SearchBackend, DocStore, dict]:
    """Load an index dir -> ``(backend, docstore, info)``, checking the manifest against the files and expectations.
    ``use_gpu`` / ``gpu_placement``: the index on GPUs, and which (kinds.OpenOptions).

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
    kind = kind_of_manifest(manifest, str(index_dir))
    info = {k: manifest.get(k) for k in ("retriever", "num_docs", "corpus_sha256", "corpus_path")}
    info.update(kind.describe(manifest), index_dir=str(index_dir), verified=verified)
    backend, loaded = kind.open(index_dir, manifest, OpenOptions(device=device, mmap=mmap, use_gpu=use_gpu,
                                                                 search_params=search_params,
                                                                 gpu_placement=gpu_placement))
    info.update(loaded)
    return backend, docstore, info
