"""The measurements of benchmarks/gpu_check.py, one function per section; each returns {result name: value} and
records a failed part as {"<part>_error": message} so that the rest of its section still runs.

Models are random-initialised from the Qwen2.5 configs in benchmarks/model_configs/ (``--smoke``: the same configs
shrunk to toy width, depth and vocabulary); nothing is downloaded. Every measurement goes through the project's own
code: the HF rollout backend and agent loop (rollout), ``step.update_policy`` / ``step.batch_logprobs`` on a
:class:`~searchr1_lld.learner.state.Learner` and ``learner.step`` (learner, monitor), ``algo.logprobs`` (log-probs).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import platform
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
ZERO2_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "deepspeed" / "zero2.json"
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
GIB = 2**30
# set by gpu_check's child process: the section's results so far are written there after every part, so that a
# section stopped at its time budget still reports the parts it finished
PARTIAL_RESULTS_PATH: Path | None = None


def model_config(name: str, smoke: bool):
    """The HF Qwen2 config of ``name`` (benchmarks/model_configs/<name>.json); smoke: width 32-64, 2 layers, V 512."""
    from transformers import Qwen2Config

    values = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    if smoke:
        width = 32 * (1 + MODELS.index(name) % 2)
        values.update(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_window_layers=2, bos_token_id=0, eos_token_id=1)
    return Qwen2Config(**values)


def random_model(name: str, smoke: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A random-initialised Qwen2ForCausalLM of config ``name``, built on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(model_config(name, smoke), dtype=dtype)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector tracks (parameters, gradients, optimiser
    state, buffers, anything Python holds): on CPU, where there are no allocator statistics, the measure of what
    stays resident. Tensors that only C++ holds (a live autograd graph, caches below Python) are not counted."""
    gc.collect()
    seen: set[tuple[int, str]] = set()
    total = 0
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no attribute look-up on proxies
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            continue
        key = (storage.data_ptr(), str(storage.device))
        if key[0] == 0 or key in seen:  # meta / empty tensors, and views of a storage already counted
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def resident_bytes(device: torch.device) -> int:
    """What is allocated now: CUDA's allocated bytes, or on CPU :func:`live_tensor_bytes`."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else live_tensor_bytes()


def device_facts(device: torch.device) -> dict[str, Any]:
    """The device a section ran on (gpu_check's own process never touches CUDA: it reads these from its sections)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"device": props.name, "cuda": torch.version.cuda, "gpu_memory_gib": props.total_memory / GIB,
                "cpu_count": os.cpu_count()}
    return {"device": f"cpu ({platform.processor() or platform.machine()})", "cuda": None, "gpu_memory_gib": None,
            "cpu_count": os.cpu_count()}


def save_partial(out: dict[str, Any]) -> None:
    """Write the section's results so far to :data:`PARTIAL_RESULTS_PATH` (whole, or not at all)."""
    if PARTIAL_RESULTS_PATH is None:
        return
    tmp = PARTIAL_RESULTS_PATH.with_name(PARTIAL_RESULTS_PATH.name + ".tmp")
    tmp.write_text(json.dumps(out, default=float))
    tmp.replace(PARTIAL_RESULTS_PATH)


def guarded(out: dict[str, Any], part: str, fn: Callable[[], dict[str, Any]], device: torch.device) -> None:
    """Run one part; its results go into ``out``, or its error as ``out[part + "_error"]`` (OOM included)."""
    t0 = time.perf_counter()
    try:
        out.update(fn())
    except Exception as err:  # one part failing (out of memory, ...) must not stop the others
        out[f"{part}_error"] = f"{type(err).__name__}: {err}"[:2000]
        traceback.print_exc()
    finally:
        out[f"{part}_wall_s"] = round(time.perf_counter() - t0, 3)
        free(device)
        save_partial(out)


# --------------------------------------------------------------------------------------------------------------------
# rollout: HF backend + agent loop; bf16 agreement of engine and learner log-probs
# --------------------------------------------------------------------------------------------------------------------


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer whose ids cover a random model's whole vocabulary (``w<id>``; ``<eos>`` and ``<pad>``
    are ids 1 and 2), so that every sampled id decodes and the agent loop's text work is real."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    for i, tok in enumerate(("<unk>", "<eos>", "<pad>")):
        del vocab[f"w{i}"]
        vocab[tok] = i
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")


class PassageRetriever:
    """In-process stand-in of the search service: the same ``search(queries, topk)`` contract over a few fixed
    passages (the query's words pick them), at no encoder cost."""

    def __init__(self, n_passages: int = 32):
        self.docs = [{"id": str(i), "contents": f"\"Title {i}\"\nw{100 + i} w{200 + i} w{300 + i} w{400 + i}"}
                     for i in range(n_passages)]

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        return [[self.docs[(hash(q) + k) % len(self.docs)] for k in range(topk)] for q in queries]


def qa_rows(n: int) -> list[dict]:
    return [{"id": f"q{i}", "question": f"w{10 + i % 50} w{60 + i % 40} w{5 + i % 7}", "golden_answers": [f"w{i}"],
             "data_source": "nq"} for i in range(n)]


def run_rollout(model: torch.nn.Module, tok: Any, rows: list[dict], n: int, shapes: dict, batch_size: int):
    from searchr1_lld.config import RolloutConfig
    from searchr1_lld.rollout import run_agent_loop
    from searchr1_lld.rollout.backends.hf import HFBackend

    cfg = RolloutConfig(max_turns=shapes["max_turns"], max_tokens_per_turn=shapes["max_tokens_per_turn"],
                        max_obs_length=128, max_total_length=4096, topk=3, generation_batch_size=batch_size,
                        temperature=1.0, top_p=1.0)
    backend = HFBackend(model, tok, batch_size=batch_size, seed=0)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        trajs = run_agent_loop(rows, backend=backend, tokenizer=tok, retriever=PassageRetriever(), cfg=cfg, n=n,
                               timings=timings)
    sync(next(model.parameters()).device)
    return trajs, timings, time.perf_counter() - t0


def section_rollout(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """HF-backend rollout throughput and the agent loop's share of the wall time (0.5B, 1.5B at two batch sizes);
    then the engine-vs-learner log-prob gap of sampled responses, bf16 and fp32."""
    out: dict[str, Any] = {}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for name in MODELS[:2]:
        def throughput(name=name) -> dict[str, Any]:
            model = random_model(name, smoke, device, dtype).eval()
            tok = word_tokenizer(model.config.vocab_size)
            run_rollout(model, tok, qa_rows(2), 2, {**shapes, "max_tokens_per_turn": 4}, 4)  # warm-up
            res: dict[str, Any] = {}
            for b in shapes["rollout_batches"]:
                trajs, t, wall = run_rollout(model, tok, qa_rows(b // 4), 4, shapes, b)
                res[f"rollout_tokens_per_s_{name}_b{b}"] = t["generated_tokens"] / wall
                res[f"rollout_loop_overhead_share_{name}_b{b}"] = (wall - t["generate_s"]) / wall
                res[f"rollout_searches_{name}_b{b}"] = sum(tr.valid_searches for tr in trajs)
            return res
        guarded(out, f"rollout_{name}", throughput, device)
    guarded(out, "agreement", lambda: logp_agreement(device, shapes, smoke), device)
    return out


def logp_agreement(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """max and mean |engine log-prob - learner log-prob| over generated tokens of sampled responses (0.5B):
    bf16 engine vs the learner's fp32 master weights under bf16 autocast (the GPU learner), and fp32 vs fp32."""
    from searchr1_lld.learner import policy_logprobs
    from searchr1_lld.rollout.types import to_batch

    res: dict[str, Any] = {}
    name = MODELS[0]
    for tag, engine_dtype, autocast in (("bf16", torch.bfloat16, True), ("fp32", torch.float32, False)):
        learner = random_model(name, smoke, device, torch.float32).eval()
        engine = copy.deepcopy(learner).to(engine_dtype)  # the learner's weights, rounded to the engine's dtype
        tok = word_tokenizer(engine.config.vocab_size)
        b = shapes["agreement_batch"]
        trajs, _, _ = run_rollout(engine, tok, qa_rows(b // 4), 4, shapes, b)
        del engine
        batch = to_batch(trajs, tok.pad_token_id)
        p = batch.prompt_length
        ctx = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else torch.autocast(device.type,
                                                                                                 enabled=False)
        with torch.no_grad(), ctx:
            logp, _ = policy_logprobs.response_logprobs(
                learner, batch.input_ids[:, :-1].to(device), batch.attention_mask[:, :-1].to(device),
                batch.position_ids[:, :-1].to(device), batch.responses.to(device), p - 1, chunk_size=None,
                temperature=1.0, compute_entropy=False)
        gap = (logp.float().cpu() - batch.engine_logprobs).abs()[batch.response_mask > 0]
        res[f"logp_gap_{tag}_max"] = float(gap.max())
        res[f"logp_gap_{tag}_mean"] = float(gap.mean())
        res[f"logp_gap_{tag}_tokens"] = int(gap.numel())
        del learner
        free(device)
    return res


# --------------------------------------------------------------------------------------------------------------------
# learner: one update (step.update_policy) with and without LLDS, peak memory, the monitor's forward
# --------------------------------------------------------------------------------------------------------------------


def synthetic_batch(rows: int, tokens: int, vocab: int, group: int = 4, uneven: bool = False):
    """``rows`` trajectories of ``tokens`` tokens each (prompt 1/8; response: generated, observation, generated,
    answer), rewards alternating 1/0 within groups of ``group``. ``uneven``: row i has ``tokens`` x (1/4 .. 1)
    tokens instead (spread evenly, shuffled), as one-search and three-search trajectories share a batch."""
    from searchr1_lld.rollout.types import Trajectory, to_batch

    g = torch.Generator().manual_seed(0)
    lengths = [tokens] * rows
    if uneven:
        order = torch.randperm(rows, generator=g).tolist()
        lengths = [max(int(tokens * (0.25 + 0.75 * k / max(rows - 1, 1))), 16) for k in order]
    trajs = []
    for i, length in enumerate(lengths):
        p = max(length // 8, 2)
        r = length - p
        obs0, obs1 = r // 3, r // 3 + r // 4
        mask = [1] * obs0 + [0] * (obs1 - obs0) + [1] * (r - obs1)
        answer = [0] * (r - max(r // 16, 1)) + [1] * max(r // 16, 1)
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        trajs.append(Trajectory(row={"id": str(i)}, group_id=i // group, prompt_ids=ids[:p], response_ids=ids[p:],
                                response_mask=mask, answer_mask=answer, engine_logprobs=[-1.0 * m for m in mask],
                                action_spans=[(0, obs0), (obs1, r)], valid_searches=1, reward=float(i % 2 == 0)))
    return to_batch(trajs, pad_token_id=2)


def learner_context(model_name: str, smoke: bool, shapes: dict, accelerator: Any, with_reference: bool):
    from searchr1_lld.config import Config
    from searchr1_lld.distributed import DistributedFacts
    from searchr1_lld.learner import optim
    from searchr1_lld.learner.engines import training_engine
    from searchr1_lld.learner.state import Learner
    from searchr1_lld.learner.step_size import StepSizeController
    from searchr1_lld.rollout.backends.base import BackendBase

    cfg = Config()
    tc = cfg.trainer
    tc.ppo_epochs, tc.ppo_mini_batch_size = 1, shapes["rows_per_mini"]
    tc.micro_batch_token_budget = shapes["micro_rows"] * shapes["tokens_per_row"]
    tc.logprob_chunk_size = 0
    cfg.algorithm.kl_coef = 0.001 if with_reference else 0.0
    cfg.rollout.temperature = 1.0
    dev = accelerator.device
    model = random_model(model_name, smoke, dev, torch.float32)  # fp32 master weights; bf16 via autocast on GPU
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    ref = None
    if with_reference:
        ref = random_model(model_name, smoke, dev, torch.float32).eval().requires_grad_(False)
    step_size = StepSizeController.of(tc.step_size, tc.total_steps)  # off: the benchmark's rate as configured
    optimizer, scheduler = optim.make_optimizer(model, tc, 1000, step_size)
    dist = DistributedFacts.of(accelerator)
    engine = training_engine(accelerator)
    engine.configure(tc)  # DeepSpeed: one micro-batch per engine call, clipping
    model, optimizer = accelerator.prepare(model, optimizer)
    # no rollout (synthetic batches): a backend without an engine, whose vocabulary is the head's every row
    learner = Learner(cfg=cfg, accelerator=accelerator, dist=dist, engine=engine, model=model, optimizer=optimizer,
                      scheduler=scheduler, ref_model=ref, tokenizer=None, backend=BackendBase(), retriever=None,
                      step_size=step_size)
    return learner, model_config(model_name, smoke).vocab_size


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - t0


def learner_update(learner: Any, batch: Any, llds_on: bool, logp_old, logp_ref, advantages) -> float:
    from searchr1_lld.learner import step
    learner.cfg.algorithm.llds.enabled = llds_on  # read by the objective at every update
    _, seconds = timed(lambda: step.update_policy(learner, batch, advantages, logp_old, logp_ref, None, None, step=0),
                       learner.accelerator.device)
    return seconds


def measure_learner(model_name: str, smoke: bool, shapes: dict, accelerator: Any, pairs: int,
                    with_reference: bool, label: str) -> dict[str, Any]:
    """One model: logp_old (and logp_ref), paired update_policy timings LLDS on / off, peak memory, monitor forward."""
    from searchr1_lld.learner import step
    from searchr1_lld.algo import advantages as adv_fns

    dev = accelerator.device
    learner, vocab = learner_context(model_name, smoke, shapes, accelerator, with_reference)
    batch = synthetic_batch(shapes["rows"], shapes["tokens_per_row"], vocab)
    advantages = adv_fns.grpo_outcome_advantages(batch.rewards, batch.group_ids)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    logp_old, t_old = timed(lambda: step.batch_logprobs(learner, learner.model, batch), dev)
    logp_ref, t_ref = (timed(lambda: step.batch_logprobs(learner, learner.ref_model, batch), dev) if with_reference
                       else (None, 0.0))
    learner_update(learner, batch, True, logp_old, logp_ref, advantages)  # warm-up (also allocates AdamW's state)
    persistent = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0  # weights, AdamW state, reference
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(pairs):
        for llds_on in ((True, False) if k % 2 == 0 else (False, True)):
            times[llds_on].append(learner_update(learner, batch, llds_on, logp_old, logp_ref, advantages))
    _, t_monitor = timed(lambda: step.batch_logprobs(learner, learner.model, batch), dev)
    updates = shapes["rows"] // shapes["rows_per_mini"]  # optimiser steps per update_policy call
    on, off = statistics.median(times[True]), statistics.median(times[False])
    res = {f"{label}_optimizer_step_s_llds_on": on / updates, f"{label}_optimizer_step_s_llds_off": off / updates,
           f"{label}_llds_step_overhead_ratio": statistics.median(a / b for a, b in zip(times[True], times[False])),
           f"{label}_monitor_forward_s": t_monitor,
           f"{label}_monitor_forward_share": t_monitor / (t_old + t_ref + on + t_monitor),
           f"{label}_tokens_per_micro_batch": shapes["micro_rows"] * shapes["tokens_per_row"],
           f"{label}_with_reference": int(with_reference)}
    if dev.type == "cuda":
        res[f"{label}_peak_gib"] = torch.cuda.max_memory_allocated(dev) / GIB
        res[f"{label}_persistent_gib"] = persistent / GIB
    else:
        res[f"{label}_peak_gib"] = None  # no allocator statistics on CPU
        res[f"{label}_persistent_gib"] = None
    return res


def measure_packing(smoke: bool, shapes: dict, accelerator: Any) -> dict[str, Any]:
    """The smallest model on uneven trajectories (``synthetic_batch(uneven=True)``): update_policy with packed
    forwards (trainer.pack_sequences, the packed attention) against padded rows, paired and alternating; the padded
    share of the padded forwards' positions, each path's tokens/s, their ratio, and the largest |log-prob|
    difference between the two paths on the response tokens (bf16 autocast on GPU)."""
    from searchr1_lld.algo import advantages as adv_fns
    from searchr1_lld.learner import policy_logprobs, step

    dev = accelerator.device
    learner, vocab = learner_context(MODELS[0], smoke, shapes, accelerator, with_reference=False)
    if not policy_logprobs.use_packed_attention(learner.module):
        raise RuntimeError(f"{learner.module.config._attn_implementation} attention cannot run packed forwards")
    batch = synthetic_batch(shapes["rows"], shapes["tokens_per_row"], vocab, uneven=True)
    advantages = adv_fns.grpo_outcome_advantages(batch.rewards, batch.group_ids)
    tokens = float(batch.attention_mask.sum())

    def run(packed: bool) -> tuple[dict[str, float], float]:
        learner.cfg.trainer.pack_sequences = packed
        return timed(lambda: step.update_policy(learner, batch, advantages, logp_old, None, None, None, step=0), dev)

    learner.cfg.trainer.pack_sequences = False
    logp_padded = step.batch_logprobs(learner, learner.model, batch)
    learner.cfg.trainer.pack_sequences = True
    logp_old = step.batch_logprobs(learner, learner.model, batch)
    gap = (logp_old - logp_padded).abs()[batch.response_mask.bool()].max().item()
    run(True)  # warm-up (also allocates AdamW's state)
    times: dict[bool, list[float]] = {True: [], False: []}
    padded_share = float("nan")
    for k in range(shapes["pairs"][MODELS[0]]):
        for packed in ((True, False) if k % 2 == 0 else (False, True)):
            metrics, seconds = run(packed)
            times[packed].append(seconds)
            if not packed:
                padded_share = metrics.get("actor/padded_token_share", float("nan"))
    packed_s, padded_s = statistics.median(times[True]), statistics.median(times[False])
    return {"packing_padded_token_share": padded_share, "packing_update_tokens_per_s_padded": tokens / padded_s,
            "packing_update_tokens_per_s_packed": tokens / packed_s, "packing_packed_over_padded": padded_s / packed_s,
            "packing_logprob_max_gap": gap}


def section_learner(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """0.5B / 1.5B / 3B, one after the other in one process (accelerate, bf16 autocast on GPU, gradient
    checkpointing, AdamW). The accelerator keeps every model and optimiser it prepared, so each model's are released
    before the next is built, and ``learner_<model>_resident_before_gib`` records what is still allocated then
    (:func:`resident_bytes`): at the section's baseline, the first model's figure, when nothing was kept."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if device.type == "cuda" else "no")
    out: dict[str, Any] = {}
    for name in MODELS:
        acc.free_memory()  # drops the accelerator's references to the previous model and optimiser
        free(device)
        out[f"learner_{name}_resident_before_gib"] = resident_bytes(device) / GIB
        guarded(out, f"learner_{name}", lambda name=name: measure_learner(
            name, smoke, shapes, acc, shapes["pairs"][name], shapes["reference"][name], f"learner_{name}"), device)
    acc.free_memory()
    free(device)
    out["packing_resident_before_gib"] = resident_bytes(device) / GIB
    guarded(out, "packing", lambda: measure_packing(smoke, shapes, acc), device)
    return out


def deepspeed_launch_environment(config_file: Path) -> dict[str, str]:
    """What ``accelerate launch`` with configs/accelerate/zero2_8gpu.yaml puts in a rank's environment for DeepSpeed
    (its JSON file, no zero3_init, mixed precision left to the trainer), for one rank of one."""
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config_file),
            "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false", "ACCELERATE_MIXED_PRECISION": "no",
            "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def section_zero2(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """1.5B under DeepSpeed ZeRO-2 on one rank, when DeepSpeed is importable, set up as a launched run is: the
    project's configs/deepspeed/zero2.json (fp32 gradient reduction and accumulation, its bucket sizes) through
    accelerate's DeepSpeed plugin, the accelerator of ``factories.make_accelerator`` (bf16 on GPU), the trainer's
    overrides of the DeepSpeed training engine's ``configure``. Records the settings the engine ran with (``zero2_engine_*``)."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as err:
        return {"zero2_skipped": f"deepspeed not importable ({err})"}
    from searchr1_lld.learner import factories
    from searchr1_lld.config import Config
    from searchr1_lld.distributed import free_ports

    os.environ.update(deepspeed_launch_environment(ZERO2_CONFIG))
    os.environ.setdefault("MASTER_PORT", str(free_ports(1)[0]))
    cfg = Config()
    cfg.trainer.device = device.type
    acc = factories.make_accelerator(cfg)
    out: dict[str, Any] = {"zero2_config_file": str(ZERO2_CONFIG.relative_to(ZERO2_CONFIG.parents[2]))}
    guarded(out, "zero2", lambda: measure_learner(MODELS[1], smoke, shapes, acc, 1, False, "zero2_" + MODELS[1]),
            device)
    wrapped = getattr(acc, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        engine = wrapped.engine
        model_dtype, grad_accum_dtype = engine.get_data_types()
        out.update(zero2_engine_zero_stage=engine.zero_optimization_stage(),
                   zero2_engine_model_dtype=str(model_dtype), zero2_engine_grad_accum_dtype=str(grad_accum_dtype),
                   zero2_engine_communication_data_type=str(engine.communication_data_type),
                   zero2_engine_reduce_bucket_size=int(engine.zero_reduce_bucket_size()),
                   zero2_engine_gradient_clipping=float(engine.gradient_clipping()))
    return out


# --------------------------------------------------------------------------------------------------------------------
# log-probs: the fused (tiled) path against the naive one, memory and time; a tile-budget sweep
# --------------------------------------------------------------------------------------------------------------------


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_and_time(fn: Callable[[], None], device: torch.device) -> tuple[int, float]:
    """(peak bytes allocated above the start, seconds) of ``fn``: CUDA allocator peak, or on CPU the peak RSS."""
    sync(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = _rss("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := current RSS
    t0 = time.perf_counter()
    fn()
    sync(device)
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss("VmHWM")) - base
    return peak, seconds


def section_logprobs(device: torch.device, shapes: dict, smoke: bool) -> dict[str, Any]:
    """Forward + backward of token log-prob + entropy from hidden states [1, T, H] and the LM head [V, H] (both
    requiring grad): fused tiles (``linear_logprobs_entropy``, tile sized to the device) vs naive (logits, then the
    full fp32 log-softmax), in the GPU learner's bf16 (``_bf16``) and with fp32 master weights under bf16 autocast
    (``_autocast``, the accelerate learner; the fused path's products then run in fp32, the weight's dtype, so that
    its backward recomputes the forward's logits bit for bit, while the naive path's head runs in bf16); then the
    CUDA tile budget swept at the largest T."""
    from searchr1_lld.algo import logprobs as lp

    v, h = shapes["vocab"], shapes["logprob_hidden"]
    out: dict[str, Any] = {}

    def run(t: int, variant: str, mode: str, tile_rows: int | None = None) -> tuple[int, float]:
        torch.manual_seed(0)
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        hidden = torch.randn(1, t, h, device=device, dtype=dtype).requires_grad_(True)
        weight = (torch.randn(v, h, device=device, dtype=dtype) / h**0.5).requires_grad_(True)
        labels = torch.randint(0, v, (1, t), device=device)
        amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "autocast")

        def fwd_bwd() -> None:
            with amp:
                if variant == "naive":
                    logp, ent = lp.naive_logprobs_entropy(torch.nn.functional.linear(hidden, weight), labels)
                else:
                    logp, ent = lp.linear_logprobs_entropy(hidden, weight, labels, chunk_size=tile_rows)
            (logp.sum() + 0.1 * ent.sum()).backward()

        fwd_bwd()  # warm-up: kernels, allocator
        hidden.grad = weight.grad = None
        result = peak_and_time(fwd_bwd, device)
        hidden.grad = weight.grad = None
        return result  # the tensors go with this frame; the caller's guard frees the cache

    for t in shapes["logprob_tokens"]:
        for mode in ("bf16", "autocast"):
            def compare(t=t, mode=mode) -> dict[str, Any]:
                (pf, tf), (pn, tn) = run(t, "fused", mode), run(t, "naive", mode)
                return {f"logprob_fused_peak_gib_T{t}_{mode}": pf / GIB, f"logprob_naive_peak_gib_T{t}_{mode}": pn / GIB,
                        f"logprob_fused_s_T{t}_{mode}": tf, f"logprob_naive_s_T{t}_{mode}": tn,
                        f"logprob_peak_ratio_T{t}_{mode}": pf / max(pn, 1), f"logprob_time_ratio_T{t}_{mode}": tf / tn}
            guarded(out, f"logprob_T{t}_{mode}", compare, device)
    t_max = max(shapes["logprob_tokens"])
    for mib in shapes["tile_sweep_mib"]:
        rows = lp.tile_shape(v, "cuda", tile_bytes=mib * 2**20)[0]

        def sweep(mib=mib, rows=rows) -> dict[str, Any]:
            peak, seconds = run(t_max, "fused", "bf16", tile_rows=rows)
            return {f"logprob_tile_{mib}mib_rows": rows, f"logprob_tile_{mib}mib_s_T{t_max}": seconds,
                    f"logprob_tile_{mib}mib_peak_gib_T{t_max}": peak / GIB}
        guarded(out, f"logprob_tile_{mib}mib", sweep, device)
    out["logprob_tile_rows_chosen"], out["logprob_tile_vocab_chosen"] = lp.tile_shape(v, device.type)
    return out


# this module's sections; gpu_check.py adds those of gpu_check_e2e.py and gpu_check_launch.py, which build on the parts
# here (the modules import this one, never the other way)
SECTIONS: dict[str, Callable[[torch.device, dict, bool], dict[str, Any]]] = {
    "rollout": section_rollout, "learner": section_learner, "zero2": section_zero2, "logprobs": section_logprobs}
