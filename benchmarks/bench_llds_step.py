"""Share of LLDS in a whole policy update: (model forward + objective with LLDS + backward) / (the same without LLDS).

One update of one micro-batch, exactly as the trainer runs it: the policy's log-probs and entropies through
``policy_logprobs.response_logprobs`` (final hidden states -> LM head, chunked), ``algo.objective.objective``
(PPO-clip + low_var_kl + entropy [+ LLDS action gate, lam 0.2], metrics converted to floats) and ``backward``.
The optimiser step is not timed (it does not depend on LLDS; leaving it out makes the ratio larger, not smaller).
Random-init Qwen2 models (no world build, no hub), CPU, torch's default thread count:

- tiny: the tiny world's policy (sizes from ``WorldConfig`` defaults: hidden 128, 2 layers, 4 heads, 2 KV heads,
  intermediate 384, vocab = tokenizer_vocab_size, tied embeddings); B=16 sequences of 128 prompt + 384 response
  tokens = 8,192 tokens, the tiny config's ``micro_batch_token_budget``.
- qwen0.5b: a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab
  151,936, tied embeddings), at a short length: B=2 sequences of 16 prompt + 48 response tokens (one update is
  about 20 s of CPU time on the 2-core machine; the whole benchmark runs in a few minutes on idle cores, about 11
  minutes when they are shared).

Responses have two action spans separated by an ``<information>`` block (mask 0); logp_old = logp_new + noise so
that the LLDS gate is really active. Repeats are interleaved (with / without LLDS alternate, the order flipping
every repeat) and medians taken. Times are the process's CPU time (all threads; ``--clock cpu``, the default: the
machine is shared) or wall-clock time (``--clock wall``).

Two estimates of the ratio per model:
- direct: median update with LLDS / median update without, ``RESULT llds_step_overhead_ratio_direct_<model> X``,
  printed with the spread of the step times (interquartile range / median). On a shared CPU machine that spread is
  several percent, far above the effect measured, so the direct ratio cannot resolve 1%.
- from parts: 1 + (objective with LLDS - objective without) / (median update without LLDS), with the objective timed
  alone on the step's shapes (many repeats; low noise). This is exact by construction: the two updates differ only in
  the objective's no-grad pass (the model forward, the fused loss's backward -- one multiply by the precomputed
  dL/dlogp -- and the model backward are the same work with or without LLDS).
  ``RESULT llds_step_overhead_ratio_<model> X``, and ``RESULT llds_step_overhead_ratio X`` = their max (target <= 1.01).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from searchr1_lld import policy_logprobs
from searchr1_lld.algo.objective import ObjectiveSpec, mini_batch_denominators, objective
from searchr1_lld.world.config import WorldConfig

SPEC = ObjectiveSpec(policy_loss="ppo_clip", kl_coef=0.001, kl_type="low_var_kl", entropy_coef=0.001,
                     llds_gate="action")


def build_model(kind: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if kind == "tiny":
        w = WorldConfig()
        cfg = Qwen2Config(vocab_size=w.tokenizer_vocab_size, hidden_size=w.model_hidden_size,
                          intermediate_size=w.model_intermediate_size, num_hidden_layers=w.model_layers,
                          num_attention_heads=w.model_heads, num_key_value_heads=w.model_kv_heads,
                          max_position_embeddings=2048, tie_word_embeddings=True)
    elif kind == "qwen0.5b":
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float().train()


def make_rows(model: torch.nn.Module, b: int, prompt: int, response: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (b, prompt + response), generator=g)
    mask = torch.ones(b, response)
    gap = response // 3
    mask[:, gap : gap + max(response // 8, 1)] = 0  # an <information> block between two action spans
    rows = {
        "input_ids": ids[:, :-1], "attention_mask": torch.ones_like(ids[:, :-1]),
        "position_ids": torch.arange(prompt + response - 1).expand(b, -1), "responses": ids[:, prompt:],
        "start": prompt - 1, "mask": mask, "adv": torch.randn(b, generator=g),
    }
    with torch.no_grad():
        logp, _ = forward(model, rows, compute_entropy=False)
    rows["logp_old"] = logp + 0.05 * torch.randn(logp.shape, generator=g)
    rows["logp_ref"] = logp + 0.05 * torch.randn(logp.shape, generator=g)
    rows["n_tok"], rows["n_resp"] = mini_batch_denominators(mask)
    return rows


def forward(model: torch.nn.Module, rows: dict, compute_entropy: bool = True):
    return policy_logprobs.response_logprobs(
        model, rows["input_ids"], rows["attention_mask"], rows["position_ids"], rows["responses"], rows["start"],
        chunk_size=256, temperature=1.0, compute_entropy=compute_entropy)


def loss_of(rows: dict, logp: torch.Tensor, entropy: torch.Tensor, with_llds: bool) -> torch.Tensor:
    spec = dataclasses.replace(SPEC, llds_lam=0.2 if with_llds else 0.0)
    loss, _metrics = objective(spec, logp, rows["logp_old"], rows["adv"], rows["mask"], mini_tokens=rows["n_tok"],
                               mini_responses=rows["n_resp"], logp_ref=rows["logp_ref"], entropy=entropy)
    return loss


def update(model: torch.nn.Module, rows: dict, with_llds: bool) -> None:
    logp, entropy = forward(model, rows)
    loss_of(rows, logp, entropy, with_llds).backward()
    model.zero_grad(set_to_none=True)


def objective_only(rows: dict, with_llds: bool) -> None:
    logp = (rows["logp_old"] - 0.05).clone().requires_grad_(True)
    entropy = torch.ones_like(logp).requires_grad_(True)
    loss_of(rows, logp, entropy, with_llds).backward()


CLOCK = time.process_time


def interleaved_medians(fn, repeats: int, spread: dict | None = None) -> tuple[float, float]:
    fn(False), fn(True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(repeats):
        for with_llds in ((False, True) if r % 2 == 0 else (True, False)):
            t0 = CLOCK()
            fn(with_llds)
            times[with_llds].append(CLOCK() - t0)
    if spread is not None and repeats >= 4:  # interquartile range / median of the step times
        for k, v in times.items():
            q = statistics.quantiles(v, n=4)
            spread[k] = (q[2] - q[0]) / statistics.median(v)
    return statistics.median(times[False]), statistics.median(times[True])


SHAPES = {"tiny": (16, 128, 384), "qwen0.5b": (2, 16, 48)}  # (B, prompt tokens, response tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,qwen0.5b")
    ap.add_argument("--repeats", default="tiny=15,qwen0.5b=5", help="interleaved whole-step repeats per model")
    ap.add_argument("--objective-repeats", type=int, default=200)
    ap.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    repeats = {k: int(v) for k, v in (kv.split("=") for kv in args.repeats.split(","))}
    ratios, from_parts = {}, {}
    for kind in args.models.split(","):
        b, p, r = SHAPES[kind]
        model = build_model(kind)
        rows = make_rows(model, b, p, r)
        n_params = sum(x.numel() for x in model.parameters())
        t0 = time.perf_counter()
        spread: dict = {}
        base, full = interleaved_medians(lambda w: update(model, rows, w), repeats.get(kind, 5), spread)
        obj_base, obj_full = interleaved_medians(lambda w: objective_only(rows, w), args.objective_repeats)
        ratios[kind] = full / base
        from_parts[kind] = 1 + (obj_full - obj_base) / base
        print(f"[{kind}] {n_params / 1e6:.1f}M params, B={b} prompt={p} response={r}, threads={torch.get_num_threads()}, "
              f"clock={args.clock} "
              f"({time.perf_counter() - t0:.0f} s)")
        print(f"[{kind}] update median: without LLDS {base * 1e3:.1f} ms, with LLDS {full * 1e3:.1f} ms "
              f"(IQR / median: {spread.get(False, float('nan')):.3f}, {spread.get(True, float('nan')):.3f})")
        print(f"[{kind}] objective alone median: without LLDS {obj_base * 1e3:.3f} ms, with {obj_full * 1e3:.3f} ms",
              flush=True)
        del model
    for kind in ratios:
        print(f"RESULT llds_step_overhead_ratio_direct_{kind} {ratios[kind]:.4f}")
        print(f"RESULT llds_step_overhead_ratio_{kind} {from_parts[kind]:.4f}")
    print(f"RESULT llds_step_overhead_ratio {max(from_parts.values()):.4f}")


if __name__ == "__main__":
    main()
