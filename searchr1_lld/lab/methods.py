"""The lab's arms and their configs: methods differ ONLY in ``algorithm.llds.{enabled, gate, ma}``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import (Config, ConfigError, apply_overrides, config_from_dict, flatten_dict, read_yaml,
                                 resolve_repo_path)
from searchr1_lld.config import config_differences as differences
from searchr1_lld.world import trainer_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
FULL_CONFIG = REPO_ROOT / "configs" / "lab" / "lab.yaml"
QUICK_CONFIG = REPO_ROOT / "configs" / "lab" / "quick.yaml"
RUN_RECORD = "lab_run.json"
TREND_WINDOW = 3
LLD_MARGIN = 0.05  # nats/token: a likelihood drop smaller than this is not called LLD
REWARD_MARGIN = 0.02  # EM: a reward gain smaller than this is not called a rise


@dataclass(frozen=True)
class Method:
    """One arm of the comparison: a label and the ``algorithm.llds.*`` overrides that define it."""

    key: str
    label: str
    overrides: tuple[str, ...]


METHODS: dict[str, Method] = {
    m.key: m
    for m in (
        Method("grpo", "GRPO", ("algorithm.llds.enabled=false",)),
        Method("llds_response", "LLDS (response gate)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=response", "algorithm.llds.ma='off'")),
        Method("llds_action", "LLDS (action gate)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=action", "algorithm.llds.ma='off'")),
        Method("llds_ma", "LLDS-MA (action gate, adaptive MA)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=action", "algorithm.llds.ma=adaptive")),
    )
}
# Config keys a method may change; run bookkeeping keys that differ between runs by construction.
METHOD_KEYS = ("algorithm.llds.enabled", "algorithm.llds.gate", "algorithm.llds.ma")
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
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in METHODS]
    if not keys or unknown or len(set(keys)) != len(keys):
        raise ConfigError(f"--methods must be distinct names from {list(METHODS)}, got {text!r}")
    return [METHODS[k] for k in keys]


def run_name(method: Method, seed: int) -> str:
    return f"{method.key}-seed{seed}"


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
    """The full config of one run: lab config + user overrides + the method's LLDS switches + seed and bookkeeping."""
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
                              "the methods must share every setting except algorithm.llds.{enabled,gate,ma}")


def shared_settings(cfg: Config) -> list[tuple[str, Any]]:
    """The settings that shape the dynamics (shown in the report)."""
    keys = ["trainer.total_steps", "trainer.train_batch_size", "trainer.ppo_mini_batch_size", "trainer.ppo_epochs",
            "trainer.lr", "trainer.warmup_ratio", "trainer.grad_clip", "rollout.n", "rollout.temperature",
            "rollout.max_turns", "rollout.max_tokens_per_turn", "algorithm.kl_coef", "algorithm.entropy_coef",
            "algorithm.clip_eps", "algorithm.llds.lam", "algorithm.llds.tau", "algorithm.llds.lam_answer",
            "eval.max_turns", "eval.topk", "eval.limit"]
    flat = flatten_dict(cfg.to_dict())
    return [(k, flat[k]) for k in keys]
