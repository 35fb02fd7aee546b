"""Batched Flat search through DenseBackend (the search path of every dense index) goes through one BLAS product
(FAISS's default threshold would never use it for a service's batches) and returns the same neighbours as one query
at a time."""

import faiss
import numpy as np

from retriever.faiss_index import FLAT_BLAS_MIN_QUERIES, read_faiss_index
from retriever.kinds.dense import DenseBackend


def test_dense_backend_enables_blas_for_batches(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 32)).astype("float32")
    index = faiss.IndexFlatIP(32)
    index.add(x)
    faiss.write_index(index, str(tmp_path / "index.faiss"))
    faiss.cvar.distance_compute_blas_threshold = 10**9
    loaded, _ = read_faiss_index(tmp_path / "index.faiss")
    DenseBackend(encoder=None, index=loaded)
    assert faiss.cvar.distance_compute_blas_threshold == FLAT_BLAS_MIN_QUERIES
    q = rng.standard_normal((FLAT_BLAS_MIN_QUERIES * 2, 32)).astype("float32")
    _, batched = loaded.search(q, 3)
    singles = np.concatenate([loaded.search(q[i : i + 1], 3)[1] for i in range(len(q))])
    assert (batched == singles).all()
