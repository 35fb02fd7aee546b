"""The learner: GRPO + LLDS on accelerate (one CPU process, one GPU, multi-GPU DDP, DeepSpeed ZeRO-2/3).

One training step (``Trainer.train_step``)::

    sample train_batch_size prompts (this rank's share)                       PromptSampler
    rollout: n responses per prompt, policy in eval mode, no grad             run_agent_loop  (reward = EM)
    engine.sleep(): the rollout engine hands its GPU memory to the update     rollout/backends (contract: base.py)
    advantages A_i (GRPO, per group)                                          algo.advantages
    logp_old under the current policy, logp_ref under the frozen initial one  algo.logprobs   (no grad)
    rollout-correction weights (truncated IS, engine vs learner), if enabled  algo.rollout_correction
    for epoch in ppo_epochs, for mini-batch of ppo_mini_batch_size *responses* (over all ranks; groups may straddle):
        for micro-batch (token budget, sorted by length; every rank runs the max count, padding ones weigh 0):
            loss = objective(pg + kl_coef * KL(ref) - entropy_coef * H + LLDS)  algo.objective
            (every term normalised by the *mini-batch* totals -> accumulation == the one-shot mini-batch loss)
            backward (DeepSpeed: engine.set_gradient_accumulation_boundary(last) + engine.backward)
        global grad norm (before clipping), checked on all ranks *before* the step -> non-finite on any rank: skip
        on all ranks and count; else clip -> AdamW step -> LR scheduler step (warm-up ratio of all optimiser steps)
    logp_new of the step's batch after the updates (no grad) -> LLD monitor
    weights -> rollout engine: engine.load_weights(stream) (ZeRO-3: gathered module by module), engine.wake_up()

The trainer composes the pure functions of ``searchr1_lld.algo``; it holds no loss math of its own (the only arithmetic
is the LR schedule factor). Batch semantics and the multi-rank rules: docs/batch_semantics.md.

Determinism: every step re-seeds python / numpy / torch from (seed, step, rank), so a run resumed from a checkpoint
reproduces the same next step as an uninterrupted run (RNG states are also saved in the checkpoint).

Python API: :func:`train` ``(cfg) -> RunResult`` (run dir, final metrics, before/after EM).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from searchr1_lld import checkpoint as ckpt
from searchr1_lld import policy_logprobs
from searchr1_lld.algo import advantages as adv_fns
from searchr1_lld.algo import llds, rollout_correction
from searchr1_lld.algo.objective import ObjectiveSpec, mini_batch_denominators, objective
from searchr1_lld.config import Config, ConfigError, RolloutConfig, config_differences, read_yaml, save_config
from searchr1_lld.monitor import (
    PHASE_ID,
    PhaseDetector,
    ProbeSet,
    engine_learner_gap,
    first_action_ids,
    likelihood_metrics,
    rollout_metrics,
    shared_first_action_fraction,
)
from searchr1_lld.tracking import Tracker


@dataclass
class RunResult:
    """What :func:`train` returns."""

    run_dir: Path
    steps: int
    final_metrics: dict[str, Any]
    em_before: float | None
    em_after: float | None
    skipped_steps: int = 0
    eval_table: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------------------------
# Small helpers (no math)
# --------------------------------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(base_seed: int, step: int, rank: int, num_processes: int) -> int:
    """Seed of one (step, rank): distinct per rank and per step, fixed by the run's seed."""
    return base_seed * 1_000_003 + step * max(num_processes, 1) + rank


def lr_factor(step: int, total_steps: int, warmup_ratio: float, schedule: str) -> float:
    """LR multiplier at scheduler step ``step`` (0-based). The trainer steps it once per applied optimiser step and
    passes the run's total optimiser steps as ``total_steps`` (verl's warm-up ratio is a fraction of those).

    warmup_steps W = int(warmup_ratio * total_steps);  s < W: (s + 1) / W  (linear warm-up, never 0)
    afterwards constant: 1;  cosine: 0.5 * (1 + cos(pi * (s - W) / max(1, total_steps - W)))
    """
    warm = int(warmup_ratio * total_steps)
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def micro_batches_by_tokens(lengths: Sequence[int], indices: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split ``indices`` (rows of one mini-batch) into micro-batches whose padded size
    ``len(micro) * max(length in micro)`` stays within ``token_budget`` (a single longer row gets its own micro-batch).
    Rows are sorted by length first so that rows of similar length share a micro-batch (little padding)."""
    order = sorted(indices, key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and (len(cur) + 1) * new_max > token_budget:
            out.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


class PromptSampler:
    """Epoch-wise shuffled prompts; state = (epoch, cursor) so a resumed run draws the same next batch."""

    def __init__(self, rows: list[dict], batch_size: int, seed: int, shuffle: bool = True):
        if not rows:
            raise ValueError("no training rows")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        idx = list(range(len(self.rows)))
        if self.shuffle:
            np.random.default_rng(self.seed + 7919 * epoch).shuffle(idx)
        return idx

    def next_batch(self) -> list[dict]:
        batch = []
        while len(batch) < self.batch_size:
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.rows[self._order[self.cursor]])
            self.cursor += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def read_rows(path: str | Path) -> list[dict]:
    """QA rows from a JSONL or parquet file (project schema: id, question, golden_answers, data_source)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        missing = [k for k in ("id", "question", "golden_answers") if k not in r]
        if missing:
            raise ValueError(f"{path}: row {r.get('id')!r} lacks {missing}")
    return rows


def select_rows(batch: Any, idx: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of a TrajectoryBatch, trimmed to their own longest prompt p and response t.

    Returns input_ids/attention_mask/position_ids [b, p+t], responses/response_mask/answer_mask/engine_logprobs [b, t],
    and "p" (the prompt width): logits predicting responses[:, j] sit at position p - 1 + j.
    """
    index = torch.as_tensor(list(idx), dtype=torch.long)
    P = batch.prompt_length
    am = batch.attention_mask[index]
    p = max(1, int(am[:, :P].sum(1).max()))
    t = max(1, int(am[:, P:].sum(1).max()))
    cols = slice(P - p, P + t)
    return {
        "input_ids": batch.input_ids[index][:, cols],
        "attention_mask": am[:, cols],
        "position_ids": batch.position_ids[index][:, cols],
        "responses": batch.responses[index][:, :t],
        "response_mask": batch.response_mask[index][:, :t],
        "answer_mask": batch.answer_mask[index][:, :t],
        "engine_logprobs": batch.engine_logprobs[index][:, :t],
        "p": p,
    }


def pad_cols(x: torch.Tensor, width: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad [b, t] to [b, width]."""
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


# --------------------------------------------------------------------------------------------------------------------
# Accelerator / model set-up
# --------------------------------------------------------------------------------------------------------------------


def is_deepspeed(accelerator: Any) -> bool:
    return str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)).upper() == "DEEPSPEED"


def zero_stage(accelerator: Any) -> int:
    if not is_deepspeed(accelerator):
        return 0
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def make_accelerator(cfg: Config):
    from accelerate import Accelerator

    use_cpu = cfg.trainer.device == "cpu" or (cfg.trainer.device == "auto" and not torch.cuda.is_available())
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but CUDA is not available")
    dtype = cfg.model.dtype
    if dtype == "auto":
        mixed = "no" if use_cpu else "bf16"
    else:
        mixed = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    if use_cpu:
        mixed = "no"  # fp32 on CPU
    # DeepSpeed (ACCELERATE_USE_DEEPSPEED, set by `accelerate launch` with a DeepSpeed config) is disabled by accelerate
    # when cpu=True; without a GPU DeepSpeed picks its own CPU accelerator (gloo), so leave cpu=False then.
    deepspeed_requested = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    handlers = []
    if deepspeed_requested and use_cpu:
        # accelerate finds no backend on a CPU-only machine unless told: it would then count 1 process although
        # DeepSpeed initialised gloo with all of them (and DeepSpeed's batch-size check fails)
        from accelerate.utils import InitProcessGroupKwargs

        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    return Accelerator(cpu=use_cpu and not deepspeed_requested, mixed_precision=mixed, kwargs_handlers=handlers)


def resolve_world(cfg: Config) -> Path | None:
    """The synthetic world dir (built on demand) when the run needs it, else None."""
    needs = cfg.data.source == "synthetic" or not cfg.model.path or (
        cfg.retriever.mode == "inprocess" and not cfg.retriever.index_dir
    )
    if not needs:
        return None
    world_dir = Path(cfg.data.world_dir)
    from data.build_world import ensure_world

    return Path(ensure_world(world_dir, cfg.data.world, progress=True))


def policy_path(cfg: Config, world_dir: Path | None) -> str:
    return cfg.model.path or (str(world_dir / "model") if world_dir else "")


def load_policy_and_tokenizer(cfg: Config, world_dir: Path | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = policy_path(cfg, world_dir)
    tok_path = cfg.model.tokenizer_path or (cfg.model.path if cfg.model.path else (str(world_dir / "tokenizer") if world_dir else ""))
    if not model_path:
        raise ValueError("model.path is empty and there is no synthetic world to take the tiny policy from")
    tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=cfg.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.model.trust_remote_code, "dtype": torch.float32}
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)  # fp32 master weights; bf16 via autocast
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model, tokenizer


def load_train_rows(cfg: Config, world_dir: Path | None) -> list[dict]:
    if cfg.data.source == "synthetic":
        return read_rows(world_dir / "qa" / "train.jsonl")
    if cfg.data.source == "files":
        rows: list[dict] = []
        for f in cfg.data.train_files:
            rows += read_rows(f)
        return rows
    from data import flashrag  # FlashRAG preparation module (hub access required)

    return flashrag.load_train_rows(cfg.data.train_mix)


def load_test_rows(cfg: Config, world_dir: Path | None) -> list[dict]:
    if world_dir is None:
        return []
    path = world_dir / "qa" / f"{cfg.data.test_split}.jsonl"
    return read_rows(path) if path.is_file() else []


def make_backend(cfg: Config, model: torch.nn.Module, tokenizer: Any, model_path: str = ""):
    """The rollout engine: HF generation on the learner's own module (no copy, weight loads are no-ops), or one vLLM
    engine per rank (GPU) that the trainer streams the weights into after every update."""
    from searchr1_lld.rollout.backends import make_backend as build

    if cfg.rollout.backend == "vllm":
        return build(cfg.rollout, tokenizer=tokenizer, model_path=model_path, seed=cfg.trainer.seed,
                     dtype=cfg.model.dtype, tokenizer_path=getattr(tokenizer, "name_or_path", "") or cfg.model.tokenizer_path)
    # seed=None: the HF sampler draws from the global RNG, which every step re-seeds (resume stays reproducible)
    return build(cfg.rollout, model=model, tokenizer=tokenizer, shares_learner_weights=True)


def iter_gathered_named_parameters(model: torch.nn.Module, gather: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter of a ZeRO-3 partitioned model, gathered one module at a time
    (``gather(params)``: a context manager, default ``deepspeed.zero.GatheredParameters``; never the whole model on
    one rank). A parameter shared by several modules (tied embeddings) is yielded once, under its first name. The
    tensor is valid only until the next item is requested (the module is re-partitioned when the gather exits)."""
    if gather is None:
        import deepspeed

        gather = lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)  # noqa: E731
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        with gather([p for _, p in params]):
            for pname, p in params:
                yield (f"{mod_name}.{pname}" if mod_name else pname), p.detach()


def sync_weights_to_engine(accelerator: Any, model: torch.nn.Module, backend: Any, gather: Any = None) -> None:
    """Learner -> rollout engine after the step's updates: stream (name, tensor) through ``backend.load_weights``
    (ZeRO-3: gathered module by module; ZeRO-0/2: every rank holds the full parameters)."""
    unwrapped = accelerator.unwrap_model(model)
    if zero_stage(accelerator) == 3:
        named = iter_gathered_named_parameters(unwrapped, gather)
    else:
        named = ((name, p.detach()) for name, p in unwrapped.named_parameters())
    backend.load_weights(named)


# --------------------------------------------------------------------------------------------------------------------
# Run directory and resume safety
# --------------------------------------------------------------------------------------------------------------------

# Keys that say where a run lives, not what it does: never compared on resume.
RESUME_IGNORED_KEYS = ("trainer.resume", "trainer.run_name", "trainer.output_dir")
# Keys that may change when a run is resumed, but only when asked for (train.py --allow-change KEY); a trailing ".*"
# covers a section. total_steps: the LR schedule is recomputed for the new length (warmup_ratio of the new total).
RESUME_SAFE_KEYS = ("trainer.total_steps", "trainer.save_every", "trainer.keep_last_k", "trainer.eval_every",
                    "trainer.eval_limit", "trainer.probe_every", "logging.*", "eval.*")


def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(key == p or (p.endswith(".*") and key.startswith(p[:-1])) for p in patterns)


def default_run_name(cfg: Config) -> str:
    """``<config name>-<8 hex>``: a hash of every setting except those of :data:`RESUME_IGNORED_KEYS` and
    :data:`RESUME_SAFE_KEYS`, so the same command (or one that only extends it) maps to the same run directory."""
    import hashlib

    from searchr1_lld.config import flatten_dict

    flat = {k: v for k, v in flatten_dict(cfg.to_dict()).items()
            if not _matches(k, RESUME_IGNORED_KEYS + RESUME_SAFE_KEYS)}
    digest = hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{cfg.name}-{digest}"


def check_resume_config(saved: dict[str, Any], cfg: Config, allow: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Compare the config a run was started with (``saved``, its config.yaml) with ``cfg``. Returns the differing
    keys that are accepted (each in :data:`RESUME_SAFE_KEYS` and named in ``allow``); raises ConfigError listing the
    others, since resuming with them would mix two runs' states."""
    bad_allow = [a for a in allow if not _matches(a, RESUME_SAFE_KEYS)]
    if bad_allow:
        raise ConfigError(f"--allow-change {', '.join(bad_allow)}: only these may change on resume: "
                          f"{', '.join(RESUME_SAFE_KEYS)}")
    diffs = {k: v for k, v in config_differences(saved, cfg).items() if not _matches(k, RESUME_IGNORED_KEYS)}
    refused = {k: v for k, v in diffs.items() if not _matches(k, allow)}
    if refused:
        listing = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        safe = [k for k in refused if _matches(k, RESUME_SAFE_KEYS)]
        hint = (f" To change {', '.join(safe)} on resume, pass --allow-change {' --allow-change '.join(safe)}."
                if safe else "")
        raise ConfigError(
            f"the run's saved config differs from this one in {listing}; resuming would mix the two runs' states. "
            f"For a new run use another trainer.run_name (or none: the default run directory follows the settings); "
            f"trainer.resume=never starts this one over.{hint}")
    return diffs


# --------------------------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------------------------


class Trainer:
    """GRPO + LLDS learner. Build with a validated Config; ``run()`` trains ``trainer.total_steps`` steps."""

    def __init__(self, cfg: Config, *, run_dir: str | Path | None = None, retriever: Any = None,
                 world_dir: str | Path | None = None):
        self.cfg = cfg
        tc = cfg.trainer
        self.accelerator = make_accelerator(cfg)
        acc = self.accelerator
        self.rank, self.world_size = acc.process_index, acc.num_processes
        cfg.validate()
        if tc.train_batch_size % self.world_size or tc.ppo_mini_batch_size % self.world_size:
            raise ValueError(
                f"trainer.train_batch_size ({tc.train_batch_size}) and trainer.ppo_mini_batch_size "
                f"({tc.ppo_mini_batch_size}) must be divisible by the number of processes ({self.world_size})"
            )
        # batch semantics (docs/batch_semantics.md): ppo_mini_batch_size counts responses over all processes
        self.responses_per_step = tc.train_batch_size * cfg.rollout.n
        self.updates_per_step = tc.ppo_epochs * (self.responses_per_step // tc.ppo_mini_batch_size)
        self.total_updates = tc.total_steps * self.updates_per_step
        self.run_dir = Path(run_dir) if run_dir else self._default_run_dir()
        self.world_dir = Path(world_dir) if world_dir else resolve_world(cfg)
        seed_everything(tc.seed)
        model, self.tokenizer = load_policy_and_tokenizer(cfg, self.world_dir)
        zero3 = zero_stage(acc) == 3
        # the frozen reference (KL): a copy of the initial policy; under ZeRO-3 the policy was loaded partitioned
        # (transformers loads under deepspeed.zero.Init), so the reference is loaded the same way and sharded below
        ref = None
        if cfg.algorithm.kl_coef > 0:
            ref = load_policy_and_tokenizer(cfg, self.world_dir)[0] if zero3 else copy.deepcopy(model)
            ref.eval().requires_grad_(False)
        # ZeRO-3 + HF rollout: the engine generates on its own full copy (generation on the partitioned module would
        # need every rank to run the same forwards); weights are synced into it after every step
        engine_copy = None
        if zero3 and cfg.rollout.backend == "hf":
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
                engine_copy = copy.deepcopy(model).eval().requires_grad_(False)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=tc.lr, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay
        )
        # one scheduler step per applied optimiser step; warm-up = warmup_ratio of all optimiser steps (as verl)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, self.total_updates, tc.warmup_ratio, tc.lr_schedule)
        )
        if is_deepspeed(acc):
            plugin = acc.state.deepspeed_plugin
            plugin.deepspeed_config["gradient_clipping"] = tc.grad_clip
            plugin.deepspeed_config["gradient_accumulation_steps"] = 1  # the boundary is set by us, per micro-batch
            plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.scheduler = scheduler  # stepped by us (not prepared: no per-process rescaling)
        self.policy_dtype = next(acc.unwrap_model(self.model).parameters()).dtype
        self.ref_model = self._place_reference(ref) if ref is not None else None
        self.retriever = retriever if retriever is not None else self._make_retriever()
        engine_module = engine_copy.to(acc.device, self.policy_dtype) if engine_copy is not None else acc.unwrap_model(self.model)
        self.backend = make_backend(cfg, engine_module, self.tokenizer, policy_path(cfg, self.world_dir))
        self.train_rows = load_train_rows(cfg, self.world_dir)
        self.sampler = PromptSampler(self.train_rows, tc.train_batch_size, tc.seed, cfg.data.shuffle)
        self.detector = PhaseDetector()
        self.probe = ProbeSet(tc.probe_size)
        self.step = 0
        self.skipped_steps = 0
        self.history: list[dict[str, Any]] = []
        self._last_phase = "healthy"
        self._tis_weights: torch.Tensor | None = None  # this step's rollout-correction weights [B, T] (None = off)
        self.llds_warning = self._llds_noop_warning()
        if self.llds_warning and acc.is_main_process:
            warnings.warn(self.llds_warning)

    # ---------------------------------------------------------------- set-up helpers
    def _default_run_dir(self) -> Path:
        """``output_dir/run_name``; without a run_name ``output_dir/<config name>-<hash of the config>``, so rerunning
        the same command finds (and resumes) the same run (see :func:`default_run_name`)."""
        return Path(self.cfg.trainer.output_dir) / (self.cfg.trainer.run_name or default_run_name(self.cfg))

    def _make_retriever(self):
        from retriever import make_retriever

        default = (self.world_dir / "index") if self.world_dir else None
        return make_retriever(self.cfg.retriever, default_index_dir=default)

    def _place_reference(self, ref: torch.nn.Module) -> Any:
        """The frozen reference in the policy's dtype (so KL is exactly 0 while the weights agree) and placement:
        on the learner's device, or under ZeRO-3 sharded like the policy by a DeepSpeed inference-only engine."""
        acc = self.accelerator
        ref = ref.to(dtype=self.policy_dtype)
        if zero_stage(acc) != 3:
            return ref.to(acc.device)
        import deepspeed

        ds = acc.state.deepspeed_plugin.deepspeed_config
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "offload_param": ds.get("zero_optimization", {}).get(
                "offload_param", {"device": "none"})},
            "bf16": {"enabled": self.policy_dtype == torch.bfloat16},
            "fp16": {"enabled": self.policy_dtype == torch.float16},
        }
        engine, *_ = deepspeed.initialize(model=ref, config=config)
        engine.eval()
        return engine

    def _llds_noop_warning(self) -> str | None:
        a, t = self.cfg.algorithm, self.cfg.trainer
        if a.llds.enabled and a.llds.lam > 0 and not llds.llds_can_act(t.ppo_epochs, self.updates_per_step // t.ppo_epochs):
            return (
                "LLDS is enabled but is a permanent no-op: one optimiser step per rollout batch (ppo_epochs == 1 and "
                "ppo_mini_batch_size == train_batch_size x rollout.n responses) means logp_new == logp_old at every "
                "update. Use ppo_epochs > 1 or a smaller trainer.ppo_mini_batch_size."
            )
        return None

    # ---------------------------------------------------------------- log-probs
    def _forward_logp(self, model: torch.nn.Module, rows: dict[str, Any], compute_entropy: bool):
        """Token log-probs [b, t] (and entropy) of rows' responses: log_softmax(logits / temperature), computed from
        the final hidden states through the LM head chunk by chunk (full logits never exist; policy_logprobs)."""
        dev = self.accelerator.device
        return policy_logprobs.response_logprobs(
            model, rows["input_ids"][:, :-1].to(dev), rows["attention_mask"][:, :-1].to(dev),
            rows["position_ids"][:, :-1].to(dev), rows["responses"].to(dev), rows["p"] - 1,
            chunk_size=self.cfg.trainer.logprob_chunk_size,
            temperature=self.cfg.rollout.temperature if self.cfg.rollout.temperature > 0 else 1.0,
            compute_entropy=compute_entropy,
        )

    def agree_max(self, counts: Sequence[int]) -> list[int]:
        """Element-wise max of ``counts`` over all processes (one all-reduce): the number of micro-batches every rank
        runs, so that the collectives inside forward/backward (ZeRO-3 gathers, gradient reduction) pair up."""
        if self.world_size == 1 or not counts:
            return list(counts)
        t = torch.tensor(list(counts), dtype=torch.long, device=self.accelerator.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank (one all-reduce)."""
        return bool(self.agree_max([int(flag)])[0])

    @torch.no_grad()
    def batch_logp(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """[B, T] token log-probs of a whole TrajectoryBatch (micro-batched, no grad), on CPU. Every rank runs the same
        number of forwards (the missing ones re-run this rank's shortest row and are discarded)."""
        was_training = model.training
        model.eval()
        B, T = batch.responses.shape
        out = torch.zeros(B, T)
        lengths = batch.attention_mask.sum(1).tolist()
        micro = micro_batches_by_tokens(lengths, range(B), self.cfg.trainer.micro_batch_token_budget)
        (n_micro,) = self.agree_max([len(micro)])
        ctx = self.accelerator.autocast() if model is self.ref_model else contextlib.nullcontext()
        with ctx:  # the reference runs under the same autocast as the (prepared) policy
            for k in range(n_micro):
                mb = micro[k] if k < len(micro) else micro[0][:1]
                lp, _ = self._forward_logp(model, select_rows(batch, mb), compute_entropy=False)
                if k < len(micro):
                    out[torch.as_tensor(mb)] = pad_cols(lp.float().cpu(), T)
        model.train(was_training)
        return out * batch.response_mask

    def _probe_logp(self, trajectories: list[Any]):
        from searchr1_lld.rollout.types import to_batch

        batch = to_batch(trajectories, self.tokenizer.pad_token_id)
        return self.batch_logp(self.model, batch), batch.response_mask

    # ---------------------------------------------------------------- rollout
    def rollout(self, rows: list[dict], *, greedy: bool = False, n: int | None = None,
                rollout_cfg: RolloutConfig | None = None) -> list[Any]:
        from searchr1_lld.rollout.agent_loop import run_agent_loop

        unwrapped = self.accelerator.unwrap_model(self.model)
        was_training = unwrapped.training
        unwrapped.eval()
        with torch.no_grad():
            trajs = run_agent_loop(
                rows, backend=self.backend, tokenizer=self.tokenizer, retriever=self.retriever,
                cfg=rollout_cfg or self.cfg.rollout, n=self.cfg.rollout.n if n is None else n, greedy=greedy,
                template=self.cfg.data.prompt_template, chat_template=self.cfg.data.chat_template, progress=False,
            )
        unwrapped.train(was_training)
        return trajs

    # ---------------------------------------------------------------- rollout correction
    def _rollout_correction(self, batch: Any, logp_old: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Truncated-IS weights [B, T] for the step (algorithm.rollout_correction) and their statistics; None if off."""
        rc = self.cfg.algorithm.rollout_correction
        if rc.mode == "off":
            return None, {}
        if not batch.has_engine_logprobs:
            raise RuntimeError("algorithm.rollout_correction needs the engine's sampling log-probs, but the rollout "
                               "backend reported none")
        w = rollout_correction.tis_weights(logp_old, batch.engine_logprobs, batch.response_mask, mode=rc.mode,
                                           cap=rc.cap)
        return w, rollout_correction.weight_stats(logp_old, batch.engine_logprobs, batch.response_mask, w,
                                                  mode=rc.mode, cap=rc.cap)

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict[str, Any]:
        """One GRPO(+LLDS) step: rollout, advantages, ppo_epochs x mini-batches of updates, monitor. Returns metrics."""
        from searchr1_lld.rollout.types import to_batch

        cfg, acc, tc, alg = self.cfg, self.accelerator, self.cfg.trainer, self.cfg.algorithm
        seed_everything(step_seed(tc.seed, self.step, self.rank, self.world_size))
        t0 = time.time()
        prompts = self.sampler.next_batch()[self.rank :: self.world_size]
        trajs = self.rollout(prompts)
        t_rollout = time.time() - t0
        self.backend.sleep()  # engine memory -> learner for the update phase (woken after the weight stream below)
        batch = to_batch(trajs, self.tokenizer.pad_token_id)
        B = len(trajs)
        metrics: dict[str, Any] = {**rollout_metrics(trajs)}

        # advantages, old / reference log-probs
        advantages = adv_fns.grpo_outcome_advantages(
            batch.rewards, batch.group_ids, eps=alg.adv_eps, norm_by_std=alg.norm_adv_by_std
        )
        logp_old = self.batch_logp(self.model, batch)
        logp_ref = self.batch_logp(self.ref_model, batch) if self.ref_model is not None else None
        if batch.has_engine_logprobs:
            metrics["rollout/engine_learner_logp_gap"] = engine_learner_gap(
                batch.engine_logprobs, logp_old, batch.response_mask, torch.ones(B, dtype=torch.bool)
            )
        # train/inference mismatch correction (truncated importance sampling), applied in the policy loss
        self._tis_weights, tis_stats = self._rollout_correction(batch, logp_old)
        metrics.update(tis_stats)
        lam_answer = None
        if alg.llds.ma == "fixed":
            lam_answer = alg.llds.lam_answer
        elif alg.llds.ma == "adaptive":
            mean_vs = float(acc.reduce(batch.valid_searches.float().mean().to(acc.device), "mean"))
            lam_answer = llds.adaptive_lam_answer(alg.llds.lam_answer, mean_vs, alg.llds.ma_adaptive_rule)
        if alg.llds.enabled and lam_answer is not None:
            metrics["llds/lam_answer_effective"] = min(lam_answer, alg.llds.lam)

        # updates: mini-batches of ppo_mini_batch_size responses (this rank: its 1/world_size share), drawn from a
        # permutation of the rank's responses per epoch (groups may straddle mini-batches: advantages are final)
        sums: dict[str, float] = {}
        tokens_seen = 0.0
        grad_norms: list[float] = []
        skipped = 0
        pads = 0
        lengths = batch.attention_mask.sum(1).tolist()
        rows_per_mini = tc.ppo_mini_batch_size // self.world_size
        if B % rows_per_mini:
            raise ValueError(f"this rank has {B} responses, not a multiple of its mini-batch share {rows_per_mini} "
                             f"(trainer.ppo_mini_batch_size={tc.ppo_mini_batch_size} over {self.world_size} processes)")
        gen = torch.Generator().manual_seed(step_seed(tc.seed, self.step, self.rank, self.world_size))
        plan: list[list[list[int]]] = []  # [mini-batch][micro-batch][row]
        for _epoch in range(tc.ppo_epochs):
            perm = torch.randperm(B, generator=gen).tolist()
            for start in range(0, B, rows_per_mini):
                plan.append(micro_batches_by_tokens(lengths, perm[start : start + rows_per_mini],
                                                    tc.micro_batch_token_budget))
        n_micro = self.agree_max([len(m) for m in plan])  # the same micro-batch count on every rank
        spec = self._objective_spec()
        self.model.train()
        first_kl = [0.0, 0.0]  # KL(ref) token sum and tokens of the step's first mini-batch (before any update)
        for mi, (mini, count) in enumerate(zip(plan, n_micro)):
            rows_idx = [i for mb in mini for i in mb]
            mini_tokens, mini_resp = mini_batch_denominators(batch.response_mask[rows_idx])
            for k in range(count):
                pad = k >= len(mini)  # zero-weight micro-batch: this rank ran out, its peers did not
                mb = mini[0][:1] if pad else mini[k]
                m_metrics, n_tok = self._micro_step(batch, mb, advantages, logp_old, logp_ref, lam_answer, spec,
                                                    max(mini_tokens, 1.0), max(mini_resp, 1.0), last=k == count - 1,
                                                    weight=0.0 if pad else 1.0)
                pads += int(pad)
                if mi == 0 and not pad and "actor/kl_ref" in m_metrics:
                    first_kl[0] += m_metrics["actor/kl_ref"]
                    first_kl[1] += n_tok
                if not pad:
                    tokens_seen += n_tok
                    for key, v in m_metrics.items():
                        sums[key] = sums.get(key, 0.0) + v
            gn, ok = self._optimizer_step()
            grad_norms.append(gn)
            skipped += int(not ok)
            if ok:
                self.scheduler.step()  # per applied optimiser step
        self.skipped_steps += skipped

        # monitor: likelihoods after the step's updates
        logp_new = self.batch_logp(self.model, batch)
        metrics.update(likelihood_metrics(logp_old, logp_new, batch.response_mask, batch.rewards))
        firsts = [first_action_ids(t.response_ids, t.response_mask) for t in trajs]
        metrics["lld/shared_first_action_frac"] = shared_first_action_fraction(
            firsts, [t.reward for t in trajs], [t.group_id for t in trajs]
        )
        tok = max(tokens_seen, 1.0)
        for key in ("actor/entropy", "actor/pg_clip_frac", "actor/approx_kl", "actor/kl_ref", "actor/pg_loss",
                    "llds/active_token_frac", "llds/mean_penalty"):
            if key in sums:
                metrics[key] = sums[key] / tok  # token-weighted mean over all micro-batches of the step
        if "llds/loss_sum" in sums:
            metrics["llds/loss"] = sums["llds/loss_sum"] / max(len(grad_norms), 1)  # mean LLDS loss per update
        if "llds/gated_responses" in sums:
            metrics["llds/gated_responses_frac"] = sums["llds/gated_responses"] / max(sums["llds/responses"], 1.0)
            metrics["llds/gated_actions_frac"] = sums["llds/gated_actions"] / max(sums["llds/total_actions"], 1.0)
        finite_norms = [g for g in grad_norms if math.isfinite(g)]
        metrics["actor/grad_norm"] = max(finite_norms) if finite_norms else float("nan")
        metrics["actor/grad_norm_mean"] = sum(finite_norms) / len(finite_norms) if finite_norms else float("nan")
        metrics["actor/updates"] = float(len(grad_norms))
        metrics["actor/skipped_updates"] = float(skipped)
        if first_kl[1] > 0:  # 0 at step 0: the reference and the policy are the same weights in the same dtype
            metrics["actor/kl_ref_first_update"] = first_kl[0] / first_kl[1]
        metrics["actor/micro_batches"] = float(sum(n_micro))  # per rank, the same on every rank
        metrics["actor/padding_micro_batches"] = float(pads)  # this rank's zero-weight ones (mean over ranks)
        metrics["actor/skipped_updates_total"] = float(self.skipped_steps)
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["time/rollout_s"] = t_rollout
        metrics["time/step_s"] = time.time() - t0

        # probe set, phase
        self.probe.offer(trajs)
        if tc.probe_every and (self.step + 1) % tc.probe_every == 0:
            metrics.update(self.probe.measure(self._probe_logp))
        metrics = self._reduce_metrics(metrics)
        report = self.detector.update(metrics)
        metrics["phase/name"] = report.phase
        metrics["phase/id"] = float(PHASE_ID[report.phase])
        self._phase_report = report

        sync_weights_to_engine(acc, self.model, self.backend)
        self.backend.wake_up()
        self.step += 1
        return metrics

    def _objective_spec(self) -> ObjectiveSpec:
        alg = self.cfg.algorithm
        return ObjectiveSpec(
            policy_loss=alg.policy_loss, clip_low=alg.clip_low if alg.clip_low is not None else alg.clip_eps,
            clip_high=alg.clip_high if alg.clip_high is not None else alg.clip_eps, dual_clip=alg.dual_clip,
            agg_mode=alg.loss_agg_mode, kl_coef=alg.kl_coef, kl_type=alg.kl_type, entropy_coef=alg.entropy_coef,
            llds_lam=alg.llds.lam if alg.llds.enabled else 0.0, llds_gate=alg.llds.gate, llds_tau=alg.llds.tau,
        )

    def _micro_step(self, batch, mb, advantages, logp_old, logp_ref, lam_answer, spec, mini_tokens, mini_resp, *,
                    last: bool, weight: float = 1.0):
        """Forward + backward of one micro-batch of the objective (algo.objective, normalised by the mini-batch
        totals); ``weight`` 0 = a padding micro-batch (same collectives, zero gradient)."""
        dev = self.accelerator.device
        rows = select_rows(batch, mb)
        t = rows["responses"].shape[1]
        idx = torch.as_tensor(mb)
        mask = rows["response_mask"].to(dev)
        with self._sync_context(last):
            logp_new, entropy = self._forward_logp(self.model, rows, compute_entropy=True)
            loss, m = objective(
                spec, logp_new, logp_old[idx][:, :t].to(dev), advantages[idx].to(dev), mask,
                mini_tokens=mini_tokens, mini_responses=mini_resp,
                logp_ref=logp_ref[idx][:, :t].to(dev) if logp_ref is not None else None, entropy=entropy,
                answer_mask=rows["answer_mask"].to(dev) if lam_answer is not None else None, lam_answer=lam_answer,
                token_weights=None if self._tis_weights is None else self._tis_weights[idx][:, :t].to(dev),
            )
            self._backward(loss * weight if weight != 1.0 else loss, last)
        n_tok = float(mask.sum())
        out = {f"actor/{k}": m[k] * n_tok for k in ("pg_loss", "pg_clip_frac", "approx_kl", "entropy", "kl_ref") if k in m}
        if "llds/loss" in m:
            out["llds/active_token_frac"] = m["llds/active_token_frac"] * n_tok
            out["llds/mean_penalty"] = m["llds/mean_penalty"] * n_tok
            out["llds/loss_sum"] = m["llds/loss"]  # mini-batch normalised: sums to the mini-batch loss
            out["llds/gated_responses"] = m["llds/gated_responses"]
            out["llds/gated_actions"] = m["llds/gated_actions"]
            out["llds/total_actions"] = m["llds/total_actions"]
            out["llds/responses"] = float(len(mb))
        return out, n_tok

    def _sync_context(self, last: bool):
        """No gradient all-reduce on non-final micro-batches (DDP); DeepSpeed: the engine's boundary flag."""
        if self.world_size > 1 and not last and not is_deepspeed(self.accelerator):
            return self.accelerator.no_sync(self.model)
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """DeepSpeed: drive the engine directly -- boundary flag per micro-batch, engine.backward (gradient reduction
        at the boundary); its step is taken by :meth:`_optimizer_step`, once per mini-batch. Else accelerate."""
        if is_deepspeed(self.accelerator):
            self.model.set_gradient_accumulation_boundary(last)
            self.model.backward(loss)
        else:
            self.accelerator.backward(loss)

    def _deepspeed_grad_norm(self) -> float:
        """Global (all ranks) L2 norm of the mini-batch gradient held by the DeepSpeed engine, before its step."""
        engine = self.model
        opt = engine.optimizer
        stage = zero_stage(self.accelerator)
        if stage in (1, 2) and hasattr(opt, "scaled_global_norm"):
            return float(opt.scaled_global_norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
        if stage == 3 and hasattr(opt, "_get_norm_groups"):
            norms = torch.stack([torch.as_tensor(n, dtype=torch.float32).reshape(()) for n in opt._get_norm_groups()])
            if (~torch.isfinite(norms) | (norms < 0)).any():  # DeepSpeed marks a non-finite group norm with -1
                return float("inf")
            return float(norms.norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
        if stage == 0:  # gradients are all-reduced at the boundary backward: the local norm is the global norm
            grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
            return float(torch.stack(grads).norm()) if grads else 0.0
        import deepspeed

        raise RuntimeError(f"DeepSpeed {deepspeed.__version__} ZeRO-{stage}: no gradient-norm method found on "
                           f"{type(opt).__name__}; this trainer supports the DeepSpeed range in pyproject.toml")

    def _optimizer_step(self) -> tuple[float, bool]:
        """One optimiser step on the accumulated mini-batch gradient. The global grad norm (before clipping) is checked
        on every rank *before* the step; non-finite on any rank: the update is skipped on all ranks (gradients
        discarded, no optimiser / scheduler step). Returns (norm, applied)."""
        acc, tc = self.accelerator, self.cfg.trainer
        if is_deepspeed(acc):
            engine = self.model
            gn = self._deepspeed_grad_norm()
            bad = self.any_rank(not math.isfinite(gn))
            if not bad:
                engine.step()  # clips to gradient_clipping and applies the update
                return gn, True
            if zero_stage(acc) == 0:
                engine.zero_grad()
                return gn if not math.isfinite(gn) else float("nan"), False
            # ZeRO 1-3: the engine's own step discards a non-finite gradient on every rank (its overflow path clears
            # the partitioned gradients); verify it did, so a non-finite update is never applied silently
            engine.step()
            if getattr(engine.optimizer, "overflow", False) is not True:
                raise RuntimeError("non-finite gradient norm, but the DeepSpeed engine applied the step")
            return gn if not math.isfinite(gn) else float("nan"), False
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), tc.grad_clip)  # total norm before clipping (global)
        gn = float(grad_norm)
        if self.any_rank(not math.isfinite(gn)):
            self.optimizer.zero_grad(set_to_none=True)
            return gn if not math.isfinite(gn) else float("nan"), False
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return gn, True

    def _reduce_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Mean of float metrics over processes (NaN-aware is not attempted: NaN on any rank stays NaN)."""
        if self.world_size == 1:
            return metrics
        keys = sorted(k for k, v in metrics.items() if isinstance(v, float))
        vals = torch.tensor([metrics[k] for k in keys], device=self.accelerator.device)
        vals = self.accelerator.reduce(vals, "mean")
        return {**metrics, **{k: float(v) for k, v in zip(keys, vals.tolist())}}

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, rows: list[dict], desc: str = "eval") -> dict[str, float]:
        """Greedy EM on ``rows`` through the agent loop (eval.max_turns, eval.topk); rows sharded over processes."""
        if not rows:
            return {}
        rc = dataclasses.replace(self.cfg.rollout, max_turns=self.cfg.eval.max_turns, topk=self.cfg.eval.topk)
        mine = rows[self.rank :: self.world_size]
        rewards: list[float] = []
        hops: list[int] = []
        bs = self.cfg.eval.batch_size
        for start in range(0, len(mine), bs):
            trajs = self.rollout(mine[start : start + bs], greedy=True, n=1, rollout_cfg=rc)
            rewards += [float(t.reward) for t in trajs]
            hops += [int((t.row.get("metadata") or {}).get("hops", 0)) for t in trajs]
        totals = torch.tensor([sum(rewards), float(len(rewards))], device=self.accelerator.device)
        if self.world_size > 1:
            totals = self.accelerator.reduce(totals, "sum")
        return {"em": float(totals[0] / totals[1].clamp(min=1)), "n": float(totals[1])}

    def benchmark_rows(self) -> dict[str, list[dict]]:
        """The configured benchmarks (eval.datasets, first trainer.eval_limit or else eval.limit questions of each), for
        evaluation during non-synthetic runs; loaded once at the start so a missing dataset fails before training."""
        from searchr1_lld import evaluation

        names = evaluation.parse_datasets(self.cfg.eval.datasets)
        limit = self.cfg.trainer.eval_limit or self.cfg.eval.limit
        return evaluation.load_eval_rows(names, world_dir=self.cfg.data.world_dir, limit=limit)

    def evaluate_benchmarks(self, rows_by_dataset: dict[str, list[dict]]) -> dict[str, float]:
        """eval/<dataset>/em for each benchmark and eval/avg_em (mean over datasets), greedy, eval.max_turns/topk."""
        out = {f"eval/{name}/em": self.evaluate(rows, desc=name)["em"] for name, rows in rows_by_dataset.items()}
        out["eval/avg_em"] = sum(out.values()) / max(len(out), 1)
        return out

    # ---------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        state = {
            "data": self.sampler.state(),
            "skipped_steps": self.skipped_steps,
            "history": self.detector.history,
            "probe": [dataclasses.asdict(t) for t in self.probe.trajectories],
        }
        return ckpt.save_checkpoint(
            self.run_dir, self.step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trainer_state=state, accelerator=self.accelerator, keep_last_k=self.cfg.trainer.keep_last_k,
        )

    def maybe_resume(self) -> Path | None:
        path = ckpt.resolve_resume(self.cfg.trainer.resume, self.run_dir)
        if path is None:
            return None
        from searchr1_lld.rollout.types import Trajectory

        state = ckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                     accelerator=self.accelerator)
        self.step = int(state["step"])
        self.sampler.load_state(state["data"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.detector.history = list(state.get("history", []))
        self.probe.trajectories = [Trajectory(**{**t, "action_spans": [tuple(s) for s in t["action_spans"]]})
                                   for t in state.get("probe", [])]
        sync_weights_to_engine(self.accelerator, self.model, self.backend)
        return path

    # ---------------------------------------------------------------- the loop
    def _settle_config(self, allow_changes: Sequence[str]) -> list[str]:
        """Before resuming: refuse a config that differs from the one the checkpoint's run was started with (except
        keys in ``allow_changes``); then write config.yaml (an accepted change keeps the old file as
        ``config.before-step_N.yaml``). Returns the lines to log."""
        resume_from = ckpt.resolve_resume(self.cfg.trainer.resume, self.run_dir)
        path = self.run_dir / "config.yaml"
        saved_path = (resume_from.parent.parent / "config.yaml") if resume_from is not None else path
        notes: list[str] = []
        if resume_from is not None and saved_path.is_file():
            changed = check_resume_config(read_yaml(saved_path), self.cfg, allow_changes)
            if changed and self.accelerator.is_main_process and saved_path == path:
                backup = self.run_dir / f"config.before-{resume_from.name}.yaml"
                backup.write_text(path.read_text())
                notes.append(f"config changed on resume (allowed): "
                             + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                             + f"; the earlier config is kept as {backup.name}")
                if any(k.startswith("eval.") or k == "trainer.eval_limit" for k in changed):
                    (self.run_dir / "eval_before.json").unlink(missing_ok=True)  # measured with the old settings
        elif resume_from is None and self.accelerator.is_main_process:
            # starting over in a used directory: keep the earlier run's files (a later resume=auto must not find its
            # checkpoints, its metrics must not be mixed with the new ones)
            earlier = [self.run_dir / n for n in ("checkpoints", "metrics.jsonl", "eval_before.json", "eval.json",
                                                   "eval.md", "plots", "config.yaml") if (self.run_dir / n).exists()]
            if any(p.name in ("checkpoints", "metrics.jsonl") for p in earlier):
                archive = self.run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
                archive.mkdir()
                for p in earlier:
                    p.rename(archive / p.name)
                notes.append(f"starting over in {self.run_dir} (trainer.resume={self.cfg.trainer.resume}): the earlier "
                             f"run's checkpoints, metrics and config were moved to {archive.name}/")
        if self.accelerator.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.cfg, path.with_name(path.name + ".part"))  # atomic: other ranks may be reading it
            path.with_name(path.name + ".part").rename(path)
        return notes

    def run(self, *, evaluate: bool = True, allow_changes: Sequence[str] = ()) -> RunResult:
        """Train to ``trainer.total_steps`` (resuming per ``trainer.resume``). ``allow_changes``: config keys that may
        differ from the resumed run's saved config (see :data:`RESUME_SAFE_KEYS`); any other difference is refused."""
        cfg, acc, tc = self.cfg, self.accelerator, self.cfg.trainer
        main = acc.is_main_process
        notes = self._settle_config(allow_changes)
        resumed = self.maybe_resume()
        tracker = Tracker(self.run_dir, cfg.logging, cfg.to_dict(), total_steps=tc.total_steps,
                          start_step=self.step, enabled=main)
        for note in notes:
            tracker.write(note)
        if resumed is not None:
            tracker.write(f"resumed from {resumed} at step {self.step}")
        if self.llds_warning:
            tracker.write(f"WARNING: {self.llds_warning}")
        test_rows = load_test_rows(cfg, self.world_dir) if cfg.data.source == "synthetic" else []
        bench_rows = self.benchmark_rows() if evaluate and tc.eval_every and cfg.data.source != "synthetic" else {}
        if tc.eval_limit:
            test_rows = test_rows[: tc.eval_limit]
        em_before = em_after = None
        before_path = self.run_dir / "eval_before.json"
        if evaluate and test_rows:
            if before_path.is_file():
                em_before = json.loads(before_path.read_text())["em"]
            else:
                em_before = self.evaluate(test_rows)["em"]
                if main:
                    before_path.write_text(json.dumps({"em": em_before, "n": len(test_rows)}))
            tracker.write(f"test EM before training: {em_before:.4f} ({len(test_rows)} questions)")
        last_metrics: dict[str, Any] = {}
        while self.step < tc.total_steps:
            metrics = self.train_step()
            if tc.eval_every and evaluate and test_rows and self.step % tc.eval_every == 0 and self.step < tc.total_steps:
                metrics["eval/em"] = self.evaluate(test_rows)["em"]
            if bench_rows and (self.step % tc.eval_every == 0 or self.step == tc.total_steps):
                metrics.update(self.evaluate_benchmarks(bench_rows))
            tracker.log(self.step, metrics)
            self.history.append({"step": self.step, **metrics})
            last_metrics = metrics
            report = self._phase_report
            if report.phase != self._last_phase:
                tracker.write(f"step {self.step}: phase {self._last_phase} -> {report.phase}: {'; '.join(report.reasons)}")
                self._last_phase = report.phase
            if report.warning:
                tracker.write(f"step {self.step}: {report.warning}")
            if tc.save_every and self.step % tc.save_every == 0 and self.step < tc.total_steps:
                self.save()
        if tc.save_every or tc.resume != "never":
            if not ckpt.latest_checkpoint(self.run_dir) or ckpt.latest_checkpoint(self.run_dir).name != f"step_{self.step:06d}":
                self.save()
        table = ""
        if evaluate and test_rows:
            em_after = self.evaluate(test_rows)["em"]
            table = eval_table(em_before, em_after, len(test_rows))
            if main:
                (self.run_dir / "eval.md").write_text(table + "\n")
                (self.run_dir / "eval.json").write_text(json.dumps({"em_before": em_before, "em_after": em_after,
                                                                    "n": len(test_rows)}))
            tracker.write(table)
        if main and self.skipped_steps:
            tracker.write(f"skipped {self.skipped_steps} updates with non-finite gradients")
        tracker.close()
        return RunResult(run_dir=self.run_dir, steps=self.step, final_metrics=last_metrics, em_before=em_before,
                         em_after=em_after, skipped_steps=self.skipped_steps, eval_table=table, history=self.history)


def eval_table(em_before: float | None, em_after: float | None, n: int) -> str:
    """Markdown before/after EM table."""
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    delta = "-" if em_before is None or em_after is None else f"{em_after - em_before:+.4f}"
    return "\n".join([
        f"| test EM (n={n}) | before | after | change |",
        "| --- | --- | --- | --- |",
        f"| synthetic world | {fmt(em_before)} | {fmt(em_after)} | {delta} |",
    ])


def train(cfg: Config, *, run_dir: str | Path | None = None, retriever: Any = None, evaluate: bool = True,
          allow_changes: Sequence[str] = ()) -> RunResult:
    """Train with ``cfg`` (validated Config) and return a :class:`RunResult`. The lab and the demo call this."""
    cfg.validate()
    trainer = Trainer(cfg, run_dir=run_dir, retriever=retriever)
    return trainer.run(evaluate=evaluate, allow_changes=allow_changes)
