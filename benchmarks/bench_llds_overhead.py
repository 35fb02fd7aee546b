"""Cost of adding LLDS (action gate) to the learner's loss: forward + backward of what the trainer calls per
micro-batch, ``algo.objective.objective`` (PPO-clip + low_var_kl [+ LLDS], metrics included), on B=64 responses x
T=1024 tokens with ``[B]`` advantages (as step.micro_step passes them; ``--token-advantages`` for ``[B, T]``).
Same code path with and without LLDS (``llds_lam`` 0.2 vs 0). Each repeat runs both, in alternating order; the ratio
is the median of the per-repeat ratios (a pair shares the machine's state, which drifts by tens of percent here).
Ends with ``RESULT llds_overhead_ratio X`` (with / without LLDS) and ``RESULT llds_added_ms Y`` (the absolute added
time per call). The model forward/backward (which dominates a real step) is not included: this is the loss-only
worst case (benchmarks/bench_llds_step.py measures whole training steps).
Metric dicts are part of the timed work (the trainer logs them every step). Times are the process's CPU time by
default (``--clock cpu``; the machine is shared, and a descheduled process does not accrue CPU time), ``--clock wall``
for wall-clock time.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from searchr1_lld.algo.objective import mini_batch_denominators, objective
from searchr1_lld.config import AlgorithmConfig, LLDSConfig


def make_batch(b: int, t: int, seed: int = 0, token_advantages: bool = False) -> dict[str, torch.Tensor]:
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
    adv = torch.randn(b, generator=g)
    return {
        "logp_old": logp_old,
        "logp_new_data": logp_old + 0.05 * torch.randn(b, t, generator=g),
        "ref_logp": logp_old + 0.05 * torch.randn(b, t, generator=g),
        "adv": (adv[:, None] * mask).contiguous() if token_advantages else adv,
        "mask": mask,
        **dict(zip(("n_tok", "n_resp"), mini_batch_denominators(mask))),
    }


SPEC = AlgorithmConfig(policy_loss="ppo_clip", kl_coef=0.001, kl_type="low_var_kl", llds=LLDSConfig(gate="action"))


def step(batch: dict[str, torch.Tensor], with_llds: bool) -> None:
    """One micro-batch as the trainer runs it: objective forward (metrics converted to floats) + backward."""
    spec = dataclasses.replace(SPEC, llds=dataclasses.replace(SPEC.llds, enabled=with_llds, lam=0.2))
    logp_new = batch["logp_new_data"].clone().requires_grad_(True)
    loss, metrics = objective(spec, logp_new, batch["logp_old"], batch["adv"], batch["mask"], mini_tokens=batch["n_tok"],
                       mini_responses=batch["n_resp"], logp_ref=batch["ref_logp"])
    loss.backward()


def measure(batch: dict[str, torch.Tensor], repeats: int, clock) -> tuple[float, float, float]:
    """(median time without LLDS, median time with LLDS, median of the paired ratios with / without): each repeat
    runs both, in alternating order, so a pair shares the machine's state; the paired median is the headline."""
    for _ in range(5):  # warm-up
        step(batch, False)
        step(batch, True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(repeats):
        for with_llds in ((False, True) if r % 2 == 0 else (True, False)):  # interleave to share machine noise
            t0 = clock()
            step(batch, with_llds)
            times[with_llds].append(clock() - t0)
    ratios = [w / b for w, b in zip(times[True], times[False]) if b > 0]
    return statistics.median(times[False]), statistics.median(times[True]), statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--token-advantages", action="store_true", help="[B, T] token-broadcast advantages instead of [B]")
    ap.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                    help="cpu: the process's CPU time (time.process_time; robust on a shared machine), wall: perf_counter")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batch = make_batch(args.batch, args.tokens, token_advantages=args.token_advantages)
    print(f"B={args.batch} T={args.tokens} threads={args.threads} repeats={args.repeats} clock={args.clock} "
          f"advantages={'[B, T]' if args.token_advantages else '[B]'}")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    base, full, ratio = measure(batch, args.repeats, clock)
    print(f"objective PPO-clip + KL           fwd+bwd median {base * 1e3:.3f} ms")
    print(f"objective PPO-clip + KL + LLDS(A) fwd+bwd median {full * 1e3:.3f} ms")
    print(f"RESULT llds_overhead_ratio {ratio:.3f}")
    print(f"RESULT llds_added_ms {(full - base) * 1e3:.3f}")


if __name__ == "__main__":
    main()
