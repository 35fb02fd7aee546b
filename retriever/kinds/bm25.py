"""The BM25 kind (``retriever=bm25``): bm25s over the corpus tokenised by bm25s's regex tokenizer with English
stopwords. Its files: ``bm25/``, the bm25s model with the tokenizer's vocabulary and stopwords. No encoder, no
FAISS index, no GPU.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from retriever.corpus import DocStoreWriter, iter_corpus
from retriever.faiss_index import FaissSetupError
from retriever.kinds.base import CorpusFacts, IndexKind, OpenOptions
from retriever.layout import IndexMismatchError

BM25_DIR = "bm25"


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


@dataclass
class BM25Settings:
    """BM25's term-frequency saturation ``k1`` and length normalisation ``b``."""

    bm25_k1: float = 0.9
    bm25_b: float = 0.4


class BM25Kind(IndexKind[BM25Settings]):
    """bm25s (see the module doc)."""

    name = "bm25"
    settings_type = BM25Settings

    def manifest_settings(self, settings: BM25Settings) -> dict[str, Any]:
        return dict(bm25_k1=float(settings.bm25_k1), bm25_b=float(settings.bm25_b),
                    tokenizer="bm25s regex, english stopwords")

    def build(self, corpus: CorpusFacts, out_dir: Path, settings: BM25Settings, *,
              show_progress: bool) -> dict[str, Any]:
        """Tokenise the corpus streaming (token ids only are kept), index with bm25s, save model + vocabulary."""
        import bm25s

        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        store = DocStoreWriter(out_dir)

        def texts() -> Iterator[str]:
            for doc_id, contents in iter_corpus(corpus.path, show_progress=show_progress, total=corpus.num_rows):
                store.add(doc_id, contents)
                yield contents

        token_ids = list(tokenizer.streaming_tokenize(texts(), update_vocab=True))
        store.close()
        model = bm25s.BM25(k1=settings.bm25_k1, b=settings.bm25_b)
        model.index((token_ids, tokenizer.get_vocab_dict()), show_progress=show_progress)
        tmp = out_dir / (BM25_DIR + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save(str(tmp), show_progress=False)
        tokenizer.save_vocab(str(tmp))
        tokenizer.save_stopwords(str(tmp))
        if (out_dir / BM25_DIR).exists():
            shutil.rmtree(out_dir / BM25_DIR)
        os.replace(tmp, out_dir / BM25_DIR)
        return {"files": {"bm25": BM25_DIR}}

    def served_files(self, index_dir: Path) -> list[Path]:
        return sorted(p for p in (index_dir / BM25_DIR).rglob("*") if p.is_file())

    def describe(self, manifest: dict) -> dict[str, Any]:
        return {"encoder": "bm25", "index_type": "bm25"}

    def open(self, index_dir: Path, manifest: dict, options: OpenOptions) -> tuple[BM25Backend, dict[str, Any]]:
        if options.use_gpu:
            raise FaissSetupError("--gpu-index / retriever.use_gpu_index: a bm25 index has no FAISS index to put on "
                                  "a GPU; drop the flag")
        import bm25s

        model = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=options.mmap, show_progress=False, verbosity=0)
        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        tokenizer.load_vocab(str(index_dir / BM25_DIR))
        tokenizer.load_stopwords(str(index_dir / BM25_DIR))
        n = manifest["num_docs"]
        if int(model.scores["num_docs"]) != n:
            raise IndexMismatchError(f"{index_dir}: bm25 model has {model.scores['num_docs']} docs, manifest {n}")
        return BM25Backend(model, tokenizer), {"load_mode": "mmap" if options.mmap else "in_memory"}
