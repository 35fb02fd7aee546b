"""One typed config per run: dataclasses (sections.py, every field with a help text), loaded from YAML with
``key=value`` dotted overrides (loading.py), checked (validation.py), documented (help.py: ``train.py --help-config``).

    cfg = load_config("configs/tiny.yaml", ["algorithm.llds.lam=0.1", "trainer.total_steps=20"])

The synthetic world has a config of its own (:class:`WorldConfig`, ``configs/world/*.yaml``, :func:`load_world_config`);
a run names its world by directory (``data.world_dir``) and the world file it is built from (``data.world_config``).
"""

from searchr1_lld.config.help import format_help, iter_fields
from searchr1_lld.config.loading import (REPO_ROOT, ConfigError, _coerce, apply_overrides, config_differences,
                                         config_from_dict, flatten_dict, get_dotted, load_config, load_world_config,
                                         parse_override, read_yaml, resolve_repo_path, save_config)
from searchr1_lld.config.sections import (AlgorithmConfig, Config, DataConfig, EvalConfig, LLDSConfig, LoggingConfig,
                                          ModelConfig, RetrieverConfig, RolloutConfig, RolloutCorrectionConfig,
                                          TrainerConfig, WorldConfig)
from searchr1_lld.config.validation import EVAL_DATASETS, validate, validate_world

__all__ = [
    "REPO_ROOT", "ConfigError", "_coerce", "apply_overrides", "config_differences", "config_from_dict", "flatten_dict",
    "get_dotted", "load_config", "load_world_config", "parse_override", "read_yaml", "resolve_repo_path",
    "save_config", "format_help", "iter_fields", "AlgorithmConfig", "Config", "DataConfig", "EvalConfig",
    "LLDSConfig", "LoggingConfig", "ModelConfig", "RetrieverConfig", "RolloutConfig", "RolloutCorrectionConfig",
    "TrainerConfig", "WorldConfig", "EVAL_DATASETS", "validate", "validate_world",
]
