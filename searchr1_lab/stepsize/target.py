"""Per-step curves from finished runs, as the files ``trainer.step_size`` reads (learner/step_size.py): one arm's mean
``lld/step_kl`` at every step, the per-step target of the trust-region step size (``target_file``), and one arm's mean
``step_size/lr_multiplier``, the multipliers an open-loop replay of its learning rates runs with
(``multiplier_file``: the same rates without the feedback).

    python -m searchr1_lab step-kl-target --runs docs/lab/stepsize/runs --arm llds_action --lr 0.002 \\
        --steps 75 --out configs/lab/targets/llds_action-lr0.002.json
    python -m searchr1_lab lr-curve --runs docs/lab/trustregion/runs --arm grpo_trust_region --lr 0.002 \\
        --steps 75 --out configs/lab/lr_curves/grpo_trust_region-lr0.002.json

A file: ``{<key>: [v_1, ..., v_N], "source": {"runs_dir", "arm", "lr", "seeds"}, "runs_per_step": [...]}``, ``v_s``
the mean over the arm's runs of what they logged at step ``s`` (``step_kl``: their ``lld/step_kl``;
``lr_multiplier``: their ``step_size/lr_multiplier``, the multiplier in force during the step). A run counts at the steps where it logged a finite value: one that stopped before step
``s`` is not in the mean of ``s`` (``runs_per_step`` says how many are), one that collapsed but went on logging is.
A step that no run logged is an error: the value would be a guess.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import ConfigError
from searchr1_lld.learner.step_size import CURVE_KEYS
from searchr1_lab.compact import read_runs
from searchr1_lab.stepsize.analysis import Run, cell_runs, values_by_step

STEP_KL = "lld/step_kl"


@dataclass(frozen=True)
class Curve:
    """A per-step curve file that a command makes from an arm's runs."""

    setting: str  # the trainer.step_size setting that reads the file (its list's key: CURVE_KEYS)
    logged: str  # the metric of the runs whose per-step mean the file holds
    description: str  # the command's help


# command -> the curve it writes
CURVES = {
    "step-kl-target": Curve("target_file", STEP_KL, "one arm's mean per-step KL curve, as a trust-region target file"),
    "lr-curve": Curve("multiplier_file", "step_size/lr_multiplier",
                      "one arm's mean learning-rate multiplier per step, as the multiplier file of an open-loop "
                      "replay of its rates"),
}


def mean_curve(runs: Sequence[Run], steps: int, key: str = STEP_KL) -> tuple[list[float], list[int]]:
    """``(mean, count)``: per step ``s = 1..steps`` the mean of ``key`` over the runs that logged a finite value at
    ``s``, and how many did. ValueError naming the steps no run logged."""
    by_step = values_by_step(runs, key, 1, steps)
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        raise ValueError(f"no run logged {key} at steps {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    values = [by_step[s] for s in range(1, steps + 1)]
    return [sum(v) / len(v) for v in values], [len(v) for v in values]


def curve_file(runs_dir: str | Path, arm: str, lr: float, steps: int, curve: Curve) -> dict[str, Any]:
    """The contents of ``curve``'s file: the mean per-step curve of ``curve.logged`` of ``arm`` at ``lr`` over its
    runs in ``runs_dir``."""
    runs, _ = read_runs(runs_dir)
    mine = cell_runs(runs, arm, lr)
    if not mine:
        raise ConfigError(f"{runs_dir} holds no run of {arm} at lr {lr:g}")
    means, counts = mean_curve(mine, steps, curve.logged)
    return {CURVE_KEYS[curve.setting]: [round(m, 6) for m in means], "runs_per_step": counts,
            "source": {"runs_dir": str(runs_dir), "arm": arm, "lr": lr, "seeds": [r["seed"] for r in mine]}}


def main(command: str, argv: list[str]) -> int:
    """``python -m searchr1_lab <command>`` for a command of :data:`CURVES`."""
    curve = CURVES[command]
    p = argparse.ArgumentParser(prog=f"python -m searchr1_lab {command}", description=curve.description)
    p.add_argument("--runs", required=True, help="a dir of compact run files (e.g. docs/lab/stepsize/runs)")
    p.add_argument("--arm", required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--steps", type=int, required=True, help="steps the curve must cover")
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    try:
        content = curve_file(args.runs, args.arm, args.lr, args.steps, curve)
    except (ConfigError, ValueError) as e:
        print(f"lab: error: {e}")
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(content, indent=1) + "\n")
    values = content[CURVE_KEYS[curve.setting]]
    print(f"{out}: {args.steps} steps, mean {sum(values) / args.steps:.4f}, from {len(content['source']['seeds'])} "
          f"runs (seeds {content['source']['seeds']}), {min(content['runs_per_step'])} at the step with fewest")
    return 0
