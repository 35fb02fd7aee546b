"""Peak memory of token log-prob + entropy (forward + backward) from logits: chunked kernel vs naive log-softmax.

Shape B=2, T=1024, V=151936 (Qwen2.5 vocabulary). Each variant runs in a fresh subprocess:
- on CUDA (when available): torch.cuda.max_memory_allocated() above the memory held once the logits exist;
- on CPU: the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) above its RSS once the logits
  exist. Both count everything the computation allocates, the gradient of the logits included (it is the same size
  for every variant and would be produced by the model's backward anyway).

Variants: naive (full [B, T, V] fp32 log-softmax), chunked (custom autograd Function, recomputes per chunk in
backward), checkpoint (torch.utils.checkpoint around the naive function per chunk of rows; for comparison).
Ends with ``RESULT logprob_peak_memory_ratio X`` = chunked / naive (target <= 0.25).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def child(variant: str, b: int, t: int, v: int, chunk: int, dtype_name: str, device: str) -> dict:
    import torch

    from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    logits = torch.randn(b, t, v, device=device, dtype=dtype).requires_grad_(True)
    labels = torch.randint(0, v, (b, t), device=device)

    def run() -> None:
        if variant == "naive":
            logp, ent = naive_logprobs_entropy(logits, labels)
        elif variant == "chunked":
            logp, ent = chunked_logprobs_entropy(logits, labels, chunk_size=chunk)
        elif variant == "checkpoint":
            from torch.utils.checkpoint import checkpoint

            flat, flat_labels = logits.reshape(b * t, 1, v), labels.reshape(b * t, 1)
            parts = [
                checkpoint(naive_logprobs_entropy, flat[s : s + chunk], flat_labels[s : s + chunk], use_reentrant=False)
                for s in range(0, b * t, chunk)
            ]
            logp, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        else:
            raise ValueError(variant)
        (logp.sum() + 0.1 * ent.sum()).backward()

    # warm-up on one row (imports, autograd engine start-up) so that one-time costs are not counted
    tiny = logits[:1, :1].detach().clone().requires_grad_(True)
    tiny_logp, tiny_ent = naive_logprobs_entropy(tiny, labels[:1, :1])
    (tiny_logp.sum() + tiny_ent.sum()).backward()
    if variant == "checkpoint":
        from torch.utils.checkpoint import checkpoint

        checkpoint(lambda x: x * 2, tiny, use_reentrant=False).sum().backward()
    del tiny, tiny_logp, tiny_ent

    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = _rss_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM (peak RSS) to the current RSS
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        peak = _rss_bytes("VmHWM") - base
    return {"variant": variant, "peak_bytes": peak, "seconds": seconds, "logits_bytes": logits.numel() * logits.element_size()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--variants", default="naive,chunked,checkpoint")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        out = child(args.child, args.batch, args.tokens, args.vocab, args.chunk, args.dtype, args.device)
        print(json.dumps(out))
        return

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {}
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch), "--tokens", str(args.tokens),
               "--vocab", str(args.vocab), "--chunk", str(args.chunk), "--dtype", args.dtype, "--device", device]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        if proc.returncode != 0:
            sys.exit(f"variant {variant} failed:\n{proc.stderr}")
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:10s} peak {r['peak_bytes'] / 2**30:7.3f} GiB   time {r['seconds']:6.2f} s   "
              f"(logits {r['logits_bytes'] / 2**30:.3f} GiB)", flush=True)
    print(f"B={args.batch} T={args.tokens} V={args.vocab} chunk={args.chunk} dtype={args.dtype} device={device}")
    if "naive" in results and "chunked" in results:
        print(f"RESULT logprob_peak_memory_ratio {results['chunked']['peak_bytes'] / results['naive']['peak_bytes']:.3f}")
    if "naive" in results and "checkpoint" in results:
        print(f"RESULT logprob_checkpoint_peak_memory_ratio {results['checkpoint']['peak_bytes'] / results['naive']['peak_bytes']:.3f}")


if __name__ == "__main__":
    main()
