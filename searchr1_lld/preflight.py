"""``train.py --preflight``: whether a run can start, and what it will take, before the first GPU-hour.

Checks (each a line; a problem makes the exit status 2, one line per problem on stderr):
    config      resolved and validated (a bad key already stops ``load_config`` with one line)
    data        every rows file exists and parses (its rows counted); FlashRAG names: the local mirror, if set
    retriever   in-process: the index dir's manifest, its files' sizes, the encoder against retriever.expect_encoder;
                http: ``GET /health`` answers (no retries), its encoder against retriever.expect_encoder
    model       a local dir: config.json and a tokenizer; a hub id: in the HF cache, else (HF_HUB_OFFLINE) a problem
                saying it cannot be downloaded here, else the hub is asked (unreachable: a note, not verified)

The resource plan (computed from the model's config, never measured), P = parameters, W = processes, z = ZeRO
stage, b = bytes of a training weight (2 with DeepSpeed bf16, else 4: the learner keeps fp32 weights under autocast):
    weights            b P, divided by W under ZeRO-3
    optimiser          DeepSpeed bf16: fp32 master + Adam m, v = 12 P; fp32: Adam m, v = 8 P; divided by W for z >= 1;
                       0 on the GPU with offload_optimizer (then in host RAM)
    gradients          z >= 2: the fp32 partition 4 P / W + one reduce bucket (DeepSpeed's 5e8 elements x b);
                       else the full fp32 gradients 4 P (present during the update only)
    reference          (algorithm.kl_coef > 0) b P in the policy's dtype, divided by W under ZeRO-3
    engine copy        ZeRO-3 with the HF engine: a full copy b P
    vLLM engine        reserves rollout.vllm_gpu_memory_utilization x GPU memory for weights + KV cache (the KV cache is
                       not counted separately: vLLM reserves it); asleep (sleep mode, level 1 or 2) it holds ~0
    HF engine          KV cache = generation_batch_size x max_total_length x 2 x layers x kv_heads x head_dim x b
    activations        logits of one micro-batch and their gradient 2 x micro_batch_token_budget x vocab x b, plus
                       with gradient checkpointing the layer inputs layers x tokens x hidden x b (without it the
                       full activations, not estimated)
    CUDA context       1 GiB per process
    rollout per GPU  = weights + optimiser + (z >= 2: gradient partition) + reference + engine copy + engine + context
    update per GPU   = weights + optimiser + gradients + reference + engine copy + activations + engine asleep + context
    host RAM / node  = loading: W_node x (4 P policy + 4 P reference), divided by W with zero3_init_flag; steady:
                       offloaded optimiser + sleep level 1 weights (2 P per rank) + in-process index per rank
    disk / checkpoint= policy/ (b P) + optimiser state (DeepSpeed: b P module + 12 P; else 8 P), times
                       trainer.keep_last_k (+1 with trainer.keep_best)
    evaluation       = questions per evaluation (limits applied), at most (eval.max_turns + 1) x max_tokens_per_turn
                       generated tokens each, against the training trajectories of eval_every steps
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = float(1 << 30)
CUDA_CONTEXT_BYTES = 1 * GiB
DS_REDUCE_BUCKET_ELEMENTS = 5e8  # DeepSpeed's default reduce_bucket_size
DEFAULT_GPU_GIB = 80.0
MARGIN = 0.10  # a plan closer than this to the GPU's memory gets a warning


@dataclass
class ModelShape:
    """What the plan needs of a model: parameter count and the sizes of its KV cache and logits."""

    params: int
    vocab: int
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int


@dataclass
class Launch:
    """How the run is launched (an accelerate config): processes, machines, DeepSpeed's ZeRO stage and options."""

    processes: int = 1
    machines: int = 1
    deepspeed: bool = False
    zero_stage: int = 0  # 0: no ZeRO (DDP or one process)
    bf16: bool = False
    offload_optimizer: bool = False
    zero3_init: bool = False  # zero3_init_flag: ZeRO-3 loads the model partitioned
    source: str = "one process, no DeepSpeed (--accelerate-config FILE for the launcher's)"


@dataclass
class Preflight:
    """The outcome: lines that passed, notes (not verified, warnings), problems (the run cannot start), the plan."""

    ok: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------- model and launch
def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A decoder's size from its HF config.json (Llama / Qwen2 layout):
    P = V h (embeddings) [+ V h untied lm_head] + h (final norm)
        + layers x (h (q) + 2 kv d (k, v)) x h + h h (o) [+ q/k/v biases (Qwen2)] + 3 h I (MLP) + 2 h (norms))."""
    text = config.get("text_config") or config
    h, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
    heads = int(text["num_attention_heads"])
    kv = int(text.get("num_key_value_heads") or heads)
    d = int(text.get("head_dim") or h // heads)
    inter = int(text["intermediate_size"])
    bias = text.get("attention_bias", text.get("model_type") == "qwen2")
    attn = h * heads * d + 2 * h * kv * d + heads * d * h + ((heads + 2 * kv) * d if bias else 0)
    per_layer = attn + 3 * h * inter + 2 * h
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    params = vocab * h * (1 if tied else 2) + h + layers * per_layer
    return ModelShape(params, vocab, h, layers, kv, d)


def safetensors_params(model_dir: Path) -> int | None:
    """The exact parameter count of a model dir's ``*.safetensors`` (their headers only), None without any."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def read_launch(path: str | Path) -> Launch:
    """An accelerate config (YAML) -> :class:`Launch` (its ``deepspeed_config`` keys, or the DeepSpeed JSON its
    ``deepspeed_config_file`` names)."""
    from searchr1_lld.config import read_yaml

    acc = read_yaml(path)
    ds = acc.get("deepspeed_config") or {}
    launch = Launch(processes=int(acc.get("num_processes") or 1), machines=int(acc.get("num_machines") or 1),
                    deepspeed=acc.get("distributed_type") == "DEEPSPEED", bf16=acc.get("mixed_precision") == "bf16",
                    source=str(path))
    if ds.get("deepspeed_config_file"):
        ds_file = Path(ds["deepspeed_config_file"])
        ds_json = json.loads((ds_file if ds_file.is_file() else Path(path).parent / ds_file).read_text())
        zero = ds_json.get("zero_optimization") or {}
        launch.zero_stage = int(zero.get("stage") or 0)
        launch.offload_optimizer = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
        launch.bf16 = launch.bf16 or bool((ds_json.get("bf16") or {}).get("enabled"))
    else:
        launch.zero_stage = int(ds.get("zero_stage") or 0)
        launch.offload_optimizer = ds.get("offload_optimizer_device", "none") not in ("none", None)
    launch.zero3_init = bool(ds.get("zero3_init_flag", False))
    return launch


# ------------------------------------------------------------------------------------------------- the plan (pure)
def learner_bytes(params: int, launch: Launch, *, reference: bool, hf_engine_copy: bool) -> dict[str, float]:
    """Per-GPU learner tensors in bytes: weights, optimiser, gradients (during the update), gradient partition (held
    through the rollout too), reference, engine copy (formulas: module docstring)."""
    p, w, z = float(params), launch.processes, launch.zero_stage
    b = 2.0 if (launch.deepspeed and launch.bf16) else 4.0
    shard = w if (launch.deepspeed and z == 3) else 1
    if launch.deepspeed:
        optimizer = 0.0 if launch.offload_optimizer else (12 if b == 2 else 8) * p / (w if z >= 1 else 1)
        persistent_grads = 4 * p / w + DS_REDUCE_BUCKET_ELEMENTS * b if z >= 2 else 0.0
    else:
        optimizer, persistent_grads = 8 * p, 0.0
    return {
        "weights": b * p / shard,
        "optimizer": optimizer,
        "gradients": persistent_grads or 4 * p,
        "gradient partition": persistent_grads,
        "reference": b * p / shard if reference else 0.0,
        "engine copy": b * p if hf_engine_copy else 0.0,
    }


def activation_bytes(shape: ModelShape, tokens: int, *, bytes_per: float, checkpointing: bool) -> float:
    """Logits of one micro-batch and their gradient, plus checkpointed layer inputs (module docstring)."""
    logits = 2.0 * tokens * shape.vocab * bytes_per
    return logits + (shape.layers * tokens * shape.hidden * bytes_per if checkpointing else 0.0)


def kv_cache_bytes(shape: ModelShape, sequences: int, length: int, bytes_per: float) -> float:
    """KV cache of ``sequences`` sequences of ``length`` tokens: 2 (K, V) x layers x kv_heads x head_dim x bytes."""
    return float(sequences) * length * 2 * shape.layers * shape.kv_heads * shape.head_dim * bytes_per


def gpu_plan(cfg: Any, shape: ModelShape, launch: Launch, device_bytes: float,
             on_gpu: bool = True) -> dict[str, dict[str, float]]:
    """``{"rollout": {part: bytes}, "update": {part: bytes}}`` per GPU (module docstring; no CUDA context when
    not ``on_gpu``)."""
    r = cfg.rollout
    vllm = r.backend == "vllm"
    learner = learner_bytes(shape.params, launch, reference=cfg.algorithm.kl_coef > 0,
                            hf_engine_copy=launch.deepspeed and launch.zero_stage == 3 and not vllm)
    b = 2.0 if (launch.deepspeed and launch.bf16) or cfg.model.dtype in ("bfloat16", "float16") else 4.0
    engine = (r.vllm_gpu_memory_utilization * device_bytes if vllm
              else kv_cache_bytes(shape, r.generation_batch_size, r.max_total_length, b))
    asleep = 0.0 if (vllm and r.vllm_enable_sleep_mode) else engine if vllm else 0.0
    common = {k: learner[k] for k in ("weights", "optimizer", "reference", "engine copy")}
    rollout = {**common, "gradient partition": learner["gradient partition"],
               "vLLM reservation" if vllm else "HF KV cache": engine, "CUDA context": CUDA_CONTEXT_BYTES * on_gpu}
    update = {**common, "gradients": learner["gradients"],
              "activations": activation_bytes(shape, cfg.trainer.micro_batch_token_budget, bytes_per=b,
                                              checkpointing=cfg.model.gradient_checkpointing),
              "engine asleep" if vllm else "HF KV cache (freed)": asleep, "CUDA context": CUDA_CONTEXT_BYTES * on_gpu}
    return {"rollout": rollout, "update": update}


def host_ram_bytes(cfg: Any, shape: ModelShape, launch: Launch, index_bytes: float) -> dict[str, float]:
    """Host RAM per node: ``{"loading": ..., "steady": ...}`` (module docstring)."""
    p, per_node = float(shape.params), max(1, launch.processes // max(1, launch.machines))
    load = 4 * p * (2 if cfg.algorithm.kl_coef > 0 else 1)
    if launch.deepspeed and launch.zero_stage == 3 and launch.zero3_init:
        load /= launch.processes
    steady = 12 * p / launch.processes * per_node if launch.offload_optimizer else 0.0
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm_enable_sleep_mode and cfg.rollout.vllm_sleep_level == 1:
        steady += 2 * p * per_node
    if cfg.retriever.mode == "inprocess":
        steady += index_bytes * per_node
    return {"loading": load * per_node, "steady": steady}


def checkpoint_bytes(params: int, launch: Launch) -> float:
    """One checkpoint on disk: policy/ + the optimiser state (module docstring)."""
    p = float(params)
    if launch.deepspeed:
        b = 2.0 if launch.bf16 else 4.0
        return b * p + b * p + (12 if b == 2 else 8) * p
    return 4 * p + 8 * p


def eval_plan(cfg: Any, sizes: dict[str, int]) -> list[str]:
    """Lines on the evaluation during training: questions per evaluation, their worst-case generated tokens, how
    many evaluations, and their trajectories against the training trajectories of eval_every steps."""
    tc, e, r = cfg.trainer, cfg.eval, cfg.rollout
    limit = tc.eval_limit or e.limit
    per_set = {k: (min(n, limit) if limit else n) for k, n in sizes.items()}
    questions = sum(per_set.values())
    if not questions:
        return ["evaluation: none (no data.test_files, no eval.datasets)"]
    listing = ", ".join(f"{k} {n:,}" for k, n in per_set.items())
    tokens = questions * (e.max_turns + 1) * r.max_tokens_per_turn
    lines = [f"evaluation: {questions:,} questions per evaluation ({listing}); at most {tokens / 1e6:.2f} M generated "
             f"tokens each ({e.max_turns + 1} turns x {r.max_tokens_per_turn})"]
    if tc.eval_every:
        count = math.ceil(tc.total_steps / tc.eval_every)
        train = tc.eval_every * tc.train_batch_size * r.n
        lines.append(f"evaluation every {tc.eval_every} steps: {count} evaluations; each is {questions:,} greedy "
                     f"trajectories against {train:,} training trajectories in {tc.eval_every} steps "
                     f"({100.0 * questions / train:.1f} %)")
    else:
        lines.append("evaluation during training: off (trainer.eval_every=0)")
    return lines


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB" if x >= 0.05 * GiB else f"{x / (1 << 20):.2f} MiB"


def _count(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.3g} M"


# ------------------------------------------------------------------------------------------------- the checks
def check_rows(pf: Preflight, key: str, paths: list[str]) -> dict[str, int]:
    """Each rows file exists and parses; ``{path: rows}`` of the good ones."""
    from searchr1_lld.jsonl import read_rows

    counts = {}
    for path in paths:
        try:
            rows = read_rows(path)
        except (OSError, ValueError) as e:
            pf.problems.append(f"{key}: {' '.join(str(e).split())}")
            continue
        if not rows:
            pf.problems.append(f"{key}: {path} holds no rows")
            continue
        counts[path] = len(rows)
        pf.ok.append(f"{key}: {path}: {len(rows):,} rows")
    return counts


def _flashrag_sets(pf: Preflight, key: str, names: list[str], split: str | None) -> dict[str, int]:
    """FlashRAG datasets: read from the local mirror ($FLASHRAG_LOCAL_DIR) when set, else noted (hub, at start)."""
    from searchr1_lld.data import flashrag

    local = os.environ.get(flashrag.LOCAL_DIR_ENV)
    sizes = {}
    for name in names:
        want = split or flashrag.EVAL_SPLITS.get(name, "train")
        if local:
            if want not in flashrag.local_splits(local, name):
                pf.problems.append(f"{key}: {name}/{want} is not in the local FlashRAG mirror {local} "
                                   f"(${flashrag.LOCAL_DIR_ENV})")
                continue
            pf.ok.append(f"{key}: {name}/{want} in the local FlashRAG mirror {local}")
        else:
            pf.notes.append(f"{key}: {name}/{want} comes from the hub ({flashrag.HUB_REPO}) at start: not verified "
                            f"here (${flashrag.LOCAL_DIR_ENV} names a local mirror)")
        if want != "train":
            sizes[name] = flashrag.EXPECTED_EVAL_COUNTS[name]
    return sizes


def check_data(pf: Preflight, cfg: Any) -> dict[str, int]:
    """Training and evaluation rows; returns the evaluation sets' sizes ``{name: questions}``."""
    from searchr1_lld.evaluation import dataset_name, parse_datasets

    d = cfg.data
    if d.source == "files":
        if not d.train_files:
            pf.problems.append("data.train_files is empty: name the training rows (JSONL/parquet)")
        check_rows(pf, "data.train_files", d.train_files)
    else:
        from searchr1_lld.data import flashrag

        _flashrag_sets(pf, f"data.train_mix={d.train_mix}", flashrag.TRAIN_MIXES[d.train_mix], "train")
    sizes = {f"test_files {Path(p).name}": n for p, n in check_rows(pf, "data.test_files", d.test_files).items()}
    if cfg.eval.datasets and cfg.trainer.eval_every:
        for spec in parse_datasets(cfg.eval.datasets):
            name, sep, path = spec.partition("=")
            if sep:
                sizes.update({dataset_name(spec): n for n in check_rows(pf, f"eval.datasets {name}", [path]).values()})
            else:
                sizes.update(_flashrag_sets(pf, "eval.datasets", [name], None))
    return sizes


def check_retriever(pf: Preflight, cfg: Any) -> float:
    """The index (in-process) or the service (http); returns the index's bytes in host RAM (0 for http)."""
    rc = cfg.retriever
    expect = rc.expect_encoder
    if rc.mode == "http":
        import httpx

        headers = {"Authorization": f"Bearer {rc.token}"} if rc.token else {}
        try:
            health = httpx.get(rc.url.rstrip("/") + "/health", timeout=min(5.0, rc.timeout_s), headers=headers).json()
        except (httpx.HTTPError, ValueError) as e:
            pf.problems.append(f"retriever.url {rc.url}: not reachable ({type(e).__name__}: {e}); start "
                               "`python -m retriever serve --index DIR` first")
            return 0.0
        encoder = health.get("encoder")
        if expect and encoder and Path(str(encoder)).name != Path(expect).name:
            pf.problems.append(f"retriever.url {rc.url} serves an index built with encoder {encoder!r}, "
                               f"retriever.expect_encoder is {expect!r}")
        else:
            pf.ok.append(f"retriever: {rc.url} answers: {health.get('retriever')} index of "
                         f"{health.get('num_docs')} docs, encoder {encoder}")
        return 0.0
    if not rc.index_dir:
        pf.problems.append("retriever.index_dir is empty (retriever.mode=inprocess): build one with "
                           "`python -m retriever build` or use retriever.mode=http")
        return 0.0
    from retriever.manifest import check_manifest, read_manifest, verify_files

    try:
        manifest = read_manifest(rc.index_dir)
        verify_files(rc.index_dir, manifest, skip_hash=True)
        check_manifest(manifest, encoder=expect, index_dir=rc.index_dir)
    except (OSError, ValueError) as e:
        pf.problems.append(f"retriever.index_dir: {' '.join(str(e).split())}")
        return 0.0
    size = float(sum(v["bytes"] for v in (manifest.get("checksums") or {}).values()))
    pf.ok.append(f"retriever: {rc.index_dir}: {manifest['retriever']} index of {manifest['num_docs']:,} docs"
                 + (f", encoder {manifest['encoder']}" if manifest.get("encoder") else "")
                 + f", file sizes as built ({_gib(size)})")
    return size


def _local_dir_problem(path: Path, what: str, markers: tuple[str, ...]) -> str | None:
    if not path.is_dir():
        return f"{what}: {path} does not exist"
    return None if any((path / m).is_file() for m in markers) else f"{what}: {path} has no {' or '.join(markers)}"


def check_model(pf: Preflight, cfg: Any) -> ModelShape | None:
    """model.path (and model.tokenizer_path): a local dir with config.json + tokenizer, or a hub id in the HF cache;
    returns the model's shape when its config could be read."""
    from searchr1_lld.cli import looks_like_local_path

    path, tok = cfg.model.path, cfg.model.tokenizer_path
    if not path:
        pf.problems.append("model.path is empty: name the policy (a local model dir or a hub id)")
        return None
    tokenizer_markers = ("tokenizer.json", "tokenizer_config.json")
    if looks_like_local_path(path) or Path(path).exists():
        problem = _local_dir_problem(Path(path), "model.path", ("config.json",))
        if problem is None and not tok:
            problem = _local_dir_problem(Path(path), "model.path (its tokenizer)", tokenizer_markers)
        if problem is None and tok and (looks_like_local_path(tok) or Path(tok).exists()):
            problem = _local_dir_problem(Path(tok), "model.tokenizer_path", tokenizer_markers)
        if problem:
            pf.problems.append(problem)
            return None
        shape = shape_from_config(json.loads((Path(path) / "config.json").read_text()))
        exact = safetensors_params(Path(path))
        if exact:
            shape.params = exact
        pf.ok.append(f"model.path {path}: local model dir, {_count(shape.params)} parameters")
        return shape
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        shape = shape_from_config(json.loads(Path(cached).read_text()))
        pf.ok.append(f"model.path {path}: hub id, in the HF cache ({_count(shape.params)} parameters)")
        return shape
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        pf.problems.append(f"model.path {path}: hub id not in the HF cache, and HF_HUB_OFFLINE=1: it cannot be "
                           "verified or downloaded here (download it where the hub is reachable, or point model.path "
                           "at a local copy)")
        return None
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        get_hf_file_metadata(hf_hub_url(path, "config.json"), timeout=10)
        pf.notes.append(f"model.path {path}: on the hub, not in the HF cache: downloaded at start (no memory plan "
                        "before it is cached)")
    except Exception as e:  # noqa: BLE001 - any failure to reach the hub: not verified
        pf.notes.append(f"model.path {path}: hub id not in the HF cache and the hub did not answer "
                        f"({type(e).__name__}): not verified")
    return None


# ------------------------------------------------------------------------------------------------- the whole check
def _device_bytes(device_gib: float | None) -> tuple[float, str]:
    if device_gib:
        return device_gib * GiB, f"{device_gib:g} GiB (--gpu-memory-gib)"
    import torch

    if torch.cuda.is_available():
        total = float(torch.cuda.get_device_properties(0).total_memory)
        return total, f"{total / GiB:.1f} GiB ({torch.cuda.get_device_name(0)})"
    return DEFAULT_GPU_GIB * GiB, f"{DEFAULT_GPU_GIB:g} GiB (assumed: no GPU here; --gpu-memory-gib sets it)"


def _plan_lines(pf: Preflight, cfg: Any, shape: ModelShape, launch: Launch, device_gib: float | None,
                index_bytes: float) -> None:
    import torch

    on_gpu = cfg.trainer.device == "cuda" or cfg.rollout.backend == "vllm" or (
        cfg.trainer.device == "auto" and (torch.cuda.is_available() or launch.deepspeed and launch.processes > 1))
    device_bytes, device_text = _device_bytes(device_gib)
    zero = f"DeepSpeed ZeRO-{launch.zero_stage}" if launch.deepspeed else "no DeepSpeed"
    pf.plan.append(f"launch: {launch.processes} process(es) on {launch.machines} machine(s), {zero}"
                   f"{', bf16' if launch.bf16 else ''}{', optimiser offloaded' if launch.offload_optimizer else ''} "
                   f"[{launch.source}]; model {_count(shape.params)} parameters")
    unit = f"per GPU of {device_text}" if on_gpu else "per process (CPU run: host memory)"
    for phase, parts in gpu_plan(cfg, shape, launch, device_bytes, on_gpu).items():
        total = sum(parts.values())
        listing = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items() if v)
        pf.plan.append(f"{phase}: {_gib(total)} {unit} ({listing})")
        if on_gpu and total > device_bytes:
            pf.problems.append(f"plan: the {phase} needs {_gib(total)} per GPU, more than the GPU's "
                               f"{_gib(device_bytes)} ({listing})")
        elif on_gpu and total > (1 - MARGIN) * device_bytes:
            pf.notes.append(f"plan: the {phase} leaves under {MARGIN:.0%} of the GPU free ({_gib(total)} of "
                            f"{_gib(device_bytes)}); allocator fragmentation is not counted")
    if cfg.rollout.backend == "vllm" and not cfg.rollout.vllm_enable_sleep_mode:
        pf.notes.append("plan: rollout.vllm_enable_sleep_mode=false: the engine keeps its reservation through the "
                        "update")
    if cfg.retriever.use_gpu_index:
        pf.notes.append(f"plan: retriever.use_gpu_index puts the index ({_gib(index_bytes)}) on the GPUs as well, "
                        "not counted above")
    ram = host_ram_bytes(cfg, shape, launch, index_bytes)
    pf.plan.append(f"host RAM per node: {_gib(ram['loading'])} while loading, {_gib(ram['steady'])} steady "
                   "(offloaded optimiser, sleeping weights, in-process index)")
    per_ckpt = checkpoint_bytes(shape.params, launch)
    kept = cfg.trainer.keep_last_k + (1 if cfg.trainer.keep_best else 0)
    out = Path(cfg.trainer.output_dir).resolve()
    existing = next((p for p in [out, *out.parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    pf.plan.append(f"disk: {_gib(per_ckpt)} per checkpoint x {kept} kept = {_gib(per_ckpt * kept)} "
                   f"({_gib(free)} free under {existing})")
    if per_ckpt * kept > free:
        pf.problems.append(f"disk: {kept} checkpoints of {_gib(per_ckpt)} need {_gib(per_ckpt * kept)}, "
                           f"{existing} has {_gib(free)} free (trainer.output_dir)")


def run_preflight(cfg: Any, *, launch: Launch | None = None, device_gib: float | None = None) -> Preflight:
    """Every check of the module docstring on a validated config, and the plan when the model's shape is known."""
    pf = Preflight()
    launch = launch or Launch()
    pf.ok.append(f"config: {cfg.name} resolved and valid")
    eval_sizes = check_data(pf, cfg)
    index_bytes = check_retriever(pf, cfg)
    shape = check_model(pf, cfg)
    if shape is not None:
        _plan_lines(pf, cfg, shape, launch, device_gib, index_bytes)
    else:
        pf.plan.append("memory and disk: not computed (the model's config.json is not available here)")
    pf.plan += eval_plan(cfg, eval_sizes)
    return pf


def format_report(pf: Preflight) -> str:
    """The report printed by ``train.py --preflight`` (the problems are printed again, one a line, on stderr)."""
    lines = ["preflight checks:"]
    lines += [f"  ok       {x}" for x in pf.ok]
    lines += [f"  note     {x}" for x in pf.notes]
    lines += [f"  PROBLEM  {x}" for x in pf.problems]
    lines += ["resource plan (computed from the model's config; formulas: searchr1_lld/preflight.py):"]
    lines += [f"  {x}" for x in pf.plan]
    verdict = "the run can start" if not pf.problems else f"{len(pf.problems)} problem(s): the run cannot start"
    return "\n".join(lines + [f"preflight: {verdict}"])
