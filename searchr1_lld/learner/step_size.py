"""The step size of a run (trainer.step_size): a learning-rate multiplier per rollout step, either fed back (the
trust-region controller scales each step's rate so that the policy's measured step size, ``lld/step_kl``, tracks a
target, a constant or one value per step read from a file, e.g. another arm's mean curve, ``python -m searchr1_lab
step-kl-target``) or replayed open-loop (one multiplier per step read from a file, e.g. a trust-region arm's mean
multiplier curve, ``python -m searchr1_lab lr-curve``: the same rates without the feedback).

    controller = StepSizeController.of(cfg.trainer.step_size, cfg.trainer.total_steps)
    lr(update u) = base lr x lr_factor(u) (warm-up, schedule) x controller.multiplier     (learner/optim.py)
    after step s: controller.observe(s, measured lld/step_kl)  -> the multiplier of step s + 1
        fed back: the trust-region rule (algo/step_size.py);  replayed: m_{s+1} of the file, the measurement unused

The multiplier of the next step is the controller's whole state; it travels in every checkpoint, so a resumed run
continues with the rates the uninterrupted run would have used. Logged per step: ``step_size/lr_multiplier`` (the
multiplier in force during the step) and, fed back, ``step_size/target_kl`` (the step's target); the step's
``actor/lr`` and ``lld/step_kl`` show the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from searchr1_lld.algo.step_size import trust_region_multiplier
from searchr1_lld.config import ConfigError, StepSizeConfig, resolve_repo_path


# the per-step curve files of trainer.step_size: the setting that names one -> the key of its list of values
CURVE_KEYS = {"target_file": "step_kl", "multiplier_file": "lr_multiplier"}


def read_curve_file(path: str | Path, setting: str, total_steps: int) -> list[float]:
    """The per-step values of the curve file of ``trainer.step_size.<setting>`` (a JSON object whose
    :data:`CURVE_KEYS` list holds ``v_s``, the value of step ``s``, at index ``s - 1``; other keys, e.g. where the
    curve came from, are not read): ConfigError when the file is missing, holds fewer than ``total_steps`` values,
    or a value is not a finite positive number."""
    path, key, name = Path(path), CURVE_KEYS[setting], f"trainer.step_size.{setting}"
    if not path.is_file():
        raise ConfigError(f"{name}: no file at {path}")
    try:
        values = json.loads(path.read_text())[key]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{name}: {path} is not a JSON object with a '{key}' list ({e})")
    if not isinstance(values, list) or len(values) < total_steps:
        raise ConfigError(f"{name}: {path} holds {len(values) if isinstance(values, list) else 0} values, the run "
                          f"has {total_steps} steps")
    bad = [i + 1 for i, v in enumerate(values) if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0]
    if bad:
        raise ConfigError(f"{name}: {path}: the values of steps {bad[:5]} are not finite positive numbers")
    return [float(v) for v in values]


class StepSizeController:
    """The learning-rate multiplier of a run and how it moves from one step to the next: toward each step's target
    (``targets``: the trust-region rule), along a given curve (``replayed``: open-loop), or not at all (neither: the
    multiplier stays 1 and :meth:`observe` logs nothing)."""

    def __init__(self, settings: StepSizeConfig, targets: list[float] | None = None,
                 replayed: list[float] | None = None):
        self.settings = settings
        self.targets = targets  # t_s of step s at index s - 1; None: no feedback
        self.replayed = replayed  # m_s of step s at index s - 1; None: no replay
        self.multiplier = replayed[0] if replayed else 1.0  # the multiplier of the next step's learning rate

    @classmethod
    def of(cls, settings: StepSizeConfig, total_steps: int) -> StepSizeController:
        """The controller of ``settings`` for a run of ``total_steps`` steps (its target or multiplier file read and
        checked)."""
        if settings.multiplier_file:
            return cls(settings, replayed=read_curve_file(resolve_repo_path(settings.multiplier_file),
                                                          "multiplier_file", total_steps))
        if settings.target_file:
            return cls(settings, read_curve_file(resolve_repo_path(settings.target_file), "target_file", total_steps))
        if settings.target_kl > 0:
            return cls(settings, [settings.target_kl] * total_steps)
        return cls(settings)

    def target(self, step: int) -> float:
        """The target of step ``step`` (1-based, as the step's metrics are logged); NaN without feedback."""
        return self.targets[step - 1] if self.targets is not None else float("nan")

    def observe(self, step: int, step_kl: float) -> dict[str, float]:
        """Step ``step`` (1-based) measured ``step_kl``: the multiplier becomes the next step's (fed back: moved
        toward the step's target; replayed: ``m_{step + 1}``, the last value of the curve after its end, the
        measurement unused); returns the step's metrics (the multiplier that was in force and, fed back, the
        target), {} when off."""
        used = self.multiplier
        if self.replayed is not None:
            self.multiplier = self.replayed[min(step, len(self.replayed) - 1)]
            return {"step_size/lr_multiplier": used}
        if self.targets is None:
            return {}
        target, s = self.target(step), self.settings
        self.multiplier = trust_region_multiplier(used, step_kl, target, gain=s.gain, max_change=s.max_change,
                                                  lo=s.min_multiplier, hi=s.max_multiplier)
        return {"step_size/target_kl": target, "step_size/lr_multiplier": used}

    def state_dict(self) -> dict[str, Any]:
        return {"multiplier": self.multiplier}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.multiplier = float(state["multiplier"])
