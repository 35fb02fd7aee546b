"""Checks of a config's values (types are checked when it is built: loading.py). Each message names the key."""

from __future__ import annotations

from typing import Any

from searchr1_lld.data.specs import EvalError, parse_datasets



class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


def get_dotted(obj: Any, key: str) -> Any:
    """``get_dotted(cfg, "trainer.lr")`` = ``cfg.trainer.lr``."""
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj



def raise_first(checks: list[tuple[bool, str, str]], cfg: Any, prefix: str = "") -> None:
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"{prefix}{key}: {msg} (got {get_dotted(cfg, key)!r})")


def validate(cfg: Any) -> None:
    """Reject impossible values of a run config (:class:`~searchr1_lld.config.Config`)."""
    from searchr1_lld.algo.policy_loss import POLICY_LOSSES

    checks: list[tuple[bool, str, str]] = [
        (cfg.algorithm.llds.lam >= 0, "algorithm.llds.lam", "must be >= 0"),
        (cfg.algorithm.llds.lam_answer >= 0, "algorithm.llds.lam_answer", "must be >= 0"),
        (cfg.algorithm.clip_eps > 0, "algorithm.clip_eps", "must be > 0"),
        (cfg.algorithm.clip_low is None or cfg.algorithm.clip_low > 0, "algorithm.clip_low", "must be > 0"),
        (cfg.algorithm.clip_high is None or cfg.algorithm.clip_high > 0, "algorithm.clip_high", "must be > 0"),
        (cfg.algorithm.dual_clip is None or cfg.algorithm.dual_clip > 1, "algorithm.dual_clip", "must be > 1"),
        (cfg.algorithm.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0"),
        (cfg.algorithm.adv_eps > 0, "algorithm.adv_eps", "must be > 0"),
        (cfg.rollout.n >= 1, "rollout.n", "must be >= 1"),
        (cfg.rollout.temperature >= 0, "rollout.temperature", "must be >= 0"),
        (0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]"),
        (cfg.rollout.max_turns >= 1, "rollout.max_turns", "must be >= 1"),
        (cfg.rollout.max_tokens_per_turn >= 1, "rollout.max_tokens_per_turn", "must be >= 1"),
        (cfg.rollout.max_obs_length >= 1, "rollout.max_obs_length", "must be >= 1"),
        (cfg.rollout.max_total_length > cfg.data.max_prompt_length, "rollout.max_total_length",
         f"must exceed data.max_prompt_length ({cfg.data.max_prompt_length})"),
        (cfg.rollout.topk >= 1, "rollout.topk", "must be >= 1"),
        (cfg.data.max_prompt_length >= 1, "data.max_prompt_length", "must be >= 1"),
        (0 < cfg.rollout.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]"),
        (cfg.rollout.vllm_tensor_parallel_size == 1, "rollout.vllm_tensor_parallel_size",
         "must be 1: one engine per rank (TP ranks would have to call generate in lockstep, which the multi-turn "
         "agent loop does not; see rollout/backends/vllm.py)"),
        (cfg.rollout.vllm_sleep_level in (1, 2), "rollout.vllm_sleep_level", "must be 1 or 2"),
        (cfg.rollout.vllm_kv_cache_memory_bytes >= 0, "rollout.vllm_kv_cache_memory_bytes", "must be >= 0"),
        (cfg.algorithm.rollout_correction.cap >= 1, "algorithm.rollout_correction.cap", "must be >= 1"),
        (cfg.rollout.generation_batch_size >= 1, "rollout.generation_batch_size", "must be >= 1"),
        (cfg.rollout.vllm_logprobs_mode in ("", "raw_logprobs", "processed_logprobs"), "rollout.vllm_logprobs_mode",
         "must be '', 'raw_logprobs' or 'processed_logprobs'"),
        (cfg.retriever.max_retries is None or cfg.retriever.max_retries >= 0, "retriever.max_retries",
         "must be null or >= 0"),
        (cfg.retriever.max_wait_s >= 0, "retriever.max_wait_s", "must be >= 0"),
        (cfg.retriever.timeout_s > 0, "retriever.timeout_s", "must be > 0"),
        (cfg.retriever.batch_size >= 1, "retriever.batch_size", "must be >= 1"),
        (cfg.retriever.backoff_s >= 0, "retriever.backoff_s", "must be >= 0"),
        (cfg.trainer.total_steps >= 1, "trainer.total_steps", "must be >= 1"),
        (cfg.trainer.train_batch_size >= 1, "trainer.train_batch_size", "must be >= 1"),
        (1 <= cfg.trainer.ppo_mini_batch_size <= cfg.trainer.train_batch_size * cfg.rollout.n,
         "trainer.ppo_mini_batch_size",
         f"counts responses: must be in [1, trainer.train_batch_size x rollout.n = "
         f"{cfg.trainer.train_batch_size * cfg.rollout.n}]"),
        ((cfg.trainer.train_batch_size * cfg.rollout.n) % max(cfg.trainer.ppo_mini_batch_size, 1) == 0,
         "trainer.ppo_mini_batch_size",
         f"counts responses: must divide trainer.train_batch_size x rollout.n = "
         f"{cfg.trainer.train_batch_size} x {cfg.rollout.n} = {cfg.trainer.train_batch_size * cfg.rollout.n}"),
        (cfg.trainer.ppo_epochs >= 1, "trainer.ppo_epochs", "must be >= 1"),
        (cfg.trainer.lr > 0, "trainer.lr", "must be > 0"),
        (0 <= cfg.trainer.warmup_ratio < 1, "trainer.warmup_ratio", "must be in [0, 1)"),
        (cfg.trainer.grad_clip > 0, "trainer.grad_clip", "must be > 0"),
        (len(cfg.trainer.adam_betas) == 2 and all(0 <= b < 1 for b in cfg.trainer.adam_betas),
         "trainer.adam_betas", "must be two numbers in [0, 1)"),
        (cfg.trainer.micro_batch_token_budget >= 1, "trainer.micro_batch_token_budget", "must be >= 1"),
        (cfg.trainer.micro_batch_size >= 0, "trainer.micro_batch_size", "must be >= 0 (0 = cut by the token budget)"),
        (cfg.trainer.micro_batch_size == 0 or cfg.trainer.ppo_mini_batch_size % cfg.trainer.micro_batch_size == 0,
         "trainer.micro_batch_size", f"must divide trainer.ppo_mini_batch_size ({cfg.trainer.ppo_mini_batch_size})"),
        (cfg.trainer.keep_last_k >= 1, "trainer.keep_last_k", "must be >= 1"),
        (cfg.trainer.save_every >= 0, "trainer.save_every", "must be >= 0"),
        (not cfg.trainer.keep_best.startswith("eval/") or cfg.trainer.eval_every > 0, "trainer.keep_best",
         f"{cfg.trainer.keep_best} is logged only when trainer.eval_every > 0"),
        (cfg.trainer.logprob_chunk_size >= 0, "trainer.logprob_chunk_size", "must be >= 0 (0 = sized to the device)"),
        (cfg.data.train_mix in ("nq", "nq+hotpotqa"), "data.train_mix", "must be 'nq' or 'nq+hotpotqa'"),
        (cfg.retriever.mode != "http" or cfg.retriever.url.startswith(("http://", "https://")), "retriever.url",
         "must start with http:// or https://"),
        (cfg.eval.limit >= 0, "eval.limit", "must be >= 0"),
        (cfg.eval.batch_size >= 1, "eval.batch_size", "must be >= 1"),
        (cfg.eval.max_turns >= 1, "eval.max_turns", "must be >= 1"),
        (cfg.eval.topk >= 1, "eval.topk", "must be >= 1"),
        (_datasets_ok(cfg.eval.datasets), "eval.datasets",
         "must be benchmark names of the seven (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle), "
         "all, or NAME=PATH rows files, each name once"),
        (cfg.algorithm.policy_loss in POLICY_LOSSES, "algorithm.policy_loss",
         f"must name a registered policy loss {sorted(POLICY_LOSSES)}"),
    ]
    raise_first(checks, cfg)


def _datasets_ok(datasets: list[str]) -> bool:
    if not datasets:
        return True
    try:
        parse_datasets(datasets)
    except EvalError:
        return False
    return True
