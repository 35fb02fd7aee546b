"""retriever: e5/BM25 + FAISS search service speaking the Search-R1 `/retrieve` protocol.

    from retriever import make_retriever, RetrieverError
    r = make_retriever(cfg.retriever, default_index_dir=world_dir / "index")
    r.search(["who founded Xylo?"], topk=3)  # -> [[{"id", "contents", "score"}, ...]]

Build and serve from the shell: ``python -m retriever build ...`` / ``python -m retriever serve ...``.
Heavy modules (torch, faiss, transformers) load only when an in-process retriever or a build is created.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from retriever.client import RetrieverClient, RetrieverError

__all__ = ["RetrieverClient", "RetrieverError", "make_retriever", "build_index", "InProcessRetriever", "service_address"]

URL_ENV = "SEARCHR1_RETRIEVER_URL"  # overrides retriever.url (e.g. one service that every node of a run reaches)
TOKEN_ENV = "SEARCHR1_RETRIEVER_TOKEN"  # the bearer token when retriever.token is not set


def service_address(cfg: Any) -> tuple[str, str | None]:
    """(url, token) of the HTTP service a ``RetrieverConfig`` names: ``$SEARCHR1_RETRIEVER_URL`` over ``cfg.url``,
    ``cfg.token`` over ``$SEARCHR1_RETRIEVER_TOKEN``."""
    url = os.environ.get(URL_ENV, "").strip() or cfg.url
    if not url.startswith(("http://", "https://")):
        source = f"${URL_ENV}" if os.environ.get(URL_ENV, "").strip() else "retriever.url"
        raise RetrieverError(f"{source}={url!r}: must start with http:// or https://")
    return url, (cfg.token or os.environ.get(TOKEN_ENV) or None)


def make_retriever(cfg: Any, default_index_dir: str | Path | None = None):
    """A retriever from a ``RetrieverConfig``: ``RetrieverClient`` (mode=http) or ``InProcessRetriever``."""
    if cfg.mode == "http":
        return RetrieverClient(cfg.url, timeout_s=cfg.timeout_s, max_wait_s=cfg.max_wait_s,
                               max_retries=cfg.max_retries, backoff_s=cfg.backoff_s, token=cfg.token,
                               batch_size=getattr(cfg, "batch_size", 256))
    if cfg.mode != "inprocess":
        raise ValueError(f"retriever.mode must be 'inprocess' or 'http' (got {cfg.mode!r})")
    index_dir = cfg.index_dir or default_index_dir
    if not index_dir:
        raise ValueError("retriever.index_dir is empty and no default index dir was given")
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(index_dir, device=getattr(cfg, "device", None),
                              encoder=getattr(cfg, "expect_encoder", None),
                              use_gpu=getattr(cfg, "use_gpu_index", False))


def __getattr__(name: str):  # lazy: keep `import retriever` light
    if name == "build_index":
        from retriever.build import build_index

        return build_index
    if name == "InProcessRetriever":
        from retriever.inprocess import InProcessRetriever

        return InProcessRetriever
    raise AttributeError(f"module 'retriever' has no attribute {name!r}")
