"""Cost of adding LLDS (action gate) to the learner's loss: forward + backward of
(PPO-clip + low_var_kl [+ LLDS]) on B=64 responses x T=1024 tokens, median over repeats, interleaved.

Prints the two medians and ends with ``RESULT llds_overhead_ratio X`` (with / without LLDS; target <= 1.05) and
``RESULT llds_added_ms Y`` (the absolute added time per call).
The model forward/backward (which dominates a real step) is not included: this is the loss-only worst case.
Metric dicts are part of the timed work (the trainer logs them every step).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from searchr1_lld.algo import aggregate, kl_penalty, llds_loss, ppo_clip_loss


def make_batch(b: int, t: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # 3 action spans of generated tokens separated by observations, then padding
    mask = torch.zeros(b, t)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    for i in range(b):
        mask[i, : lengths[i]] = 1
        for k in range(1, 3):
            s = int(lengths[i]) * k // 3
            mask[i, s : s + 40] = 0  # an <information> block
    logp_old = -torch.rand(b, t, generator=g) * 3
    return {
        "logp_old": logp_old,
        "logp_new_data": logp_old + 0.05 * torch.randn(b, t, generator=g),
        "ref_logp": logp_old + 0.05 * torch.randn(b, t, generator=g),
        "adv": torch.randn(b, generator=g)[:, None].expand(b, t).contiguous() * mask,
        "mask": mask,
    }


def step(batch: dict[str, torch.Tensor], with_llds: bool) -> None:
    logp_new = batch["logp_new_data"].clone().requires_grad_(True)
    pg, pg_metrics = ppo_clip_loss(logp_new, batch["logp_old"], batch["adv"], batch["mask"])
    kl = aggregate(kl_penalty(logp_new, batch["ref_logp"], "low_var_kl"), batch["mask"], "token-mean")
    loss = pg + 0.001 * kl
    if with_llds:
        l_llds, llds_metrics = llds_loss(logp_new, batch["logp_old"], batch["adv"], batch["mask"], gate="action", lam=0.2)
        loss = loss + l_llds
    loss.backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batch = make_batch(args.batch, args.tokens)
    for _ in range(5):  # warm-up
        step(batch, False)
        step(batch, True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.repeats):
        for with_llds in ((False, True) if r % 2 == 0 else (True, False)):  # interleave to share machine noise
            t0 = time.perf_counter()
            step(batch, with_llds)
            times[with_llds].append(time.perf_counter() - t0)
    base, full = statistics.median(times[False]), statistics.median(times[True])
    print(f"B={args.batch} T={args.tokens} threads={args.threads} repeats={args.repeats}")
    print(f"policy loss + KL           fwd+bwd median {base * 1e3:.3f} ms")
    print(f"policy loss + KL + LLDS(A) fwd+bwd median {full * 1e3:.3f} ms")
    print(f"RESULT llds_overhead_ratio {full / base:.3f}")
    print(f"RESULT llds_added_ms {(full - base) * 1e3:.3f}")


if __name__ == "__main__":
    main()
