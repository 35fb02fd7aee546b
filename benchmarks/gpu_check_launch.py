"""The GPU check's launch section: what a lent GPU can show of an 8-GPU launch's start, and the first update's LLDS.

- index: two processes on one GPU each put an in-process FAISS Flat index on its own GPU (retriever.use_gpu_index's
  placement, ``DenseKind._on_gpus(..., "own", ...)``) at the same time; each reports the device it chose, its load
  mode and the GPU memory its placement took (the driver's free memory before and after), beside what the memory
  plan counts for it (memory_plan.faiss_flat_shard_bytes of one whole copy). Needs a GPU build of FAISS;
- allocator: two processes allocate the same pattern (large blocks with small persistent ones between them, as the
  update leaves the optimiser's states among its activations), free the large ones and empty PyTorch's cache; one
  with the launch's allocator setting (preflight/allocator.use_expandable_segments), one with PyTorch's default.
  Each reports whether its segments are expandable and how much of what it freed went back to the driver;
- engine: with vLLM importable, a vLLM engine (Model Runner V2 on CUDA, eager, 1,024 sequences, the paper's vocabulary
  of 151,936) is built, put to sleep at level 2, woken without a weight load (the backend must refuse), loaded and
  woken; reports the refusal, the memory the sleeping engine keeps (memory_plan.vllm_asleep_bytes counts its
  bookkeeping and no sampler state) and one generated request after the load;
- llds: the first update of a step, where logp_new should equal logp_old: logp_old by ``step.batch_logprobs`` (eval
  mode, no gradient, packed by prompt), then the first mini-batch's forwards as ``step.micro_step`` runs them (train
  mode, packed, bf16 autocast on a GPU), on uneven synthetic trajectories of the 0.5B shape; the displacement
  d = logp_old - logp_new on response tokens (its largest and mean size), LLDS's active-token fraction and mean
  penalty as the update reports them (``step.update_policy`` with the whole batch as one mini-batch: its only update is
  the first), and the tau the action gate would need to stay closed (the largest sum of d over an action span of a
  response with A >= 0). On a CPU in fp32 the two passes agree to the last bit or nearly; in bf16 they do not.
Each part is guarded like the others' (gpu_check_parts.guarded); a part that cannot run here says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gpu_check_parts import GIB, MODELS, guarded, learner_context, synthetic_batch

HERE = Path(__file__).resolve().parent
INDEX_ROWS = {True: 2_000, False: 200_000}  # smoke: a toy index; GPU: 200k x 768 (0.3 GB of fp16 codes)


# ------------------------------------------------------------------------------------------------------ children
def child_index(rows: int, dim: int) -> dict[str, Any]:
    """One rank's in-process index placed as retriever.use_gpu_index places it; the GPU memory it took."""
    import numpy as np

    from retriever.faiss_index import make_faiss_index
    from retriever.kinds.dense import DenseKind

    index = make_faiss_index(dim, "Flat")
    index.add(np.random.default_rng(0).standard_normal((rows, dim)).astype("float32"))
    torch.cuda.init()
    free_before, total = torch.cuda.mem_get_info()
    placed, load_mode = DenseKind._on_gpus(index, "in_memory", "own", "cpu")
    placed.search(np.zeros((1, dim), dtype="float32"), 1)  # FAISS's temporary memory is in use by now
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    return {"device": torch.cuda.current_device(), "load_mode": load_mode, "taken": free_before - free_after,
            "total": total}


def child_allocator(expandable: bool) -> dict[str, Any]:
    """The fragmentation pattern of the allocator part in this process, with or without the launch's setting."""
    from searchr1_lld.preflight.allocator import use_expandable_segments

    if expandable:
        use_expandable_segments()
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    big, small = [], []
    for _ in range(24):
        big.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        small.append(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))  # stays, between the big ones
    torch.cuda.synchronize()
    free_full, _ = torch.cuda.mem_get_info()
    del big
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    segments = torch.cuda.memory._snapshot()["segments"]
    return {"expandable": all(s.get("is_expandable", False) for s in segments), "freed": 24 * (64 << 20),
            "returned": free_after - free_full}


def run_children(kind: str, args: list[str], count: int, timeout_s: float) -> list[dict[str, Any]]:
    """``count`` child processes of this module at once (``--child KIND ARGS``), each printing one JSON line."""
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}
    procs = [subprocess.Popen([sys.executable, __file__, "--child", kind, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(count)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"{kind} child exited {p.returncode}: {stderr[-800:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


# ------------------------------------------------------------------------------------------------------- parts
def part_index(smoke: bool) -> dict[str, Any]:
    from retriever.faiss_index import gpu_count

    from searchr1_lld.preflight import memory_plan as mp

    if not torch.cuda.is_available() or gpu_count() == 0:
        return {"launch_index_skipped": "needs a GPU and a GPU build of FAISS"}
    rows, dim = INDEX_ROWS[smoke], 768
    ranks = run_children("index", [str(rows), str(dim)], 2, 240)
    return {"launch_index_devices": ",".join(str(r["device"]) for r in ranks),
            "launch_index_load_modes": ",".join(r["load_mode"] for r in ranks),
            "launch_index_taken_gib": max(r["taken"] for r in ranks) / GIB,
            "launch_index_plan_gib": mp.faiss_flat_shard_bytes(rows, dim, 1) / GIB}


def part_allocator() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"launch_allocator_skipped": "needs a GPU"}
    on, off = (run_children("allocator", [flag], 1, 120)[0] for flag in ("1", "0"))
    return {"launch_allocator_expandable": on["expandable"], "launch_allocator_default_expandable": off["expandable"],
            "launch_allocator_returned_share": on["returned"] / on["freed"],
            "launch_allocator_default_returned_share": off["returned"] / off["freed"]}


def llds_first_update(device: torch.device, shapes: dict, smoke: bool, accelerator: Any) -> dict[str, Any]:
    """The first update's displacement and LLDS figures (module docstring)."""
    from searchr1_lld.algo import advantages as adv_fns
    from searchr1_lld.learner import batching, policy_logprobs, step

    rows = shapes["rows"]
    shapes = {**shapes, "rows_per_mini": rows}  # one mini-batch: the step's only update is its first
    learner, vocab = learner_context(MODELS[0], smoke, shapes, accelerator, with_reference=False)
    if not policy_logprobs.use_packed_attention(learner.module):
        raise RuntimeError(f"{learner.module.config._attn_implementation} attention cannot run packed forwards")
    batch = synthetic_batch(rows, shapes["tokens_per_row"], vocab, uneven=True)
    advantages = adv_fns.grpo_outcome_advantages(batch.rewards, batch.group_ids)
    logp_old = step.batch_logprobs(learner, learner.model, batch)
    tc = learner.cfg.trainer
    gen = torch.Generator().manual_seed(step.step_seed(tc.seed, 0, 0, 1))  # the plan update_policy draws at step 0
    plan = batching.plan_updates(batch.attention_mask.sum(1).tolist(), rows, tc.ppo_epochs,
                                 tc.micro_batch_token_budget, gen, tc.micro_batch_size)
    logp_new = torch.zeros_like(logp_old)
    learner.model.train()
    for mb in plan[0]:  # the first update's forwards, as micro_step runs them (with gradient, train mode)
        model_rows = step.model_rows(learner, learner.model, batch, mb)
        lp, _ = step.rows_logprobs(learner, learner.model, model_rows, compute_entropy=True)
        logp_new[torch.as_tensor(mb)] = batching.pad_cols(lp.detach().float().cpu(), logp_new.shape[1])
    d = (logp_old - logp_new) * batch.response_mask
    m = batch.response_mask.bool()
    metrics = step.update_policy(learner, batch, advantages, logp_old, None, None, None, step=0)
    return {"launch_llds_max_abs_displacement": float(d[m].abs().max()),
            "launch_llds_mean_abs_displacement": float(d[m].abs().mean()),
            "launch_llds_tau_to_close_gate": tau_to_close(d, batch.response_mask, advantages),
            "launch_llds_active_token_frac": metrics["llds/active_token_frac"],
            "launch_llds_mean_penalty": metrics["llds/mean_penalty"],
            "launch_llds_dtype": "bf16 autocast" if device.type == "cuda" else "fp32"}


def tau_to_close(d: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> float:
    """The largest sum of d over an action span (a maximal run of mask 1) of a response with A >= 0: the action
    gate stays closed on every response for a tau at least this (0 when no span sum is positive)."""
    worst = 0.0
    for i in range(d.shape[0]):
        if float(advantages[i]) < 0:
            continue
        run = 0.0
        for t in range(d.shape[1]):
            if mask[i, t]:
                run += float(d[i, t])
            else:
                worst, run = max(worst, run), 0.0
        worst = max(worst, run)
    return worst


def part_engine(device: torch.device, tmp: Path) -> dict[str, Any]:
    """The wake guard and what a sleeping V2 engine keeps (module docstring)."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        return {"launch_engine_skipped": f"vllm not importable ({err})"}
    if device.type != "cuda":
        return {"launch_engine_skipped": "sleep mode is CUDA-only"}
    from gpu_check_parts import word_tokenizer
    from transformers import AutoModelForCausalLM, Qwen2Config

    from searchr1_lld.config import RolloutConfig, VLLMConfig
    from searchr1_lld.preflight import memory_plan as mp
    from searchr1_lld.rollout.backends.vllm import VLLMBackend

    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, eos_token_id=1,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp / "model")
    tok = word_tokenizer(config.vocab_size)
    tok.save_pretrained(tmp / "model")
    cfg = RolloutConfig(backend="vllm", max_total_length=1024,
                        vllm=VLLMConfig(gpu_memory_utilization=0.3, enforce_eager=True))
    free0, _ = torch.cuda.mem_get_info()
    engine = VLLMBackend(str(tmp / "model"), tok, cfg, dtype="bfloat16", rank=0, world_size=1,
                         parameter_names={n for n, _ in model.named_parameters()})
    free_awake, _ = torch.cuda.mem_get_info()
    engine.sleep()
    free_asleep, _ = torch.cuda.mem_get_info()
    try:
        engine.wake_up()
        refused = False
    except RuntimeError:
        refused = True
    engine.load_weights((n, p.detach().cuda()) for n, p in model.named_parameters())
    engine.wake_up()
    out = engine.generate([[5, 6, 7]], max_new_tokens=8, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False,
                          seeds=[1])
    return {"launch_engine_wake_refused": refused, "launch_engine_awake_gib": (free0 - free_awake) / GIB,
            "launch_engine_asleep_gib": (free0 - free_asleep) / GIB,
            "launch_engine_plan_asleep_gib": mp.vllm_asleep_bytes(graph_pool_bytes=0.0) / GIB,
            "launch_engine_tokens_after_load": len(out[0].token_ids)}


def section_launch(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """The parts of the module docstring, each guarded."""
    import tempfile

    from accelerate import Accelerator

    out: dict[str, Any] = {}
    guarded(out, "launch_index", lambda: part_index(smoke), device)
    guarded(out, "launch_allocator", part_allocator, device)
    acc = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if device.type == "cuda" else "no")
    guarded(out, "launch_llds", lambda: llds_first_update(device, shapes, smoke, acc), device)
    acc.free_memory()
    with tempfile.TemporaryDirectory() as tmp:
        guarded(out, "launch_engine", lambda: part_engine(device, Path(tmp)), device)
    return out


if __name__ == "__main__":  # a child of the index or allocator part: one JSON line on stdout
    kind, args = sys.argv[2], sys.argv[3:]
    t0 = time.perf_counter()
    result = child_index(int(args[0]), int(args[1])) if kind == "index" else child_allocator(args[0] == "1")
    print(json.dumps({**result, "s": time.perf_counter() - t0}))
