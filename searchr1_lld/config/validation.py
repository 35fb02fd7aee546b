"""Checks of a config's values (types are checked when it is built: loading.py), one named function per section;
each check is (ok, dotted key, what the value must be), and the message of a failing one names the key.
:func:`raise_first` serves any config dataclass (the run's, the synthetic world's)."""

from __future__ import annotations

import math
import re
from typing import Any

from retriever.modes import MODES, retriever_mode
from searchr1_lld.config.correction_presets import CORRECTION_PRESETS
from searchr1_lld.config.correction_presets import registered_names as correction_names
from searchr1_lld.config.methods import METHODS
from searchr1_lld.config.sections import (AlgorithmConfig, DataConfig, EvalConfig, RetrieverConfig, RolloutConfig,
                                          StepSizeConfig, TrainerConfig)
from searchr1_lld.data.prompts import TEMPLATES
from searchr1_lld.data.specs import EvalError, parse_datasets

Check = tuple[bool, str, str]  # (the value is fine, its dotted key, what it must be)
# the metrics of the validation split (learner/trainer.py): eval/val_em, eval/val_sub_em, eval/val/<source>/em,
# eval/val_sub/<source>/em; every other eval/ metric is computed on a test split (data.test_files, eval.datasets)
VALIDATION_METRIC = re.compile(r"eval/val(_sub)?(_em|/[^/]+/em)")


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


def get_dotted(obj: Any, key: str) -> Any:
    """``get_dotted(cfg, "trainer.lr")`` = ``cfg.trainer.lr``."""
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def raise_first(checks: list[Check], cfg: object, prefix: str = "") -> None:
    """ConfigError ``<prefix><key>: <what it must be> (got <value>)`` for the first failing check; ``cfg`` is the
    config dataclass the checks' dotted keys start from."""
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"{prefix}{key}: {msg} (got {get_dotted(cfg, key)!r})")


def registered_names() -> dict[str, list[str]]:
    """The names registered in algo/ by table: policy losses, advantage estimators, aggregation modes, the rollout
    correction's weight modes and rejection rules (imported here: the config loads without torch until checked)."""
    from searchr1_lld.algo.advantages import ADVANTAGE_ESTIMATORS  # deferred: torch
    from searchr1_lld.algo.aggregation import AGGREGATIONS  # deferred: torch
    from searchr1_lld.algo.batch_filters import BATCH_FILTERS  # deferred: torch
    from searchr1_lld.algo.kl import KL_ESTIMATORS  # deferred: torch
    from searchr1_lld.algo.llds import ADAPTIVE_RULES, ANSWER_MASK_MODES, GATES  # deferred: torch
    from searchr1_lld.algo.nthr import ETA_RULES  # deferred: torch
    from searchr1_lld.algo.objective import LOSS_SCALES  # deferred: torch
    from searchr1_lld.algo.policy_loss import POLICY_LOSSES  # deferred: torch
    from searchr1_lld.algo.reward_shaping import REWARD_SHAPINGS  # deferred: torch

    return {"policy_loss": sorted(POLICY_LOSSES), "advantage": sorted(ADVANTAGE_ESTIMATORS),
            "loss_agg_mode": list(AGGREGATIONS), "loss_scale": list(LOSS_SCALES), "kl_type": list(KL_ESTIMATORS),
            "llds.gate": list(GATES), "llds.ma": list(ANSWER_MASK_MODES),
            "llds.ma_adaptive_rule": list(ADAPTIVE_RULES), "nthr.eta_rule": list(ETA_RULES),
            "reward_shaping": sorted(REWARD_SHAPINGS), "dynamic_sampling.filter": sorted(BATCH_FILTERS),
            **{f"rollout_correction.{k}": v for k, v in correction_names().items()}}


def takes_lower_bound(rejection: str) -> bool:
    """Whether the registered rejection rule ``rejection`` bounds a ratio from below too (algo/rollout_correction)."""
    from searchr1_lld.algo.rollout_correction import takes_lower_bound as takes  # deferred: torch

    return takes(rejection)


def algorithm_checks(alg: AlgorithmConfig) -> list[Check]:
    """algorithm.*: the method's name, coefficients, clip ranges, the registered names of the advantage estimator,
    the policy loss and the aggregation mode."""
    names = registered_names()
    return [
        (alg.method == "" or alg.method in METHODS, "algorithm.method", f"must be '' or a preset {list(METHODS)}"),
        (alg.llds.lam >= 0, "algorithm.llds.lam", "must be >= 0"),
        (alg.llds.lam_answer >= 0, "algorithm.llds.lam_answer", "must be >= 0"),
        (alg.nll_anchor.coef >= 0, "algorithm.nll_anchor.coef", "must be >= 0"),
        (alg.clip_eps > 0, "algorithm.clip_eps", "must be > 0"),
        (alg.clip_low is None or alg.clip_low > 0, "algorithm.clip_low", "must be > 0"),
        (alg.clip_high is None or alg.clip_high > 0, "algorithm.clip_high", "must be > 0"),
        (alg.dual_clip is None or alg.dual_clip > 1, "algorithm.dual_clip", "must be > 1"),
        (alg.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0"),
        (alg.adv_eps > 0, "algorithm.adv_eps", "must be > 0"),
        (alg.seq_token_sum_norm >= 1, "algorithm.seq_token_sum_norm", "must be >= 1"),
        (alg.clip_cov.ratio > 0, "algorithm.clip_cov.ratio", "must be > 0"),
        (alg.clip_cov.lb < alg.clip_cov.ub, "algorithm.clip_cov.lb", f"must be below clip_cov.ub ({alg.clip_cov.ub})"),
        (alg.kl_cov.ratio > 0, "algorithm.kl_cov.ratio", "must be > 0"),
        (alg.kl_cov.coef >= 0, "algorithm.kl_cov.coef", "must be >= 0"),
        (alg.sapo.tau_pos > 0, "algorithm.sapo.tau_pos", "must be > 0"),
        (alg.sapo.tau_neg > 0, "algorithm.sapo.tau_neg", "must be > 0"),
        (alg.dppo_tv.clip_ratio_c > 0, "algorithm.dppo_tv.clip_ratio_c", "must be > 0"),
        (alg.dppo_kl.clip_ratio_c > 0, "algorithm.dppo_kl.clip_ratio_c", "must be > 0"),
        (alg.vespo.k_pos >= 0, "algorithm.vespo.k_pos", "must be >= 0"),
        (alg.vespo.k_neg >= 0, "algorithm.vespo.k_neg", "must be >= 0"),
        (alg.vespo.lambda_pos > 0, "algorithm.vespo.lambda_pos", "must be > 0"),
        (alg.vespo.lambda_neg > 0, "algorithm.vespo.lambda_neg", "must be > 0"),
        (0 <= alg.top_entropy_quantile <= 1, "algorithm.top_entropy_quantile", "must be in [0, 1] (1 = every token)"),
        (alg.top_entropy_quantile == 1 or alg.policy_loss != "geo_mean", "algorithm.top_entropy_quantile",
         "must be 1 with algorithm.policy_loss=geo_mean (GMPO takes the geometric mean of its token weights, which "
         "a token selection would turn into a near-zero weight for the whole response)"),
        (alg.nthr.beta == alg.nthr.beta and alg.nthr.beta != float("inf"), "algorithm.nthr.beta",
         "must be a number or -.inf"),
        (0 <= alg.nthr.eta <= 1, "algorithm.nthr.eta", "must lie in [0, 1]"),
        *[(get_dotted(alg, key) in known, f"algorithm.{key}", f"must name a registered one {known}")
          for key, known in names.items()],
        *rollout_correction_checks(alg),
    ]


def rollout_correction_checks(alg: AlgorithmConfig) -> list[Check]:
    """algorithm.rollout_correction.*: the preset's name, the bounds of the weights and of the rejection rule (its
    names are checked with the other registered ones)."""
    rc, key = alg.rollout_correction, "algorithm.rollout_correction."
    rule = rc.rejection if rc.rejection in registered_names()["rollout_correction.rejection"][1:] else None
    ratio_rule = rule is not None and takes_lower_bound(rule)  # a k1 rule: bounds a ratio, from both sides
    return [
        (rc.preset == "" or rc.preset in CORRECTION_PRESETS, key + "preset",
         f"must be '' or a preset {list(CORRECTION_PRESETS)}"),
        (rc.cap >= 1, key + "cap", "must be >= 1"),
        (rc.cap_lower is None or 0 < rc.cap_lower < rc.cap, key + "cap_lower",
         f"must be null or in (0, cap = {rc.cap})"),
        (rc.rejection == "off" or rc.rejection_upper is not None, key + "rejection_upper",
         f"must be set: rejection rule {rc.rejection!r} needs a threshold"),
        (rc.rejection_upper is None or rc.rejection_upper > 0, key + "rejection_upper", "must be > 0"),
        (rc.rejection_lower is None or 0 < rc.rejection_lower <= (rc.rejection_upper or math.inf),
         key + "rejection_lower", f"must be null or in (0, rejection_upper = {rc.rejection_upper}]"),
        (not ratio_rule or rc.rejection_lower is not None or (rc.rejection_upper or 0) >= 1, key + "rejection_upper",
         "must be >= 1 when rejection_lower is null (the lower ratio bound is then 1 / rejection_upper)"),
        (rule is None or ratio_rule or rc.rejection_lower is None, key + "rejection_lower",
         f"must be null: rejection rule {rc.rejection!r} bounds a divergence from above only (the *_k1 rules take a "
         "lower bound)"),
    ]


def sampling_checks(alg: AlgorithmConfig, rollout: RolloutConfig) -> list[Check]:
    """algorithm.dynamic_sampling.* and algorithm.overlong.* (its lengths resolved against rollout.*)."""
    max_length, cache_length = alg.overlong.lengths(rollout)
    return [
        (alg.dynamic_sampling.max_rounds >= 1, "algorithm.dynamic_sampling.max_rounds",
         "must be >= 1 (the first round included; there is no unlimited setting)"),
        (alg.overlong.max_length >= 0, "algorithm.overlong.max_length", "must be >= 0 (0 = the rollout's budget)"),
        (alg.overlong.cache_length >= 0, "algorithm.overlong.cache_length", "must be >= 0 (0 = L_max / 5)"),
        (cache_length <= max_length, "algorithm.overlong.cache_length", f"must be <= L_max ({max_length})"),
        (alg.overlong.penalty_factor >= 0, "algorithm.overlong.penalty_factor", "must be >= 0"),
    ]


def rollout_checks(rollout: RolloutConfig, data: DataConfig) -> list[Check]:
    """rollout.*: sampling, turns and lengths (the total against data.max_prompt_length); the engine's own section
    (rollout.vllm) is its kind's to check (rollout/backends/kinds.py: ``BackendKind.checks``)."""
    return [
        (rollout.n >= 2, "rollout.n", "must be >= 2: GRPO's advantage compares the responses to one prompt (one "
         "response is its own group mean: its advantage is 0, nothing is learned)"),
        (rollout.temperature >= 0, "rollout.temperature", "must be >= 0"),
        (0 < rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]"),
        (rollout.max_turns >= 1, "rollout.max_turns", "must be >= 1"),
        (rollout.max_tokens_per_turn >= 1, "rollout.max_tokens_per_turn", "must be >= 1"),
        (rollout.max_obs_length >= 1, "rollout.max_obs_length", "must be >= 1"),
        (rollout.max_total_length > data.max_prompt_length, "rollout.max_total_length",
         f"must exceed data.max_prompt_length ({data.max_prompt_length})"),
        (rollout.topk >= 1, "rollout.topk", "must be >= 1"),
        (rollout.generation_batch_size >= 1, "rollout.generation_batch_size", "must be >= 1"),
    ]


def data_checks(data: DataConfig) -> list[Check]:
    """data.*: the prompt length, the FlashRAG training mix."""
    return [
        (data.max_prompt_length >= 1, "data.max_prompt_length", "must be >= 1"),
        (data.train_mix in ("nq", "nq+hotpotqa"), "data.train_mix", "must be 'nq' or 'nq+hotpotqa'"),
        (data.prompt_template in TEMPLATES, "data.prompt_template", f"must name a prompt template {list(TEMPLATES)}"),
    ]


def retriever_checks(retriever: RetrieverConfig) -> list[Check]:
    """retriever.*: retries, timeouts, batch size, the service's URL."""
    return [
        (retriever.max_retries is None or retriever.max_retries >= 0, "retriever.max_retries",
         "must be null or >= 0"),
        (retriever.max_wait_s >= 0, "retriever.max_wait_s", "must be >= 0"),
        (retriever.first_contact_s >= 0, "retriever.first_contact_s", "must be >= 0"),
        (retriever.timeout_s > 0, "retriever.timeout_s", "must be > 0"),
        (retriever.batch_size >= 1, "retriever.batch_size", "must be >= 1"),
        (retriever.backoff_s >= 0, "retriever.backoff_s", "must be >= 0"),
        (retriever.mode in MODES, "retriever.mode", f"must name a registered mode {list(MODES)}"),
        *(retriever_mode(retriever).checks(retriever) if retriever.mode in MODES else []),
    ]


def trainer_checks(trainer: TrainerConfig, rollout: RolloutConfig) -> list[Check]:
    """trainer.*: batch shape (mini-batches count the responses, rollout.n per prompt), optimiser, checkpoints."""
    responses = trainer.train_batch_size * rollout.n
    return [
        (trainer.total_steps >= 1, "trainer.total_steps", "must be >= 1"),
        (trainer.train_batch_size >= 1, "trainer.train_batch_size", "must be >= 1"),
        (1 <= trainer.ppo_mini_batch_size <= responses, "trainer.ppo_mini_batch_size",
         f"counts responses: must be in [1, trainer.train_batch_size x rollout.n = {responses}]"),
        (responses % max(trainer.ppo_mini_batch_size, 1) == 0, "trainer.ppo_mini_batch_size",
         f"counts responses: must divide trainer.train_batch_size x rollout.n = "
         f"{trainer.train_batch_size} x {rollout.n} = {responses}"),
        (trainer.ppo_epochs >= 1, "trainer.ppo_epochs", "must be >= 1"),
        (trainer.lr > 0, "trainer.lr", "must be > 0"),
        (0 <= trainer.warmup_ratio < 1, "trainer.warmup_ratio", "must be in [0, 1)"),
        (trainer.grad_clip > 0, "trainer.grad_clip", "must be > 0"),
        (len(trainer.adam_betas) == 2 and all(0 <= b < 1 for b in trainer.adam_betas),
         "trainer.adam_betas", "must be two numbers in [0, 1)"),
        (trainer.micro_batch_token_budget >= 1, "trainer.micro_batch_token_budget", "must be >= 1"),
        (trainer.micro_batch_size >= 0, "trainer.micro_batch_size", "must be >= 0 (0 = cut by the token budget)"),
        (trainer.micro_batch_size == 0 or trainer.ppo_mini_batch_size % trainer.micro_batch_size == 0,
         "trainer.micro_batch_size", f"must divide trainer.ppo_mini_batch_size ({trainer.ppo_mini_batch_size})"),
        (trainer.keep_last_k >= 1, "trainer.keep_last_k", "must be >= 1"),
        (trainer.save_every >= 0, "trainer.save_every", "must be >= 0"),
        (not trainer.keep_best.startswith("eval/") or trainer.eval_every > 0, "trainer.keep_best",
         f"{trainer.keep_best} is logged only when trainer.eval_every > 0"),
        (trainer.logprob_chunk_size >= 0, "trainer.logprob_chunk_size", "must be >= 0 (0 = sized to the device)"),
        (all(1 <= t <= trainer.total_steps for t in trainer.full_eval_steps), "trainer.full_eval_steps",
         f"steps must lie in [1, trainer.total_steps = {trainer.total_steps}], got {trainer.full_eval_steps}"),
        (not trainer.full_eval_steps or trainer.val_subsample > 0, "trainer.full_eval_steps",
         "needs trainer.val_subsample > 0 (without a subsample the whole split is the curve: every "
         "trainer.eval_every steps)"),
        *step_size_checks(trainer.step_size),
    ]


def selection_checks(trainer: TrainerConfig, data: DataConfig) -> list[Check]:
    """trainer.keep_best against the splits: a checkpoint is chosen on the validation split (data.val_holdout or
    data.val_files), on a test split only with trainer.select_on_test; one validation split at most."""
    metric, holdout = trainer.keep_best, data.val_holdout
    on_validation = VALIDATION_METRIC.fullmatch(metric) is not None
    return [
        (holdout.size >= 0, "data.val_holdout.size", "must be >= 0 (0 = none)"),
        (not (holdout.size and data.val_files), "data.val_holdout.size",
         "one validation split: hold it out of the training rows (data.val_holdout.size) or name data.val_files, "
         "not both"),
        (not metric.startswith("eval/") or on_validation or trainer.select_on_test, "trainer.keep_best",
         f"{metric} is computed on a test split (eval.datasets or data.test_files), so the checkpoint it keeps "
         "would be chosen on test: read the validation split (trainer.keep_best=eval/val_em with "
         "data.val_holdout.size > 0 or data.val_files), or set trainer.select_on_test=true for the authors' "
         "practice (docs/configs.md)"),
        (not on_validation or holdout.size > 0 or bool(data.val_files), "trainer.keep_best",
         f"{metric} is logged only with a validation split: data.val_holdout.size > 0 or data.val_files"),
    ]


def staleness_checks(trainer: TrainerConfig, alg: AlgorithmConfig) -> list[Check]:
    """trainer.staleness and trainer.placement.*: a rollout beside the update needs a split placement, the decoupled
    objective (a rollout correction, not bypass), and one rollout per step (no dynamic-sampling rounds, no greedy
    baselines drawn in the step); a split placement needs a staleness to use it."""
    from searchr1_lld.algo.advantages import needs_baselines  # deferred: torch

    pl, async_on = trainer.placement, trainer.staleness > 0
    rc = alg.rollout_correction
    return [
        (trainer.staleness >= 0, "trainer.staleness", "must be >= 0 (0 = the synchronous step)"),
        (not async_on or pl.kind == "split", "trainer.placement.kind",
         f"must be split with trainer.staleness={trainer.staleness}: a colocated engine sleeps during the update and "
         "wakes for the next rollout (sleep / wake), so no rollout can run beside the update"),
        (async_on or pl.kind == "colocated", "trainer.staleness",
         "must be >= 1 with trainer.placement.kind=split (0 = the synchronous step, which runs colocated)"),
        (not async_on or not rc.bypass, "algorithm.rollout_correction.bypass",
         "must be false with trainer.staleness >= 1: the decoupled objective clips around the proximal policy (the "
         "learner's recompute before its update), bypass around the behaviour policy (the engine's)"),
        (not async_on or rc.mode != "off" or rc.rejection != "off", "algorithm.rollout_correction.mode",
         "must weight or reject with trainer.staleness >= 1: the decoupled objective weighs each token by "
         "pi_proximal / pi_behaviour (e.g. algorithm.rollout_correction.preset=decoupled_token_is, AReaL's capped "
         "behaviour weight)"),
        (not async_on or not alg.dynamic_sampling.enabled, "algorithm.dynamic_sampling.enabled",
         "must be false with trainer.staleness >= 1 (its further rounds would roll out inside the update's step)"),
        (not async_on or not needs_baselines(alg.advantage),
         "algorithm.advantage", "must not need greedy baselines with trainer.staleness >= 1 (they roll out inside "
         "the update's step)"),
        (pl.rollout_threads >= 0, "trainer.placement.rollout_threads", "must be >= 0 (0 = half of the threads)"),
        (pl.rollout_gpus >= 0, "trainer.placement.rollout_gpus", "must be >= 0"),
        (pl.max_restarts >= 0, "trainer.placement.max_restarts", "must be >= 0"),
    ]


def step_size_checks(sc: StepSizeConfig) -> list[Check]:
    """trainer.step_size.*: one target or one multiplier file at most, a controller that can move, bounds around the
    scheduled LR."""
    return [
        (sc.target_kl >= 0, "trainer.step_size.target_kl", "must be >= 0 (0 = none)"),
        (not (sc.target_kl > 0 and sc.target_file), "trainer.step_size.target_file",
         "give a constant target (trainer.step_size.target_kl) or a target file, not both"),
        (not (sc.multiplier_file and (sc.target_kl > 0 or sc.target_file)), "trainer.step_size.multiplier_file",
         "replays its multipliers open-loop: give it without a target (trainer.step_size.target_kl, target_file)"),
        (0 < sc.gain <= 2, "trainer.step_size.gain", "must be in (0, 2]"),
        (sc.max_change > 1, "trainer.step_size.max_change", "must be > 1 (a factor, either way)"),
        (0 < sc.min_multiplier <= 1, "trainer.step_size.min_multiplier", "must be in (0, 1]"),
        (sc.max_multiplier >= 1, "trainer.step_size.max_multiplier", "must be >= 1 (the controller starts at 1)"),
    ]


def eval_checks(ev: EvalConfig) -> list[Check]:
    """eval.*: limits, batch, turns, documents, and the dataset names."""
    return [
        (ev.limit >= 0, "eval.limit", "must be >= 0"),
        (ev.batch_size >= 1, "eval.batch_size", "must be >= 1"),
        (ev.max_turns >= 1, "eval.max_turns", "must be >= 1"),
        (ev.topk >= 1, "eval.topk", "must be >= 1"),
        (datasets_ok(ev.datasets), "eval.datasets",
         "must be benchmark names of the seven (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle), "
         "all, or NAME=PATH rows files, each name once"),
    ]


def datasets_ok(datasets: list[str]) -> bool:
    """Whether ``eval.datasets`` parses (:func:`searchr1_lld.data.specs.parse_datasets`); [] is fine (none)."""
    if not datasets:
        return True
    try:
        parse_datasets(datasets)
    except EvalError:
        return False
    return True
