"""Peak memory of token log-prob + entropy (forward + backward): from logits (chunked kernel vs naive log-softmax) and
from the final hidden states through the LM head (no logits at all vs the model's logits path).

Shape B=2, T=1024, V=151936 (Qwen2.5 vocabulary), H=896 (Qwen2.5-0.5B). Each variant runs in a fresh subprocess:
- on CUDA (when available): torch.cuda.max_memory_allocated() above the memory held once the logits exist;
- on CPU: the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) above its RSS once the logits
  exist. Both count everything the computation allocates, the gradient of the logits included (it is the same size
  for every variant and would be produced by the model's backward anyway).

Variants from logits (input: logits [B, T, V] requiring grad): naive (full [B, T, V] fp32 log-softmax), chunked
(custom autograd Function, recomputes per chunk in backward), checkpoint (torch.utils.checkpoint around the naive
function per chunk of rows; for comparison). ``RESULT logprob_peak_memory_ratio X`` = chunked / naive.

Variants from hidden states (inputs: hidden [B, T, H] and the LM-head weight [V, H], both requiring grad, so the
peak also holds dL/dhidden and dL/dW, as in training):
- hidden_naive: logits = hidden W^T, then the naive log-softmax (the textbook path);
- hidden_logits_chunked: logits = hidden W^T, then the chunked kernel (the trainer's path before the fused head);
- hidden_fused: ``algo.logprobs.linear_logprobs_entropy`` (the trainer's path now; full logits never exist).
``RESULT logprob_hidden_peak_memory_ratio X`` = hidden_fused / hidden_naive (target <= 0.05), the memory the
log-prob computation itself needs: the weight gradient dL/dW ([V, H] fp32, 0.51 GiB here) is subtracted from both
peaks, since it is the LM-head parameter's own ``.grad``, the same tensor in every variant and held by any training
step whatever computes the log-probs (with it counted, no method can go below dL/dW / naive peak, 0.088 here: that
ratio is ``RESULT logprob_hidden_peak_memory_ratio_incl_weight_grad X``).
``RESULT logprob_hidden_peak_memory_ratio_vs_logits_chunked X`` = hidden_fused / hidden_logits_chunked (both with
dL/dW).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def child(variant: str, b: int, t: int, v: int, h: int, chunk: int, dtype_name: str, device: str) -> dict:
    import torch

    from searchr1_lld.algo.logprobs import chunked_logprobs_entropy, linear_logprobs_entropy, naive_logprobs_entropy

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    from_hidden = variant.startswith("hidden_")
    if from_hidden:
        hidden = torch.randn(b, t, h, device=device, dtype=dtype).requires_grad_(True)
        weight = (torch.randn(v, h, device=device, dtype=dtype) / h**0.5).requires_grad_(True)
        logits = hidden[:1, :1, :1]  # for the warm-up only
    else:
        logits = torch.randn(b, t, v, device=device, dtype=dtype).requires_grad_(True)
    labels = torch.randint(0, v, (b, t), device=device)

    def run() -> None:
        if variant == "hidden_naive":
            logp, ent = naive_logprobs_entropy(torch.nn.functional.linear(hidden, weight), labels)
        elif variant == "hidden_logits_chunked":
            logp, ent = chunked_logprobs_entropy(torch.nn.functional.linear(hidden, weight), labels, chunk_size=chunk)
        elif variant == "hidden_fused":
            logp, ent = linear_logprobs_entropy(hidden, weight, labels, chunk_size=chunk)
        elif variant == "naive":
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
    tiny_logp, tiny_ent = naive_logprobs_entropy(tiny, labels[:1, :1] % tiny.shape[-1])
    (tiny_logp.sum() + tiny_ent.sum()).backward()
    if from_hidden:  # the matmul kernels' first call
        small_h = hidden[:1, :4].detach().clone().requires_grad_(True)
        small_w = weight[:8].detach().clone().requires_grad_(True)
        lp, en = linear_logprobs_entropy(small_h, small_w, labels[:1, :4] % 8, chunk_size=2)
        (lp.sum() + en.sum()).backward()
        torch.nn.functional.linear(small_h, small_w).sum().backward()
        del small_h, small_w, lp, en
    if variant == "checkpoint":
        from torch.utils.checkpoint import checkpoint

        checkpoint(lambda x: x * 2, tiny, use_reentrant=False).sum().backward()
    del tiny, tiny_logp, tiny_ent

    from gpu_check_parts import peak_and_time  # this script's dir is on sys.path when it runs

    peak, seconds = peak_and_time(run, torch.device(device))
    elem = torch.tensor([], dtype=dtype).element_size()
    return {"variant": variant, "peak_bytes": peak, "seconds": seconds, "logits_bytes": b * t * v * elem,
            "weight_grad_bytes": v * h * 4 if from_hidden else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--variants", default="naive,chunked,checkpoint,hidden_naive,hidden_logits_chunked,hidden_fused")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        out = child(args.child, args.batch, args.tokens, args.vocab, args.hidden, args.chunk, args.dtype, args.device)
        print(json.dumps(out))
        return

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {}
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch), "--tokens", str(args.tokens),
               "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--chunk", str(args.chunk), "--dtype", args.dtype, "--device", device]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        if proc.returncode != 0:
            sys.exit(f"variant {variant} failed:\n{proc.stderr}")
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:22s} peak {r['peak_bytes'] / 2**30:7.3f} GiB   time {r['seconds']:6.2f} s   "
              f"(logits {r['logits_bytes'] / 2**30:.3f} GiB)", flush=True)
    print(f"B={args.batch} T={args.tokens} V={args.vocab} H={args.hidden} chunk={args.chunk} dtype={args.dtype} device={device}")
    if "naive" in results and "chunked" in results:
        print(f"RESULT logprob_peak_memory_ratio {results['chunked']['peak_bytes'] / results['naive']['peak_bytes']:.3f}")
    if "naive" in results and "checkpoint" in results:
        print(f"RESULT logprob_checkpoint_peak_memory_ratio {results['checkpoint']['peak_bytes'] / results['naive']['peak_bytes']:.3f}")

    if "hidden_naive" in results and "hidden_fused" in results:
        fused, naive = results["hidden_fused"]["peak_bytes"], results["hidden_naive"]["peak_bytes"]
        wg = results["hidden_fused"]["weight_grad_bytes"]
        print(f"RESULT logprob_hidden_peak_memory_ratio {(fused - wg) / (naive - wg):.3f}")
        print(f"RESULT logprob_hidden_peak_memory_ratio_incl_weight_grad {fused / naive:.3f}")
        print(f"RESULT logprob_hidden_weight_grad_floor {wg / naive:.3f}")
    if "hidden_logits_chunked" in results and "hidden_fused" in results:
        print(f"RESULT logprob_hidden_peak_memory_ratio_vs_logits_chunked "
              f"{results['hidden_fused']['peak_bytes'] / results['hidden_logits_chunked']['peak_bytes']:.3f}")


if __name__ == "__main__":
    main()
