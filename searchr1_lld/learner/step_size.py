"""The trust-region step size of a run (trainer.step_size): a controller that scales each rollout step's learning
rate so that the policy's measured step size, ``lld/step_kl``, tracks a target, a constant or one value per step read
from a file (e.g. another arm's mean curve, ``python -m searchr1_lab step-kl-target``).

    controller = StepSizeController.of(cfg.trainer.step_size, cfg.trainer.total_steps)
    lr(update u) = base lr x lr_factor(u) (warm-up, schedule) x controller.multiplier     (learner/optim.py)
    after step s: controller.observe(s, measured lld/step_kl)  -> the multiplier of step s + 1 (algo/step_size.py)

The multiplier starts at 1 and is the controller's whole state; it travels in every checkpoint, so a resumed run
continues with the rates the uninterrupted run would have used. Logged per step: ``step_size/target_kl`` (the step's
target) and ``step_size/lr_multiplier`` (the multiplier in force during the step); the step's ``actor/lr`` and
``lld/step_kl`` show the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from searchr1_lld.algo.step_size import trust_region_multiplier
from searchr1_lld.config import ConfigError, StepSizeConfig, resolve_repo_path


def read_target_file(path: str | Path, total_steps: int) -> list[float]:
    """The per-step targets of a target file (``{"step_kl": [t_1, t_2, ...]}``, ``t_s`` the target of step ``s``):
    ConfigError when the file is missing, holds fewer than ``total_steps`` values, or a value is not a positive
    number."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trainer.step_size.target_file: no file at {path}")
    try:
        values = json.loads(path.read_text())["step_kl"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"trainer.step_size.target_file: {path} is not a JSON object with a 'step_kl' list ({e})")
    if not isinstance(values, list) or len(values) < total_steps:
        raise ConfigError(f"trainer.step_size.target_file: {path} holds {len(values) if isinstance(values, list) else 0} "
                          f"targets, the run has {total_steps} steps")
    bad = [i + 1 for i, v in enumerate(values) if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0]
    if bad:
        raise ConfigError(f"trainer.step_size.target_file: {path}: the targets of steps {bad[:5]} are not positive")
    return [float(v) for v in values]


class StepSizeController:
    """The learning-rate multiplier of a run and the rule that updates it after each step. Disabled (no target): the
    multiplier stays 1 and :meth:`observe` logs nothing."""

    def __init__(self, settings: StepSizeConfig, targets: list[float] | None):
        self.settings = settings
        self.targets = targets  # t_s of step s at index s - 1; None: off
        self.multiplier = 1.0  # the multiplier of the next step's learning rate

    @classmethod
    def of(cls, settings: StepSizeConfig, total_steps: int) -> StepSizeController:
        """The controller of ``settings`` for a run of ``total_steps`` steps (its target file read and checked)."""
        if settings.target_file:
            return cls(settings, read_target_file(resolve_repo_path(settings.target_file), total_steps))
        if settings.target_kl > 0:
            return cls(settings, [settings.target_kl] * total_steps)
        return cls(settings, None)

    @property
    def enabled(self) -> bool:
        return self.targets is not None

    def target(self, step: int) -> float:
        """The target of step ``step`` (1-based, as the step's metrics are logged)."""
        return self.targets[step - 1] if self.targets is not None else float("nan")

    def observe(self, step: int, step_kl: float) -> dict[str, float]:
        """Step ``step`` (1-based) measured ``step_kl``: the multiplier moves toward its target (the next step's);
        returns the step's metrics (target and the multiplier that was in force), {} when disabled."""
        if not self.enabled:
            return {}
        used, target = self.multiplier, self.target(step)
        s = self.settings
        self.multiplier = trust_region_multiplier(used, step_kl, target, gain=s.gain, max_change=s.max_change,
                                                  lo=s.min_multiplier, hi=s.max_multiplier)
        return {"step_size/target_kl": target, "step_size/lr_multiplier": used}

    def state_dict(self) -> dict[str, Any]:
        return {"multiplier": self.multiplier}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.multiplier = float(state["multiplier"])
