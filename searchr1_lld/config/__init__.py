"""One typed config per run: dataclasses (sections.py, every field with a help text; root.py puts them together),
loaded from YAML with ``key=value`` dotted overrides (loading.py), checked section by section (validation.py),
documented (help.py: ``train.py --help-config``).

    cfg = load_config("configs/tiny.yaml", ["algorithm.llds.lam=0.1", "trainer.total_steps=20"])

A run names its policy (``model.path``), its data (``data.train_files`` / ``data.test_files`` or FlashRAG) and its
retriever (``retriever.*``); it knows nothing of how they were made (the synthetic world is built by its own command,
:mod:`searchr1_lld.world`).
"""

from searchr1_lld.config.help import format_help, iter_fields
from searchr1_lld.config.loading import (REPO_ROOT, _coerce, apply_overrides, config_differences,
                                         config_from_dict, flatten_dict, load_config,
                                         parse_override, read_yaml, resolve_repo_path, save_config)
from searchr1_lld.config.root import Config, validate
from searchr1_lld.config.sections import (AlgorithmConfig, DataConfig, EvalConfig, LLDSConfig, LoggingConfig,
                                          ModelConfig, RetrieverConfig, RolloutConfig, RolloutCorrectionConfig,
                                          StepSizeConfig, TrainerConfig, VLLMConfig)
from searchr1_lld.config.validation import ConfigError, get_dotted

__all__ = [
    "REPO_ROOT", "ConfigError", "_coerce", "apply_overrides", "config_differences", "config_from_dict", "flatten_dict",
    "get_dotted", "load_config", "parse_override", "read_yaml", "resolve_repo_path",
    "save_config", "format_help", "iter_fields", "AlgorithmConfig", "Config", "DataConfig", "EvalConfig",
    "LLDSConfig", "LoggingConfig", "ModelConfig", "RetrieverConfig", "RolloutConfig", "RolloutCorrectionConfig",
    "StepSizeConfig", "TrainerConfig", "VLLMConfig", "validate",
]
