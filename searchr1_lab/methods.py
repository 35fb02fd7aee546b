"""The lab's arms and their configs: an arm is a method preset (``algorithm.method``, config/methods.py); methods
differ ONLY in the settings the presets pin."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import (Config, ConfigError, apply_overrides, config_from_dict, flatten_dict, read_yaml,
                                 resolve_repo_path)
from searchr1_lld.config import config_differences as differences
from searchr1_lld.config.methods import METHODS as PRESETS
from searchr1_lld.config.methods import PINNED_KEYS
from searchr1_lld.world import trainer_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_CONFIG = REPO_ROOT / "configs" / "lab" / "lab.yaml"
QUICK_CONFIG = REPO_ROOT / "configs" / "lab" / "quick.yaml"
RUN_RECORD = "lab_run.json"
TREND_WINDOW = 3
LLD_MARGIN = 0.05  # nats/token: a likelihood drop smaller than this is not called LLD
REWARD_MARGIN = 0.02  # EM: a reward gain smaller than this is not called a rise


@dataclass(frozen=True)
class Method:
    """One arm of the comparison: a method preset's name (config/methods.py), a label, and its override."""

    key: str
    label: str
    overrides: tuple[str, ...]


LABELS = {"grpo": "GRPO", "llds": "LLDS", "llds_response": "LLDS (response gate)", "llds_action": "LLDS (action gate)",
          "llds_ma": "LLDS-MA (action gate, adaptive MA)", "nll_anchor": "likelihood anchor",
          "dapo_clip_higher": "DAPO clip-higher", "dr_grpo": "Dr. GRPO", "gspo": "GSPO", "clip_cov": "Clip-Cov",
          "kl_cov": "KL-Cov", "rloo": "RLOO", "reinforce_pp_baseline": "REINFORCE++ (group baseline)"}
# every arm the lab can run, by the preset names of algorithm.method (--methods takes any of them); a run's config
# is the lab config + algorithm.method=<key>
ARMS: dict[str, Method] = {key: Method(key, LABELS.get(key, key), (f"algorithm.method={key}",)) for key in PRESETS}
# the lab's LLDS comparison (the default --methods)
METHODS: dict[str, Method] = {key: ARMS[key] for key in ("grpo", "llds_response", "llds_action", "llds_ma")}
# Config keys a method may change (algorithm.method and every key a preset pins); run bookkeeping keys that differ
# between runs by construction.
METHOD_KEYS = ("algorithm.method", *(f"algorithm.{k}" for k in PINNED_KEYS))
RUN_KEYS = ("trainer.seed", "trainer.run_name", "trainer.output_dir")
RUN_PLAN = "lab_plan.json"  # the config a run directory is being trained with (resume only into the same config)


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]`` (distinct non-negative integers)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds must list distinct non-negative integers, got {text!r}")
    return seeds


def parse_methods(text: str) -> list[Method]:
    """``"grpo,gspo"`` -> their arms: distinct method preset names (config/methods.py)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ARMS]
    if not keys or unknown or len(set(keys)) != len(keys):
        raise ConfigError(f"--methods must be distinct names from {list(ARMS)}, got {text!r}")
    return [ARMS[k] for k in keys]


def run_name(method: Method | str, seed: int) -> str:
    """``<arm>-seed<seed>``: a run's name (its directory), from its arm or the arm's key."""
    return f"{method if isinstance(method, str) else method.key}-seed{seed}"


def read_lab_config(config_path: str | Path, overrides: Sequence[str]) -> tuple[dict[str, Any], str, list[str]]:
    """A lab config is a run config plus ``world: FILE`` (the synthetic world's config, configs/world/*.yaml, which
    the lab builds and trains on). Returns (the run settings, the world config file, the overrides that are not
    ``world=FILE``)."""
    values = read_yaml(resolve_repo_path(config_path))
    world = str(values.pop("world", "") or "")
    rest = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "world":
            world = value.strip()
        else:
            rest.append(item)
    return values, world, rest


def lab_config(config_path: str | Path, overrides: Sequence[str], world_dir: str | Path) -> Config:
    """The lab config's run settings on the world in ``world_dir`` (its policy, index and splits: the world's
    ``trainer_overrides``) with ``overrides`` on top."""
    values, _, rest = read_lab_config(config_path, overrides)
    return config_from_dict(apply_overrides(values, [*trainer_overrides(world_dir), *rest]))


def method_config(config_path: str | Path, overrides: Sequence[str], method: Method, seed: int, *,
                  world_dir: str | Path, runs_dir: str | Path) -> Config:
    """The full config of one run: lab config + user overrides + the method's preset + seed and bookkeeping."""
    return lab_config(config_path, [
        *overrides, *method.overrides, f"trainer.seed={seed}",
        f"trainer.output_dir={runs_dir}", f"trainer.run_name={run_name(method, seed)}",
        # resumable: an interrupted run continues from its last checkpoint (trainer.save_every of the lab config);
        # the trained policy is evaluated in memory (and every trainer.eval_every steps, when the config sets it)
        "trainer.resume=auto", "logging.wandb=false",
    ], world_dir)


def config_differences(a: Config, b: Config) -> list[str]:
    """Dotted keys whose values differ between two configs."""
    return sorted(differences(a, b))


def check_only_llds_differs(configs: Sequence[Config]) -> None:
    """Raise ConfigError if two runs differ in anything but the method switches and the run bookkeeping."""
    allowed = set(METHOD_KEYS) | set(RUN_KEYS)
    for cfg in configs[1:]:
        extra = [k for k in config_differences(configs[0], cfg) if k not in allowed]
        if extra:
            raise ConfigError(f"runs {configs[0].trainer.run_name} and {cfg.trainer.run_name} differ in {extra}: "
                              f"the methods must share every setting except {list(METHOD_KEYS)}")


def shared_settings(cfg: Config) -> list[tuple[str, Any]]:
    """The settings that shape the dynamics (shown in the report)."""
    keys = ["trainer.total_steps", "trainer.train_batch_size", "trainer.ppo_mini_batch_size", "trainer.ppo_epochs",
            "trainer.lr", "trainer.warmup_ratio", "trainer.grad_clip", "rollout.n", "rollout.temperature",
            "rollout.max_turns", "rollout.max_tokens_per_turn", "algorithm.kl_coef", "algorithm.entropy_coef",
            "algorithm.clip_eps", "algorithm.llds.lam", "algorithm.llds.tau", "algorithm.llds.lam_answer",
            "eval.max_turns", "eval.topk", "eval.limit"]
    flat = flatten_dict(cfg.to_dict())
    return [(k, flat[k]) for k in keys]
