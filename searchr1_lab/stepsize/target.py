"""A step-size target from finished runs: one arm's mean ``lld/step_kl`` at every step, the per-step target of the
trust-region step size (``trainer.step_size.target_file``, learner/step_size.py).

    python -m searchr1_lab step-kl-target --runs docs/lab/stepsize/runs --arm llds_action --lr 0.002 \\
        --steps 75 --out configs/lab/targets/llds_action-lr0.002.json

The file: ``{"step_kl": [t_1, ..., t_N], "source": {"runs_dir", "arm", "lr", "seeds"}, "runs_per_step": [...]}``,
``t_s`` the mean over the arm's runs of their ``lld/step_kl`` at step ``s``. A step that no run logged is an error:
the target would be a guess.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import ConfigError
from searchr1_lab.compact import read_runs
from searchr1_lab.stepsize.analysis import Run, cell_runs, values_by_step

STEP_KL = "lld/step_kl"


def mean_curve(runs: Sequence[Run], steps: int, key: str = STEP_KL) -> tuple[list[float], list[int]]:
    """``(mean, count)``: per step ``s = 1..steps`` the mean of ``key`` over the runs that logged a finite value at
    ``s``, and how many did. ValueError naming the steps no run logged."""
    by_step = values_by_step(runs, key, 1, steps)
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing:
        raise ValueError(f"no run logged {key} at steps {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    values = [by_step[s] for s in range(1, steps + 1)]
    return [sum(v) / len(v) for v in values], [len(v) for v in values]


def target_file(runs_dir: str | Path, arm: str, lr: float, steps: int) -> dict[str, Any]:
    """The target file's contents: the mean step-KL curve of ``arm`` at ``lr`` over its runs in ``runs_dir``."""
    runs, _ = read_runs(runs_dir)
    mine = cell_runs(runs, arm, lr)
    if not mine:
        raise ConfigError(f"{runs_dir} holds no run of {arm} at lr {lr:g}")
    means, counts = mean_curve(mine, steps)
    return {"step_kl": [round(m, 6) for m in means], "runs_per_step": counts,
            "source": {"runs_dir": str(runs_dir), "arm": arm, "lr": lr, "seeds": [r["seed"] for r in mine]}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lab step-kl-target",
                                description="one arm's mean per-step KL curve, as a trust-region target file")
    p.add_argument("--runs", required=True, help="a dir of compact run files (e.g. docs/lab/stepsize/runs)")
    p.add_argument("--arm", required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--steps", type=int, required=True, help="steps the target must cover")
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    try:
        content = target_file(args.runs, args.arm, args.lr, args.steps)
    except (ConfigError, ValueError) as e:
        print(f"lab: error: {e}")
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(content, indent=1) + "\n")
    print(f"{out}: {args.steps} steps, mean {sum(content['step_kl']) / args.steps:.4f}, "
          f"from {len(content['source']['seeds'])} runs")
    return 0
