"""The passage embeddings of a dense build: the corpus encoded shard by shard into ``embeddings/`` (``shard_size``
rows each; a shard already on disk from an interrupted build with the same corpus/encoder is reused), then a FAISS
index trained on a random sample of them (if it needs training: IVF, PQ, SQ), filled shard by shard and written
(``index.faiss.tmp``, then renamed). The dense kind that runs these steps: retriever/kinds/dense.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from retriever.corpus import DocStoreWriter, iter_corpus
from retriever.faiss_index import check_trainable, gpu_count, make_faiss_index, num_train_vectors, to_gpus
from retriever.layout import write_json_atomic

EMBEDDINGS_DIR = "embeddings"
SHARD_MIN_ROWS = 1_000
SHARD_MAX_ROWS = {"cpu": 10_000, "cuda": 100_000}  # ~2-3 min of MiniLM on 2 CPU cores / ~1 min of e5-base on a GPU


def auto_shard_size(num_rows: int, devices: str | Sequence[str]) -> int:
    """Rows per embedding shard (the unit a resumed build keeps): about 1/20 of the corpus, at least 1,000 rows,
    at most what the devices encode in a few minutes, so a killed build loses at most a few minutes at any scale.

    20k passages -> 1,000 (~20 s on 2 CPU cores); 21M on CPU -> 10,000; 21M on one GPU -> 100,000 (on k GPUs
    k x 100,000: each still encodes 100,000 rows a shard).
    """
    devices = [devices] if isinstance(devices, str) else list(devices)
    gpus = sum(d.startswith("cuda") for d in devices)
    cap = SHARD_MAX_ROWS["cuda"] * gpus if gpus == len(devices) else SHARD_MAX_ROWS["cpu"]
    return int(min(cap, max(SHARD_MIN_ROWS, -(-num_rows // 20))))


def _shard_path(emb_dir: Path, k: int) -> Path:
    return emb_dir / f"shard_{k:05d}.npy"


def _shard_complete(path: Path, rows: int, dim: int) -> bool:
    if not path.is_file():
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, OSError):
        return False
    return arr.shape == (rows, dim) and arr.dtype == np.float32


def _shard_rows(num_rows: int, shard_size: int) -> list[int]:
    """Rows of each shard: ``shard_size`` each, the last one the rest."""
    return [min(shard_size, num_rows - start) for start in range(0, num_rows, shard_size)]


def encode_shards(corpus_path: Path, out_dir: Path, pool, *, num_rows: int, shard_size: int, batch_size: int,
                  embed_key: dict, show_progress: bool) -> tuple[int, int]:
    """Stream the corpus once: write the doc store and every missing embedding shard (encoded by ``pool``, an
    :class:`~retriever.encode_pool.EncoderPool`). Returns (shards, reused)."""
    emb_dir = out_dir / EMBEDDINGS_DIR
    meta_path = emb_dir / "meta.json"
    if emb_dir.is_dir():
        old = json.loads(meta_path.read_text()) if meta_path.is_file() else None
        if old != embed_key:
            shutil.rmtree(emb_dir)  # shards from another corpus / encoder / shard size: useless
    emb_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(meta_path, embed_key)

    rows = _shard_rows(num_rows, shard_size)
    done = {k for k, n in enumerate(rows) if _shard_complete(_shard_path(emb_dir, k), n, pool.dim)}
    store = DocStoreWriter(out_dir)
    texts: list[str] = []
    devices = ", ".join(pool.devices)
    bar = tqdm(total=num_rows, initial=sum(rows[k] for k in done), desc=f"encoding on {devices}", unit="passage",
               smoothing=0.1, disable=not show_progress)

    def flush(k: int) -> None:
        if k not in done:
            vectors = pool.encode(texts, kind="passage", batch_size=batch_size, bar=bar)
            path = _shard_path(emb_dir, k)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vectors)
            os.replace(tmp, path)
        texts.clear()

    k = 0
    for doc_id, contents in iter_corpus(corpus_path, show_progress=False, total=num_rows):
        store.add(doc_id, contents)
        texts.append(contents)
        if len(texts) == shard_size:
            flush(k)
            k += 1
    if texts:
        flush(k)
    store.close()
    bar.close()
    return len(rows), len(done)


def iter_shards(emb_dir: Path, num_shards: int):
    for k in range(num_shards):
        yield np.load(_shard_path(emb_dir, k), mmap_mode="r")


def sample_rows(emb_dir: Path, num_shards: int, num_rows: int, n: int, seed: int = 0) -> np.ndarray:
    """A uniform random sample of ``n`` embedding rows, gathered shard by shard (never all rows in RAM)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(num_rows, size=n, replace=False))
    parts, start = [], 0
    for shard in iter_shards(emb_dir, num_shards):
        end = start + len(shard)
        local = chosen[(chosen >= start) & (chosen < end)] - start
        if len(local):
            parts.append(np.asarray(shard[local], dtype=np.float32))
        start = end
    return np.concatenate(parts)


def write_faiss_index(emb_dir: Path, out_path: Path, *, dim: int, num_rows: int, num_shards: int, index_type: str,
                      train_sample: int | None, use_gpu: bool, hnsw_ef_construction: int, show_progress: bool) -> dict:
    """Train (if needed) and fill an ``index_type`` index with the shards of ``emb_dir``; write it to ``out_path``
    (through ``<out_path>.tmp``). Returns what the manifest records of it (training, GPU)."""
    import faiss

    cpu_index = make_faiss_index(dim, index_type)
    hnsw = getattr(cpu_index, "hnsw", None)
    if hnsw is not None:
        hnsw.efConstruction = int(hnsw_ef_construction)
    index, on_gpu = cpu_index, False
    if use_gpu and gpu_count() > 0:
        try:
            index, on_gpu = to_gpus(cpu_index), True
        except RuntimeError as e:  # e.g. HNSW has no GPU version
            print(f"[retriever] {index_type} cannot run on GPU ({str(e).strip().splitlines()[-1]}); building on CPU",
                  flush=True)
    train_info: dict[str, Any] = {"trained_on": 0}
    if not index.is_trained:
        n_train = num_train_vectors(cpu_index, num_rows, train_sample)
        check_trainable(cpu_index, n_train, index_type)
        sample = sample_rows(emb_dir, num_shards, num_rows, n_train)
        t0 = time.time()
        if show_progress:
            print(f"[retriever] training {index_type} on {n_train} vectors", flush=True)
        index.train(sample)
        train_info = {"trained_on": n_train, "train_seconds": round(time.time() - t0, 2)}
    for shard in tqdm(iter_shards(emb_dir, num_shards), total=num_shards, desc=f"add to {index_type}",
                      unit="shard", disable=not show_progress):
        index.add(np.ascontiguousarray(shard, dtype=np.float32))
    if index.ntotal != num_rows:
        raise RuntimeError(f"FAISS index holds {index.ntotal} vectors, expected {num_rows}")
    if on_gpu:
        index = faiss.index_gpu_to_cpu(index)
    tmp = out_path.with_name(out_path.name + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out_path)
    return {**train_info, "built_on_gpu": on_gpu}
