"""retriever: e5/BM25 + FAISS search service speaking the Search-R1 `/retrieve` protocol.

    from retriever import make_retriever, RetrieverError
    r = make_retriever(cfg.retriever, default_index_dir=world_dir / "index")
    r.search(["who founded Xylo?"], topk=3)  # -> [[{"id", "contents", "score"}, ...]]

Build and serve from the shell: ``python -m retriever build ...`` / ``python -m retriever serve ...``.
Heavy modules (torch, faiss, transformers, bm25s) load only when an index is opened or built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from retriever.build import build_index
from retriever.client import RetrieverClient, RetrieverError
from retriever.inprocess import InProcessRetriever

__all__ = ["RetrieverClient", "RetrieverError", "make_retriever", "build_index", "InProcessRetriever",
           "service_address", "RetrieverSettings"]

URL_ENV = "SEARCHR1_RETRIEVER_URL"  # overrides retriever.url (e.g. one service that every node of a run reaches)
TOKEN_ENV = "SEARCHR1_RETRIEVER_TOKEN"  # the bearer token when retriever.token is not set


class RetrieverSettings(Protocol):
    """What :func:`make_retriever` and :func:`service_address` read of a config section (the trainer's
    ``RetrieverConfig`` has these fields): ``mode`` ``inprocess`` or ``http``, the HTTP client's address and retry
    policy, the in-process index dir and how to load it."""

    mode: str
    url: str
    index_dir: str
    timeout_s: float
    max_wait_s: float
    first_contact_s: float
    max_retries: int | None
    backoff_s: float
    token: str | None
    batch_size: int
    device: str | None
    use_gpu_index: bool
    expect_encoder: str | None


def service_address(cfg: RetrieverSettings) -> tuple[str, str | None]:
    """(url, token) of the HTTP service a ``RetrieverConfig`` names: ``$SEARCHR1_RETRIEVER_URL`` over ``cfg.url``,
    ``cfg.token`` over ``$SEARCHR1_RETRIEVER_TOKEN``."""
    url = os.environ.get(URL_ENV, "").strip() or cfg.url
    if not url.startswith(("http://", "https://")):
        source = f"${URL_ENV}" if os.environ.get(URL_ENV, "").strip() else "retriever.url"
        raise RetrieverError(f"{source}={url!r}: must start with http:// or https://")
    return url, (cfg.token or os.environ.get(TOKEN_ENV) or None)


def make_retriever(cfg: RetrieverSettings,
                   default_index_dir: str | Path | None = None) -> RetrieverClient | InProcessRetriever:
    """A retriever from a ``RetrieverConfig``: ``RetrieverClient`` (mode=http) or ``InProcessRetriever``."""
    if cfg.mode == "http":
        return RetrieverClient(cfg.url, timeout_s=cfg.timeout_s, max_wait_s=cfg.max_wait_s,
                               max_retries=cfg.max_retries, backoff_s=cfg.backoff_s, token=cfg.token,
                               batch_size=getattr(cfg, "batch_size", 256),
                               first_contact_s=cfg.first_contact_s)
    if cfg.mode != "inprocess":
        raise ValueError(f"retriever.mode must be 'inprocess' or 'http' (got {cfg.mode!r})")
    index_dir = cfg.index_dir or default_index_dir
    if not index_dir:
        raise ValueError("retriever.index_dir is empty and no default index dir was given")
    return InProcessRetriever(index_dir, device=getattr(cfg, "device", None),
                              encoder=getattr(cfg, "expect_encoder", None),
                              use_gpu=getattr(cfg, "use_gpu_index", False))
