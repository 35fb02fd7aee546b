"""Set-up of the learner, one factory per thing: the accelerator, the policy and its tokenizer, the frozen reference,
the rollout engine's module, the retriever, the QA rows. Everything is named by the config (``model.path``,
``retriever.*``, ``data.*``); nothing here builds data, indexes or models."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import torch

import accelerate
from tqdm.auto import tqdm

import retriever
from searchr1_lld.config import Config
from searchr1_lld.data import flashrag, splits
from searchr1_lld.data.jsonl import read_rows_files
from searchr1_lld.learner import policy_logprobs
from searchr1_lld.learner.engines import TrainingEngine
from searchr1_lld.protocols import Accelerator, Retriever, Tokenizer
from searchr1_lld.rollout.agent_loop import encode_prompt
from searchr1_lld.rollout.backends import BackendKind


def make_accelerator(cfg: Config) -> accelerate.Accelerator:
    """accelerate's Accelerator for ``trainer.device`` / ``model.dtype`` (fp32 on CPU; bf16 autocast on GPU by
    default); DeepSpeed when launched with a DeepSpeed config."""
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
        handlers.append(accelerate.utils.InitProcessGroupKwargs(backend="gloo"))
        without_deepspeed_shm_op()
    return accelerate.Accelerator(cpu=use_cpu and not deepspeed_requested, mixed_precision=mixed, kwargs_handlers=handlers)


def without_deepspeed_shm_op() -> None:
    """Keep DeepSpeed's CPU communication backend on gloo: as it starts it JIT-compiles its shared-memory all-reduce
    op (``deepspeed_shm_comm``: one to five minutes of g++ on a first launch, and again in every new build directory)
    unless its table of compatible ops, which it reads before building, says the op is unavailable. gloo's
    all-reduce does the same job at the sizes this project runs on CPU ranks."""
    import deepspeed.ops  # deferred: DeepSpeed is imported only by launches that asked for it

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def load_policy_and_tokenizer(cfg: Config):
    """(policy in fp32 master weights, tokenizer with a pad token) from model.path (and model.tokenizer_path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = cfg.model.path
    if not model_path:
        raise ValueError("model.path is empty: name the policy (an HF hub id or a local dir), e.g. "
                         "model.path=.cache/world/model for the synthetic world (python -m searchr1_lld.world build)")
    tok_path = cfg.model.tokenizer_path or model_path
    tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=cfg.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.model.trust_remote_code, "dtype": torch.float32}
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)  # fp32 master weights; bf16 via autocast
    if cfg.trainer.pack_sequences:  # sdpa attention that also runs packed forwards (unpacked ones unchanged)
        policy_logprobs.use_packed_attention(model)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model, tokenizer


def make_reference(cfg: Config, policy: torch.nn.Module, engine: TrainingEngine) -> torch.nn.Module | None:
    """The frozen reference of the KL term (None when kl_coef == 0): a copy of the initial policy, as the training
    engine copies it (ZeRO-3 loads it again: the policy was loaded partitioned); placed by the engine once the
    policy's dtype is known (``engine.place_reference``)."""
    if cfg.algorithm.kl_coef <= 0:
        return None
    ref = engine.reference_copy(policy, lambda: load_policy_and_tokenizer(cfg)[0])
    return ref.eval().requires_grad_(False)


def engine_copy(cfg: Config, kind: BackendKind, policy: torch.nn.Module, accelerator: Accelerator,
                engine: TrainingEngine) -> torch.nn.Module | None:
    """A training engine that partitions the parameters (ZeRO-3) + a kind that generates on the learner's module
    (HF): the rollout engine generates on its own whole model (generation on the partitioned module would need every
    rank to run the same forwards), built from the policy's config outside the partitioning, on the learner's device
    in the policy's dtype. Its weights are not set here: the trainer streams the learner's into it at start and
    after every step, through the same path (``engine.named_weights``). Else None (the rollout engine generates on
    the learner's own module, or loads its own)."""
    if not (engine.partitions_parameters and kind.generates_on_learner_module):
        return None
    from transformers import AutoModelForCausalLM

    dtype = next(policy.parameters()).dtype
    with engine.outside_partitioning():
        model = AutoModelForCausalLM.from_config(policy.config, trust_remote_code=cfg.model.trust_remote_code,
                                                 dtype=dtype)
    return model.to(accelerator.device).eval().requires_grad_(False)


def make_retriever(cfg: Config, engine: TrainingEngine | None = None) -> Retriever:
    """retriever.make_retriever on ``cfg.retriever`` (in-process: ``retriever.index_dir``; http: the address of
    retriever.service_address: ``$SEARCHR1_RETRIEVER_URL`` over ``retriever.url``, the token likewise). An in-process
    encoder is loaded whole even where the training ``engine`` partitions the models it loads (ZeRO-3:
    ``engine.outside_partitioning``)."""
    rc = retriever.retriever_mode(cfg.retriever).addressed(cfg.retriever)
    with engine.outside_partitioning() if engine is not None else contextlib.nullcontext():
        return retriever.make_retriever(rc)


def _source_rows(cfg: Config) -> list[dict]:
    """The rows of ``data.source``: those of ``data.train_files``, or FlashRAG's ``data.train_mix`` (before the
    validation hold-out)."""
    if cfg.data.source == "files":
        if not cfg.data.train_files:
            raise ValueError("data.train_files is empty: name the training rows (JSONL/parquet), e.g. "
                             ".cache/world/qa/train.jsonl of the synthetic world, or set data.source=flashrag")
        return read_rows_files(cfg.data.train_files)
    return flashrag.load_train_rows(cfg.data.train_mix)


def load_train_and_val_rows(cfg: Config) -> tuple[list[dict], list[dict]]:
    """(training prompts, validation rows): ``data.val_holdout`` held out of the rows of ``data.source`` when its
    size is > 0 (:func:`searchr1_lld.data.splits.hold_out`: the training rows lose the validation questions), else
    those rows and the rows of ``data.val_files`` ([] when none)."""
    holdout = cfg.data.val_holdout
    if holdout.size:
        return splits.hold_out(_source_rows(cfg), holdout.size, holdout.seed)
    return _source_rows(cfg), read_rows_files(cfg.data.val_files)


def load_train_rows(cfg: Config) -> list[dict]:
    """The training prompts: the rows of ``data.source`` less the validation hold-out."""
    return load_train_and_val_rows(cfg)[0]


def load_test_rows(cfg: Config) -> list[dict]:
    """The held-out rows of ``data.test_files`` ([] when none)."""
    return read_rows_files(cfg.data.test_files)


def load_val_rows(cfg: Config) -> list[dict]:
    """The validation rows: the hold-out of ``data.val_holdout``, else those of ``data.val_files`` ([] when none)."""
    return load_train_and_val_rows(cfg)[1] if cfg.data.val_holdout.size else read_rows_files(cfg.data.val_files)


def check_prompt_lengths(rows: list[dict], tokenizer: Tokenizer, cfg: Config) -> None:
    """``data.max_prompt_length``: every training prompt (template applied, tokenised as the agent loop does) must
    fit, else a clear error naming the longest one (Search-R1 / verl refuse over-long prompts the same way)."""
    d = cfg.data
    longest, worst = 0, None
    for r in tqdm(rows, desc="prompt lengths", unit="prompt", disable=len(rows) < 5000):
        n = len(encode_prompt(tokenizer, r["question"], d.prompt_template, d.chat_template))
        if n > longest:
            longest, worst = n, r
    if longest > d.max_prompt_length:
        raise ValueError(f"data.max_prompt_length={d.max_prompt_length}: the training prompt of row "
                         f"{worst.get('id')!r} is {longest} tokens (the longest of {len(rows)}); raise "
                         f"data.max_prompt_length (below rollout.max_total_length) or drop the long rows")
