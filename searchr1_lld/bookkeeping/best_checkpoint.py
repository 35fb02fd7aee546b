"""The best checkpoint of a run by one logged metric (``trainer.keep_best``), kept beside the last k and never pruned.

A collapse study needs the policy from before the collapse: the last ``trainer.keep_last_k`` checkpoints of a GRPO
run that collapsed are all post-collapse. With ``trainer.keep_best: eval/avg_em`` (mode ``max``) the trainer

    after logging step s:  value = metrics[keep_best]
                           best  = value if it is finite and beats the best so far (strictly: > for max, < for min)
    on a new best:         checkpoint step s is written (also when s is no save_every step), the record below is
                           replaced, then the earlier best is pruned unless it is among the last k.

The record ``RUN/best_checkpoint.json`` = ``{"metric", "mode", "value", "step", "path"}``; it is written only after
checkpoint s is complete, so it always names a complete checkpoint. A resumed run reads it back (the best value and
step survive the restart); a record of another metric or mode, or of a step after the resumed one (a checkpoint of a
branch that the resume abandoned), is not continued.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchr1_lld.bookkeeping.files import write_json_atomic

BEST_FILE = "best_checkpoint.json"
MODES = ("max", "min")


@dataclass
class BestCheckpoint:
    """The best value of ``metric`` seen so far and the step of its checkpoint (None before the first value)."""

    metric: str
    mode: str = "max"
    value: float | None = None
    step: int | None = None
    path: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"trainer.keep_best_mode must be one of {MODES}, got {self.mode!r}")

    def improves(self, value: Any) -> bool:
        """True when ``value`` (a logged metric: float, or None when not logged this step) is finite and strictly
        better than the best so far."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value > self.value if self.mode == "max" else value < self.value

    def record(self, step: int, value: float, path: str | Path) -> None:
        self.step, self.value, self.path = int(step), float(value), str(path)

    def kept_steps(self) -> set[int]:
        """The steps exempt from pruning: the best one, when there is one."""
        return set() if self.step is None else {self.step}


def write_best(run_dir: str | Path, best: BestCheckpoint) -> Path:
    """Replace ``RUN/best_checkpoint.json`` atomically; returns its path."""
    return write_json_atomic(Path(run_dir) / BEST_FILE, asdict(best), indent=1)


def load_best(run_dir: str | Path, metric: str, mode: str, resumed_step: int) -> tuple[BestCheckpoint, str]:
    """The record of a (resumed) run, or a fresh one; with a line saying why an existing record was not continued
    ('' otherwise)."""
    fresh = BestCheckpoint(metric, mode)
    path = Path(run_dir) / BEST_FILE
    if not path.is_file():
        return fresh, ""
    try:
        saved = json.loads(path.read_text())
        old = BestCheckpoint(saved["metric"], saved["mode"], saved["value"], saved["step"], saved.get("path", ""))
    except (ValueError, KeyError, TypeError) as e:
        return fresh, f"{path} is unreadable ({type(e).__name__}: {e}); the best checkpoint is tracked afresh"
    if (old.metric, old.mode) != (metric, mode):
        return fresh, (f"{path} tracks {old.mode} {old.metric}, this run {mode} {metric}: the best checkpoint is "
                       f"tracked afresh (checkpoint step {old.step} is no longer exempt from pruning)")
    if old.step is not None and old.step > resumed_step:
        return fresh, (f"{path} names step {old.step}, after the resumed step {resumed_step}: the best checkpoint "
                       "is tracked afresh")
    return old, ""
