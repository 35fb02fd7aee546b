"""In-process retriever: the same ``search(queries, topk)`` as the HTTP client, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from retriever.index import open_index
from retriever.kinds import SearchBackend


class Documents(Protocol):
    """The documents of an index by row: ``get(row) -> {"id", "contents", ...}`` (a
    :class:`~retriever.corpus.DocStore` is one)."""

    def __len__(self) -> int: ...

    def get(self, row: int) -> dict: ...


def validate_queries(queries: Any, topk: Any) -> None:
    """Raise ValueError unless ``queries`` is a list of strings and ``topk`` an int >= 1.

    As in Search-R1: an empty list is a turn in which nobody searched (-> no results), and an empty string is the
    query of ``<search> </search>``, searched like any other.
    """
    if not isinstance(queries, (list, tuple)):
        raise ValueError(f"queries must be a list of strings (got {type(queries).__name__})")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ValueError(f"queries[{i}] must be a string (got {type(q).__name__})")
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise ValueError(f"topk must be an integer >= 1 (got {topk!r})")


class InProcessRetriever:
    """Load an index dir (e5 + FAISS or BM25) and answer ``search(queries, topk)``.

    Each hit is ``{"id": str, "contents": str, "score": float}``, best first. ``encoder`` / ``corpus_path`` are
    optional expectations checked against the manifest (a mismatch raises IndexMismatchError). The served files are
    checked against the manifest's sizes and sha256 at load (IndexIntegrityError names a file that differs);
    ``skip_verify=True`` checks sizes only. ``use_gpu``: the index on GPUs, sharded over all of them
    (``gpu_placement="all"``, the service) or whole on this process's own (``"own"``, a training rank).
    """

    def __init__(self, index_dir: str | Path, *, device: str | None = None, encoder: str | None = None,
                 corpus_path: str | Path | None = None, mmap: bool = True, use_gpu: bool = False,
                 search_params: dict[str, Any] | None = None, skip_verify: bool = False,
                 show_progress: bool = False, gpu_placement: str = "all"):
        self.backend, self.docstore, self._info = open_index(index_dir, device=device, encoder=encoder,
                                                             corpus_path=corpus_path, mmap=mmap, use_gpu=use_gpu,
                                                             search_params=search_params, skip_verify=skip_verify,
                                                             show_progress=show_progress, gpu_placement=gpu_placement)
        self._memo: dict[tuple[str, int], list[dict]] = {}

    @classmethod
    def from_parts(cls, backend: SearchBackend, docstore: Documents, info: dict) -> "InProcessRetriever":
        """Assemble from a backend (``.search(queries, k) -> (scores, rows)``) and a doc store (``.get(row)``)."""
        self = cls.__new__(cls)
        self.backend, self.docstore, self._info = backend, docstore, dict(info)
        self._memo = {}
        return self

    def info(self) -> dict:
        return dict(self._info)

    # results of this many (query, k) pairs are kept for later calls (searches are deterministic); beyond it the
    # memo starts afresh
    MEMO_ENTRIES = 65536

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        """The ``topk`` best hits of each query. A query asked twice in one call (the samples of a GRPO group often
        search alike), or asked in an earlier call, is searched once: the same hits, each hit a new dict."""
        validate_queries(queries, topk)
        if not queries:
            return []
        k = min(int(topk), len(self.docstore))
        memo = self._memo
        todo = [q for q in dict.fromkeys(queries) if (q, k) not in memo]
        if todo:
            if len(memo) + len(todo) > self.MEMO_ENTRIES:
                memo.clear()
            for query, hits in zip(todo, self._search_backend(todo, k)):
                memo[(query, k)] = hits
        return [[dict(hit) for hit in memo[(q, k)]] for q in queries]

    def clear_memo(self) -> None:
        """Forget the remembered searches (the next call searches every query anew, as a fresh retriever does)."""
        self._memo.clear()

    def _search_backend(self, queries: list[str], k: int) -> list[list[dict]]:
        """One backend search of ``queries`` (distinct), its rows resolved to documents."""
        scores, rows = self.backend.search(list(queries), k)
        results = []
        for q_scores, q_rows in zip(scores, rows):
            hits = []
            for score, row in zip(q_scores, q_rows):
                if row < 0:  # FAISS pads with -1 when fewer than k vectors were reachable
                    continue
                doc = self.docstore.get(int(row))
                hits.append({"id": str(doc["id"]), "contents": doc["contents"], "score": float(score)})
            results.append(hits)
        if len(results) != len(queries):
            raise RuntimeError(f"backend returned {len(results)} result lists for {len(queries)} queries")
        return results
