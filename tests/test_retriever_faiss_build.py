"""One FAISS build: two installed builds are refused; a GPU index asked of an index without FAISS is an error (the
no-GPU case on a Flat index: tests/test_retriever_e2e.py)."""

from __future__ import annotations

import pytest

from retriever import faiss_index
from retriever.faiss_index import FaissSetupError


def test_this_install_has_one_faiss():
    (name,) = faiss_index.faiss_distributions()  # faiss-cpu from the cpu extra (make test), faiss-gpu from gpu
    assert faiss_index.check_one_faiss() == name


def test_two_faiss_builds_are_refused(monkeypatch):
    monkeypatch.setattr(faiss_index, "faiss_distributions", lambda: ["faiss-cpu", "faiss-gpu"])
    faiss_index.check_one_faiss.cache_clear()
    try:
        with pytest.raises(FaissSetupError, match=r"2 FAISS builds are installed \(faiss-cpu, faiss-gpu\)"):
            faiss_index.check_one_faiss()
    finally:
        faiss_index.check_one_faiss.cache_clear()


def test_gpu_index_on_a_bm25_index_is_an_error(tiny_world):
    from retriever import InProcessRetriever

    with pytest.raises(FaissSetupError, match="a bm25 index has no FAISS index"):
        InProcessRetriever(tiny_world / "index", use_gpu=True)  # the test world's index is BM25
