"""``train.py --preflight``: whether a run can start, and what it will take, before the first GPU-hour.

Checks (each a line; a problem makes the exit status 2, one line per problem on stderr):
    config      resolved and validated (a bad key already stops ``load_config`` with one line)
    data        every rows file exists and parses (its rows counted); FlashRAG names: the local mirror, if set
    retriever   in-process: the index dir's manifest, its files' sizes, the encoder against retriever.expect_encoder;
                http: ``GET /health`` answers (no retries), its encoder against retriever.expect_encoder
    model       a local dir: config.json and a tokenizer; a hub id: in the HF cache, else (HF_HUB_OFFLINE) a problem
                saying it cannot be downloaded here, else the hub is asked (unreachable: a note, not verified)

The resource plan is computed from the model's config, never measured: GPU memory per phase and host memory at load
and through training by searchr1_lld/preflight/memory_plan.py (its docstring gives every formula; docs/memory.md prints the
same arithmetic for the paper's cells), from the launch (an accelerate config: processes, ZeRO stage, offload,
zero3_init, DeepSpeed's bucket sizes), the engine as the backend builds it (vLLM's fraction of the GPU, its KV-cache
bytes, the batch limits of rollout/backends/vllm_settings.engine_batch, sleep mode and level, CUDA graphs and their
offload; the HF engine's KV cache of generation_batch_size x max_total_length tokens), the largest forward pass of
the update (memory_plan.pass_tokens), the reference (algorithm.kl_coef > 0) and the retriever's GPU memory (a service
that reports a GPU index in its /health, counted as sharded over the node's GPUs; retriever.use_gpu_index in
process: a whole copy on each rank's own GPU). A plan that does not fit is a problem at the engine's start (vLLM's
check that its utilisation's share is free), at the update or at the first wake-up. Here, P = parameters:
    disk / checkpoint= policy/ (b P, b = 2 with DeepSpeed bf16, else 4) + optimiser state (DeepSpeed: b P module +
                       12 P; else 8 P), times trainer.keep_last_k (+1 with trainer.keep_best)
    evaluation       = greedy trajectories over the run against its training trajectories, at most
                       (eval.max_turns + 1) x max_tokens_per_turn generated tokens each (eval_plan.py)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

from retriever.client import RetrieverError
from retriever.modes import IndexFacts, retriever_mode
from searchr1_lld.rollout.backends.kinds import BackendKind, backend_kind
from searchr1_lld.cli import looks_like_local_path
from searchr1_lld.config import Config, ConfigError, DataConfig, read_yaml
from searchr1_lld.data import flashrag, splits
from searchr1_lld.data.specs import dataset_name, parse_datasets
from searchr1_lld.data.jsonl import read_rows
from searchr1_lld.placement import RankPlan, check_split_launch
from searchr1_lld.preflight import memory_plan as mp
from searchr1_lld.preflight.eval_plan import EvalSets, plan_lines
from searchr1_lld.preflight.split_plan import split_plans
GiB = float(1 << 30)


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
    buckets: mp.Buckets = field(default_factory=mp.Buckets)  # its DeepSpeed JSON's bucket sizes
    source: str = "one process, no DeepSpeed (--accelerate-config FILE for the launcher's)"

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.processes // max(1, self.machines))


@dataclass
class Preflight:
    """The outcome: lines that passed, notes (not verified, warnings), problems (the run cannot start), the plan."""

    ok: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------- model and launch
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


def zero_buckets(zero: dict) -> mp.Buckets:
    """DeepSpeed's bucket sizes from a ``zero_optimization`` section (a missing or ``auto`` one: DeepSpeed's
    default as memory_plan.Buckets counts it)."""
    default = mp.Buckets()

    def size(key: str, fallback: float) -> float:
        value = zero.get(key, fallback)
        return float(value) if isinstance(value, (int, float)) else fallback

    return mp.Buckets(reduce=size("reduce_bucket_size", default.reduce),
                      allgather=size("allgather_bucket_size", default.allgather),
                      max_live=size("stage3_max_live_parameters", default.max_live),
                      prefetch=size("stage3_prefetch_bucket_size", default.prefetch))


def read_launch(path: str | Path) -> Launch:
    """An accelerate config (YAML) -> :class:`Launch` (its ``deepspeed_config`` keys, or the DeepSpeed JSON its
    ``deepspeed_config_file`` names)."""
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
        launch.buckets = zero_buckets(zero)
    else:
        launch.zero_stage = int(ds.get("zero_stage") or 0)
        launch.offload_optimizer = ds.get("offload_optimizer_device", "none") not in ("none", None)
    launch.zero3_init = bool(ds.get("zero3_init_flag", False))
    return launch


# ------------------------------------------------------------------------------------------------- disk, evaluation
def checkpoint_bytes(params: int, launch: Launch) -> float:
    """One checkpoint on disk: policy/ + the optimiser state (module docstring)."""
    p = float(params)
    if launch.deepspeed:
        b = 2.0 if launch.bf16 else 4.0
        return b * p + b * p + (12 if b == 2 else 8) * p
    return 4 * p + 8 * p


def _gb(x: float) -> str:
    return f"{x / mp.GB:.1f} GB" if x >= 0.05 * mp.GB or not x else f"{x / 1e6:.2f} MB"


def _count(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.3g} M"


# ------------------------------------------------------------------------------------------------- the checks
def check_rows(pf: Preflight, key: str, paths: list[str]) -> dict[str, list[dict]]:
    """Each rows file exists and parses; ``{path: its rows}`` of the good ones."""
    good = {}
    for path in paths:
        try:
            rows = read_rows(path)
        except (OSError, ValueError) as e:
            pf.problems.append(f"{key}: {' '.join(str(e).split())}")
            continue
        if not rows:
            pf.problems.append(f"{key}: {path} holds no rows")
            continue
        good[path] = rows
        pf.ok.append(f"{key}: {path}: {len(rows):,} rows")
    return good


def _flashrag_sets(pf: Preflight, key: str, names: list[str], split: str | None) -> dict[str, int]:
    """FlashRAG datasets: read from the local mirror ($FLASHRAG_LOCAL_DIR) when set, else noted (hub, at start)."""
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


def _flashrag_hint(pf: Preflight, cfg: Config, paths: list[str]) -> None:
    """A note naming the command that writes the missing ``paths`` that have the layout of FlashRAG's prepared files
    (``DIR/train/<name>.jsonl``, ``DIR/test/<name>.jsonl``: what the paper configs read)."""
    missing = [Path(p) for p in paths if not Path(p).exists() and Path(p).parent.name in ("train", "test")
               and Path(p).stem in flashrag.EXPECTED_EVAL_COUNTS]  # the seven benchmarks, nq and hotpotqa among them
    if missing:
        out = missing[0].parent.parent
        pf.notes.append(f"{len(missing)} FlashRAG rows file(s) missing under {out}: `python -m searchr1_lld.data."
                        f"flashrag --out {out} --train-mix {cfg.data.train_mix}` writes them")


def check_data(pf: Preflight, cfg: Config) -> tuple[EvalSets, bool]:
    """Training, validation and evaluation rows; returns the evaluation sets counted and whether a data problem
    left them uncounted."""
    d, problems_before = cfg.data, len(pf.problems)
    if d.source == "files":
        if not d.train_files:
            pf.problems.append("data.train_files is empty: name the training rows (JSONL/parquet)")
        train = [row for rows in check_rows(pf, "data.train_files", d.train_files).values() for row in rows]
        validation = _held_out(pf, d, train)
    else:
        _flashrag_sets(pf, f"data.train_mix={d.train_mix}", flashrag.TRAIN_MIXES[d.train_mix], "train")
        validation = d.val_holdout.size * len(flashrag.TRAIN_MIXES[d.train_mix])  # FlashRAG: one source per set
    if not d.val_holdout.size:
        validation = sum(len(rows) for rows in check_rows(pf, "data.val_files", d.val_files).values())
    test = sum(len(rows) for rows in check_rows(pf, "data.test_files", d.test_files).values())
    benchmarks: dict[str, int] = {}
    if cfg.eval.datasets and cfg.trainer.eval_every:
        for spec in parse_datasets(cfg.eval.datasets):
            name, sep, path = spec.partition("=")
            if sep:
                benchmarks.update({dataset_name(spec): len(rows) for rows in
                                   check_rows(pf, f"eval.datasets {name}", [path]).values()})
            else:
                benchmarks.update(_flashrag_sets(pf, "eval.datasets", [name], None))
    named = [s.partition("=")[2] for s in parse_datasets(cfg.eval.datasets) if "=" in s] if cfg.eval.datasets else []
    _flashrag_hint(pf, cfg, (d.train_files if d.source == "files" else []) + d.test_files + named)
    return EvalSets(validation, test, benchmarks), len(pf.problems) > problems_before


def _held_out(pf: Preflight, d: DataConfig, train: list[dict]) -> int:
    """The size of data.val_holdout's split of the training rows (0 without one, or without rows)."""
    if not (d.val_holdout.size and train):
        return 0
    try:
        return len(splits.hold_out(train, d.val_holdout.size, d.val_holdout.seed)[1])
    except ValueError as e:
        pf.problems.append(str(e))
        return 0


def check_retriever(pf: Preflight, cfg: Config, wait: bool = False) -> IndexFacts:
    """The index (in-process) or the service (http, at the address the run uses: ``$SEARCHR1_RETRIEVER_URL`` over
    retriever.url), as its mode inspects it: what the plan needs of it (nothing known: zeros). ``wait``: a service
    still starting gets the time its client would give it."""
    mode = retriever_mode(cfg.retriever)
    try:
        addressed = mode.addressed(cfg.retriever)
    except RetrieverError as e:
        pf.problems.append(str(e))
        return IndexFacts()
    found = mode.inspect(addressed, _gb, wait=wait)
    pf.ok.extend(found.ok)
    pf.problems.extend(found.problems)
    return found.facts


def _local_dir_problem(path: Path, what: str, markers: tuple[str, ...]) -> str | None:
    if not path.is_dir():
        return f"{what}: {path} does not exist"
    return None if any((path / m).is_file() for m in markers) else f"{what}: {path} has no {' or '.join(markers)}"


def check_model(pf: Preflight, cfg: Config) -> mp.ModelShape | None:
    """model.path (and model.tokenizer_path): a local dir with config.json + tokenizer, or a hub id in the HF cache;
    returns the model's shape when its config could be read."""
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
        shape = mp.shape_from_hf_config(json.loads((Path(path) / "config.json").read_text()),
                                        params=safetensors_params(Path(path)))
        pf.ok.append(f"model.path {path}: local model dir, {_count(shape.params)} parameters")
        return shape
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        shape = mp.shape_from_hf_config(json.loads(Path(cached).read_text()))
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
        return device_gib * GiB, f"{device_gib * GiB / mp.GB:.1f} GB (--gpu-memory-gib {device_gib:g})"
    import torch

    if torch.cuda.is_available():
        total = float(torch.cuda.get_device_properties(0).total_memory)
        return total, f"{total / mp.GB:.1f} GB ({torch.cuda.get_device_name(0)})"
    return mp.H100_80GB, f"{mp.H100_80GB / mp.GB:.1f} GB (assumed 80 GB H100: no GPU here; --gpu-memory-gib sets it)"


def _retriever_gpu_bytes(pf: Preflight, cfg: Config, index: IndexFacts, ranks_per_node: int) -> float:
    """The retriever's FAISS memory on each GPU: a service reporting a GPU index (counted as co-located), or
    retriever.use_gpu_index in-process (a whole copy on each rank's own GPU)."""
    copies = retriever_mode(cfg.retriever).gpu_index_copies(cfg.retriever, index, ranks_per_node)
    if copies is None:
        return 0.0
    if not (index.index_type.endswith("Flat") and index.num_docs and index.dim):
        pf.notes.append(f"plan: the retriever's GPU index ({index.index_type or 'type unknown'}) is not counted (the "
                        "plan counts Flat codes)")
        return 0.0
    shards, processes, note = copies
    if note:
        pf.notes.append(note)
    return mp.faiss_flat_shard_bytes(index.num_docs, index.dim, shards, processes=processes)


def gpu_plan(pf: Preflight, cfg: Config, kind: BackendKind, shape: mp.ModelShape, launch: Launch, gpu_bytes: float,
             index: IndexFacts, on_gpu: bool = True, ranks: RankPlan | None = None) -> mp.MemoryPlan | None:
    """The run's :class:`memory_plan.MemoryPlan` per GPU (None, with a note, for a ZeRO stage it does not cover);
    ``kind``: the rollout engine's kind, resolved once by :func:`run_preflight`; ``ranks``: a split launch's rank
    plan (the learner's states over its learner ranks, an engine's batch over its rollout ranks)."""
    r, stage = cfg.rollout, launch.zero_stage if launch.deepspeed else 0
    if stage not in (0, 2, 3):
        pf.notes.append(f"plan: DeepSpeed ZeRO-{stage} is not in the memory arithmetic (no DeepSpeed, ZeRO-2, ZeRO-3)")
        return None
    learners, engines = ((launch.processes, launch.processes) if ranks is None
                         else (len(ranks.learner_ranks), len(ranks.rollout_ranks)))
    engine = kind.engine_memory(cfg, engines)
    return mp.gpu_memory_plan(
        shape, zero_stage=stage, data_parallel=learners, gpu_bytes=gpu_bytes,
        vllm_gpu_memory_utilization=r.vllm.gpu_memory_utilization, reference=cfg.algorithm.kl_coef > 0,
        micro_batch_tokens=mp.pass_tokens(cfg.trainer.micro_batch_size, r.max_total_length,
                                          cfg.trainer.micro_batch_token_budget),
        gradient_checkpointing=cfg.model.gradient_checkpointing, buckets=launch.buckets,
        offload_optimizer=launch.offload_optimizer, hf_engine_tokens=kind.hf_engine_tokens(r),
        engine=None if engine is None else mp.EngineSettings.of(engine),
        retriever_bytes=_retriever_gpu_bytes(pf, cfg, index, launch.ranks_per_node) if on_gpu else 0.0,
        contexts=mp.CONTEXT_BYTES if on_gpu else 0.0)



def _start_line(pf: Preflight, plan: mp.MemoryPlan, engine: str, hint: str) -> None:
    """The engine's start: the learner's set-up states, reference, contexts and retriever beside the free memory
    vLLM checks for (utilisation x total); short of it is a problem (vLLM refuses to start)."""
    held = plan.engine_start - plan.engine_start_claim
    learner = plan.learner if plan.learner_at_start is None else plan.learner_at_start
    listing = (f"learner states at set-up {_gb(learner)}, reference {_gb(plan.reference)}, CUDA contexts "
               f"{_gb(plan.contexts)}, retriever {_gb(plan.retriever)}; {engine} asks for "
               f"{_gb(plan.engine_start_claim)} free (rollout.vllm.gpu_memory_utilization x the GPU's total)")
    margin = plan.margin_at_engine_start
    pf.plan.append(f"engine start: {_gb(plan.engine_start)} per GPU of {_gb(plan.gpu)} ({listing}); margin "
                   f"{_gb(margin)} ({100 * margin / plan.gpu:.1f} %)")
    if margin < 0:
        pf.problems.append(f"plan: {engine} cannot start: it checks that {_gb(plan.engine_start_claim)} "
                           f"(rollout.vllm.gpu_memory_utilization x {_gb(plan.gpu)}) is free, and the learner, "
                           f"reference, contexts and retriever hold {_gb(held)} then{hint}")


def _phase_lines(pf: Preflight, plan: mp.MemoryPlan, on_gpu: bool, engine: str, hint: str = "",
                 where: str = "") -> None:
    """The engine's start (a vLLM engine on a GPU), rollout and update lines with their parts and margins; a phase
    over the GPU is a problem (``hint`` appended: what would give memory back), one under memory_plan.MARGIN_FLOOR
    a note. ``where``: which GPUs of a split launch the plan is of (a prefix of its lines)."""
    if on_gpu and plan.engine_start_claim:
        _start_line(pf, plan, engine, hint)
    common = [("learner states", plan.learner), ("reference", plan.reference), ("CUDA contexts", plan.contexts),
              ("retriever", plan.retriever)]
    phases = {"rollout": (plan.rollout, [*common, (f"{engine} awake", plan.engine_awake)]),
              "update": (plan.update, [*common, ("activations of one forward pass", plan.activations),
                                       (f"{engine} asleep", plan.engine_asleep)])}
    unit = f"per GPU of {_gb(plan.gpu)}" if on_gpu else "per process (CPU run: host memory)"
    for phase, (total, parts) in phases.items():
        listing = ", ".join(f"{k} {_gb(v)}" for k, v in parts if v)
        if phase == "rollout":
            listing += f" (KV cache {_gb(plan.kv_cache)})"
        margin = plan.gpu - total
        free = f"; margin {_gb(margin)} ({100 * margin / plan.gpu:.1f} %)" if on_gpu else ""
        pf.plan.append(f"{where}{phase}: {_gb(total)} {unit} ({listing}){free}")
        if on_gpu and margin < 0:
            pf.problems.append(f"plan: the {where}{phase} needs {_gb(total)} per GPU, more than the GPU's {_gb(plan.gpu)} "
                               f"({listing}){hint}")
        elif on_gpu and margin < mp.MARGIN_FLOOR * plan.gpu:
            pf.notes.append(f"plan: the {phase} leaves under {mp.MARGIN_FLOOR:.0%} of the GPU free ({_gb(total)} of "
                            f"{_gb(plan.gpu)}); allocator fragmentation is not counted")


def _retriever_hint(cfg: Config, plan: mp.MemoryPlan) -> str:
    """What to do when the in-process GPU index takes a phase over the GPU: one service per node instead."""
    mode = retriever_mode(cfg.retriever)
    if not (plan.retriever and mode.index_in_process and cfg.retriever.use_gpu_index):
        return ""
    return (f"; retriever.use_gpu_index puts the whole index ({_gb(plan.retriever)}) on every rank's GPU: serve it "
            f"once per node, sharded over the node's GPUs, with `python -m retriever serve --index "
            f"{cfg.retriever.index_dir} --gpu-index --port 8000` and retriever.mode=http")


def _plan_lines(pf: Preflight, cfg: Config, kind: BackendKind, shape: mp.ModelShape, launch: Launch,
                device_gib: float | None, index: IndexFacts) -> None:
    import torch

    on_gpu = cfg.trainer.device == "cuda" or kind.needs_gpu or (
        cfg.trainer.device == "auto" and (torch.cuda.is_available() or launch.deepspeed and launch.processes > 1))
    gpu_bytes, device_text = _device_bytes(device_gib)
    zero = f"DeepSpeed ZeRO-{launch.zero_stage}" if launch.deepspeed else "no DeepSpeed"
    pf.plan.append(f"launch: {launch.processes} process(es) on {launch.machines} machine(s), {zero}"
                   f"{', bf16' if launch.bf16 else ''}{', optimiser offloaded' if launch.offload_optimizer else ''} "
                   f"[{launch.source}]; model {_count(shape.params)} parameters"
                   + (f"; GPU {device_text}" if on_gpu else ""))
    try:
        ranks = check_split_launch(cfg, launch.processes, on_gpu)
    except ConfigError as err:
        pf.problems.append(f"plan: {err}")
        return
    plan = gpu_plan(pf, cfg, kind, shape, launch, gpu_bytes, index, on_gpu, ranks)
    plans = {"": plan} if ranks is None or plan is None else {f"{k} ": p for k, p in split_plans(plan).items()}
    for where, one in plans.items():
        if one is not None:
            _phase_lines(pf, one, on_gpu, kind.label, _retriever_hint(cfg, one), where)
    pf.notes.extend(kind.plan_notes(cfg.rollout))
    r, per_node, reference = cfg.rollout, launch.ranks_per_node, cfg.algorithm.kl_coef > 0
    loading = mp.host_bytes_at_load(shape, ranks_per_node=per_node, reference=reference,
                                    zero3_init=launch.deepspeed and launch.zero_stage == 3 and launch.zero3_init)
    steady = mp.host_bytes_steady(
        shape, ranks_per_node=per_node, data_parallel=launch.processes, offload_optimizer=launch.offload_optimizer,
        parked_weights=kind.parks_weights(r),
        index_bytes=index.host_bytes if retriever_mode(cfg.retriever).index_in_process else 0.0)
    pf.plan.append(f"host RAM per node: {_gb(loading)} while loading, {_gb(steady)} steady beyond the processes "
                   "(offloaded optimiser, parked engine weights, in-process index)")
    per_ckpt = checkpoint_bytes(shape.params, launch)
    kept = cfg.trainer.keep_last_k + (1 if cfg.trainer.keep_best else 0)
    out = Path(cfg.trainer.output_dir).resolve()
    existing = next((p for p in [out, *out.parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    pf.plan.append(f"disk: {_gb(per_ckpt)} per checkpoint x {kept} kept = {_gb(per_ckpt * kept)} "
                   f"({_gb(free)} free under {existing})")
    if per_ckpt * kept > free:
        pf.problems.append(f"disk: {kept} checkpoints of {_gb(per_ckpt)} need {_gb(per_ckpt * kept)}, "
                           f"{existing} has {_gb(free)} free (trainer.output_dir)")


def run_preflight(cfg: Config, *, launch: Launch | None = None, device_gib: float | None = None,
                  wait_for_service: bool = False) -> Preflight:
    """Every check of the module docstring on a validated config, and the plan when the model's shape is known
    (``wait_for_service``: a retriever service that is still starting is waited for, as at a run's start)."""
    kind = backend_kind(cfg.rollout)  # resolved once; a rollout setting it cannot serve stops the run here
    pf = Preflight()
    launch = launch or Launch()
    pf.ok.append(f"config: {cfg.name} resolved and valid")
    eval_sets, unread = check_data(pf, cfg)
    index = check_retriever(pf, cfg, wait_for_service)
    shape = check_model(pf, cfg)
    if shape is not None:
        _plan_lines(pf, cfg, kind, shape, launch, device_gib, index)
    else:
        pf.plan.append("memory and disk: not computed (the model's config.json is not available here)")
    pf.plan += plan_lines(cfg, eval_sets, unread)
    return pf


def format_report(pf: Preflight) -> str:
    """The report printed by ``train.py --preflight``: the checks that passed, the notes, the plan and the verdict
    (the problems follow it on stderr, one a line)."""
    lines = ["preflight checks:"]
    lines += [f"  ok       {x}" for x in pf.ok]
    lines += [f"  note     {x}" for x in pf.notes]
    lines += ["resource plan (computed from the model's config; formulas: searchr1_lld/preflight/memory_plan.py):"]
    lines += [f"  {x}" for x in pf.plan]
    verdict = ("the run can start" if not pf.problems
               else f"{len(pf.problems)} problem(s), one a line below: the run cannot start")
    return "\n".join(lines + [f"preflight: {verdict}"])
