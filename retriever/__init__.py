"""retriever: e5/BM25 + FAISS search service speaking the Search-R1 `/retrieve` protocol.

    from retriever import make_retriever, RetrieverError
    r = make_retriever(cfg.retriever, default_index_dir=world_dir / "index")
    r.search(["who founded Xylo?"], topk=3)  # -> [[{"id", "contents", "score"}, ...]]

Build and serve from the shell: ``python -m retriever build ...`` / ``python -m retriever serve ...``.
Heavy modules (torch, faiss, transformers, bm25s) load only when an index is opened or built.
"""

from __future__ import annotations

from pathlib import Path

from retriever.build import build_index
from retriever.client import RetrieverClient, RetrieverError
from retriever.inprocess import InProcessRetriever
from retriever.modes import MODES, RetrieverMode, RetrieverSettings, retriever_mode, service_address

__all__ = ["RetrieverClient", "RetrieverError", "make_retriever", "build_index", "InProcessRetriever",
           "service_address", "RetrieverSettings", "MODES", "RetrieverMode", "retriever_mode"]


def make_retriever(cfg: RetrieverSettings,
                   default_index_dir: str | Path | None = None) -> RetrieverClient | InProcessRetriever:
    """A retriever from a ``RetrieverConfig``: ``RetrieverClient`` (mode=http) or ``InProcessRetriever``."""
    return retriever_mode(cfg).build(cfg, default_index_dir)
