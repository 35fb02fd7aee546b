r"""CLI: ``python -m retriever {build,import,download,serve,search}`` (also the console script ``searchr1-retriever``).

    python -m retriever build --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --out indexes/e5_flat
                                                      # encodes on every visible GPU in fp16 (--devices to choose)
    python -m retriever build --corpus wiki-18.jsonl --retriever bm25 --out indexes/bm25
    python -m retriever import --faiss-index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 \
        --out indexes/e5-wiki18                                        # adopt a prebuilt index, no re-encoding
    python -m retriever download wiki18 --out data/wiki18 --index e5  # Search-R1's corpus + prebuilt e5 index
    python -m retriever serve --index indexes/e5_flat --port 8000        # prints "retriever ready on http://..."
    python -m retriever search --index indexes/e5_flat "who wrote hamlet"   # one-off query, no server

Errors a user can fix (missing index dir, port in use, damaged index, bad corpus row) are one line on stderr and exit
status 2; ``--debug`` shows the traceback. Ctrl-C is one line too (exit status 130; ``serve`` shuts down gracefully
first).

Threads (serve, search): ``OMP_WAIT_POLICY=PASSIVE`` unless set, and ``--threads`` (default ``$OMP_NUM_THREADS``
or min(4, usable cores)) for torch, FAISS and BLAS; see ``retriever/runtime.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from retriever.adopt import adopt_index
from retriever.build import build_index
from retriever.corpus import CorpusError
from retriever.download import DownloadError, download_wiki18
from retriever.faiss_index import FaissSetupError
from retriever.inprocess import InProcessRetriever
from retriever.kinds import KINDS, UsageError
from retriever.layout import IndexMismatchError
from retriever.runtime import apply_thread_defaults, set_library_threads
from retriever.service import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_QUERIES, PortInUseError,
                               ServiceSettings, bind_socket, serve)

# Errors a user can fix (their message says how): shown as one line
USER_ERRORS = (FileNotFoundError, IndexMismatchError, CorpusError, PortInUseError, UsageError, DownloadError,
               FaissSetupError)


def _add_build(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("build", help="build an index dir from a JSONL corpus")
    b.add_argument("--corpus", required=True, help="JSONL rows {\"id\", \"contents\"}")
    b.add_argument("--out", required=True, help="index dir to write (manifest.json inside)")
    b.add_argument("--retriever", choices=list(KINDS), default="e5",
                   help="e5: dense, any --encoder (e5's conventions: mean pooling, normalised, inner product) + "
                        "FAISS; bm25: sparse (default: e5)")
    for kind in KINDS.values():
        kind.add_build_options(b)
    b.add_argument("--quiet", action="store_true")
    b.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_import(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("import", help="adopt an existing FAISS index + its JSONL corpus (no re-encoding)")
    a.add_argument("--faiss-index", required=True, help="FAISS index file, row i = corpus row i (e.g. e5_Flat.index)")
    a.add_argument("--corpus", required=True, help="JSONL rows {\"id\", \"contents\"} (.jsonl or .jsonl.gz)")
    a.add_argument("--encoder", required=True, help="the encoder the index was built with (e.g. intfloat/e5-base-v2)")
    a.add_argument("--out", required=True, help="index dir to write (manifest.json inside)")
    a.add_argument("--query-prefix", default="query: ")
    a.add_argument("--passage-prefix", default="passage: ")
    a.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    a.add_argument("--max-length", type=int, default=256)
    a.add_argument("--sample", type=int, default=8, help="passages re-encoded to check the encoder convention")
    a.add_argument("--device", default=None, help="encoder device (default: cuda if available)")
    a.add_argument("--quiet", action="store_true")
    a.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_download(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("download", help="fetch Search-R1's wiki-18 corpus (and prebuilt e5 index) from the HF hub")
    d.add_argument("dataset", choices=["wiki18"])
    d.add_argument("--out", required=True, help="dir for wiki-18.jsonl.gz (and e5_Flat.index)")
    d.add_argument("--index", choices=["e5"], default=None, help="also fetch the prebuilt e5 Flat index (64.6 GB)")
    d.add_argument("--quiet", action="store_true")
    d.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_serve(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    s = sub.add_parser("serve", help="serve an index dir over HTTP (Search-R1 /retrieve protocol)")
    s.add_argument("--index", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 = any free port (the real one is printed)")
    s.add_argument("--max-topk", type=int, default=50)
    s.add_argument("--default-topk", type=int, default=3)
    s.add_argument("--max-queries", type=int, default=DEFAULT_MAX_QUERIES,
                   help="queries per request (Search-R1's train_grpo.sh sends 512 x 5 = 2,560)")
    s.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    s.add_argument("--max-json-depth", type=int, default=DEFAULT_MAX_JSON_DEPTH,
                   help="bodies nested deeper are refused (400) before parsing")
    s.add_argument("--token", default=os.environ.get("SEARCHR1_RETRIEVER_TOKEN"),
                   help="require 'Authorization: Bearer TOKEN' (default: $SEARCHR1_RETRIEVER_TOKEN)")
    s.add_argument("--no-batching", action="store_true", help="search each request on its own (for comparison)")
    s.add_argument("--batch-window-ms", type=float, default=250.0,
                   help="the most a batch waits for the clients of the last batch to come back (never longer than "
                        "the last search took)")
    s.add_argument("--max-batch-queries", type=int, default=256)
    s.add_argument("--device", default=None)
    s.add_argument("--gpu-index", action="store_true", help="clone the FAISS index onto all GPUs (faiss-gpu)")
    s.add_argument("--nprobe", type=int, default=None, help="IVF lists probed per query")
    s.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    s.add_argument("--expect-encoder", default=None, help="fail unless the index was built with this encoder")
    s.add_argument("--expect-corpus", default=None, help="fail unless the index was built from this corpus file")
    s.add_argument("--no-mmap", action="store_true", help="read the index fully into RAM")
    s.add_argument("--log-level", default="warning")
    return s


def _add_search(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    q = sub.add_parser("search", help="query an index dir directly (no server)")
    q.add_argument("--index", required=True)
    q.add_argument("--topk", type=int, default=3)
    q.add_argument("queries", nargs="+")
    return q


def _add_loading_options(sp: argparse.ArgumentParser) -> None:
    """The options of the commands that load an index (serve, search)."""
    sp.add_argument("--skip-verify", action="store_true",
                    help="check index file sizes only, not their sha256 (hashing reads every byte once: "
                         "~3 min for a 64.6 GB index at ~380 MB/s); a damaged or swapped file of the same size "
                         "then goes unnoticed")
    sp.add_argument("--threads", type=int, default=None,
                    help="torch/FAISS/BLAS threads (default: $OMP_NUM_THREADS, else min(4, usable cores))")
    sp.add_argument("--debug", action="store_true", help="show tracebacks")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m retriever", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _add_build(sub)
    _add_import(sub)
    _add_download(sub)
    for sp in (_add_serve(sub), _add_search(sub)):
        _add_loading_options(sp)
    return p


def _load(args: argparse.Namespace) -> InProcessRetriever:
    params = {"nprobe": getattr(args, "nprobe", None), "efSearch": getattr(args, "ef_search", None)}
    return InProcessRetriever(args.index, device=getattr(args, "device", None),
                              encoder=getattr(args, "expect_encoder", None),
                              corpus_path=getattr(args, "expect_corpus", None),
                              mmap=not getattr(args, "no_mmap", False), use_gpu=getattr(args, "gpu_index", False),
                              search_params={k: v for k, v in params.items() if v is not None},
                              skip_verify=args.skip_verify, show_progress=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C (serve: after uvicorn's graceful shutdown, which re-raises the signal)
        print(f"python -m retriever {args.command}: interrupted", file=sys.stderr, flush=True)
        return 130
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


def _run(args: argparse.Namespace) -> int:
    commands = {"build": _build, "download": _download, "import": _import, "serve": _serve, "search": _search}
    if args.command not in commands:
        return 2
    return commands[args.command](args)


def _build(args: argparse.Namespace) -> int:
    settings = KINDS[args.retriever].settings_from_args(args)
    out = build_index(args.corpus, args.out, retriever=args.retriever, show_progress=not args.quiet, **settings)
    print(f"index written to {out}", flush=True)
    return 0


def _download(args: argparse.Namespace) -> int:
    for what, path in download_wiki18(args.out, index=args.index, show_progress=not args.quiet).items():
        print(f"{what}: {path}", flush=True)
    return 0


def _import(args: argparse.Namespace) -> int:
    out = adopt_index(args.faiss_index, args.corpus, args.out, encoder=args.encoder,
                      query_prefix=args.query_prefix, passage_prefix=args.passage_prefix, pooling=args.pooling,
                      max_length=args.max_length, device=args.device, sample=args.sample,
                      show_progress=not args.quiet)
    print(f"index written to {out}", flush=True)
    return 0


def _thread_defaults(args: argparse.Namespace) -> int:
    """Before torch/faiss load (OpenMP reads these once): the thread settings of serve/search; their count."""
    threads = apply_thread_defaults(args.threads)["threads"]
    if not Path(args.index).is_dir():
        raise FileNotFoundError(f"index dir {args.index} does not exist; build one with `python -m retriever "
                                "build --corpus CORPUS.jsonl --out DIR` or pass the dir that holds manifest.json")
    return threads


def _serve(args: argparse.Namespace) -> int:
    threads = _thread_defaults(args)
    sock = bind_socket(args.host, args.port)  # a taken port fails now, not after loading the index
    settings = ServiceSettings(max_topk=args.max_topk, default_topk=min(args.default_topk, args.max_topk),
                               max_queries=args.max_queries, max_body_bytes=args.max_body_bytes,
                               max_json_depth=args.max_json_depth,
                               token=args.token or None, batching=not args.no_batching,
                               batch_window_ms=args.batch_window_ms, max_batch_queries=args.max_batch_queries)
    retriever = _load(args)
    set_library_threads(threads)
    info = retriever.info()
    print(f"[retriever] loaded {info['retriever']} index ({info.get('index_type')}, {info['num_docs']} docs, "
          f"encoder {info.get('encoder')}, {info.get('load_mode')})", flush=True)
    serve(retriever, settings, host=args.host, port=args.port, log_level=args.log_level, sock=sock)
    return 0


def _search(args: argparse.Namespace) -> int:
    threads = _thread_defaults(args)
    retriever = _load(args)
    set_library_threads(threads)
    for query, hits in zip(args.queries, retriever.search(args.queries, args.topk)):
        print(json.dumps({"query": query, "hits": hits}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
