"""A run's config: its sections together (:class:`Config`), checked section by section (:func:`validate`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from searchr1_lld.config import validation
from searchr1_lld.config.sections import (AlgorithmConfig, DataConfig, EvalConfig, LoggingConfig, ModelConfig,
                                          RetrieverConfig, RolloutConfig, TrainerConfig, opt, section)


@dataclass
class Config:
    """A run's config (python train.py --config FILE key=value ...)."""

    name: str = opt("default", "config name (prefix of the default run name)")
    data: DataConfig = section(DataConfig, "training and held-out data")
    model: ModelConfig = section(ModelConfig, "the policy")
    rollout: RolloutConfig = section(RolloutConfig, "the agent loop and its generation engine")
    retriever: RetrieverConfig = section(RetrieverConfig, "the search engine")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "GRPO + LLDS")
    trainer: TrainerConfig = section(TrainerConfig, "the learner")
    logging: LoggingConfig = section(LoggingConfig, "metrics and plots")
    eval: EvalConfig = section(EvalConfig, "evaluation")

    def validate(self) -> Config:
        """Reject impossible values; each message names the key. Returns self."""
        validate(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def validate(cfg: Config) -> None:
    """Reject impossible values of a run config: :class:`~searchr1_lld.config.validation.ConfigError` naming the key
    of the first failing check, section by section (each section's checks: :mod:`searchr1_lld.config.validation`)."""
    validation.raise_first([
        *validation.algorithm_checks(cfg.algorithm),
        *validation.sampling_checks(cfg.algorithm, cfg.rollout),
        *validation.rollout_checks(cfg.rollout, cfg.data),
        *validation.data_checks(cfg.data),
        *validation.retriever_checks(cfg.retriever),
        *validation.trainer_checks(cfg.trainer, cfg.rollout),
        *validation.selection_checks(cfg.trainer, cfg.data),
        *validation.staleness_checks(cfg.trainer, cfg.algorithm),
        *validation.eval_checks(cfg.eval),
    ], cfg)
