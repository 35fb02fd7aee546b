"""The demo's settings chosen on the validation split: one selection run per learning rate (its validation curve in
``<select dir>/lr<lr>.json``), and the (learning rate, step) with the highest validation EM over them.

The demo trains and reports (:mod:`searchr1_lld.demo`); the lab's grid schedules its selection runs
(:func:`searchr1_lld.lab.grid.demo_tasks`) and knows them done by these files.
"""

from __future__ import annotations

import json
from pathlib import Path

SELECT_STEPS = 40  # steps of each selection run
SELECT_EVAL_EVERY = 5  # validation EM every N steps of a selection run
# what a selection run changes in the demo's config: a constant rate without warm-up, so that any prefix of it is a
# run of that many steps
SELECT_OVERRIDES = ("trainer.lr_schedule=constant", "trainer.warmup_ratio=0.0")


def selection_file(select_dir: str | Path, lr: float) -> Path:
    """The result file of the selection run at ``lr``."""
    return Path(select_dir) / f"lr{lr:g}.json"


def choose(select_dir: str | Path) -> dict | None:
    """The (learning rate, step) with the highest validation EM over the selection runs in ``select_dir`` (ties:
    fewer steps, then the lower rate), with every candidate; None when there is no selection run."""
    files = sorted(Path(select_dir).glob("lr*.json"))
    if not files:
        return None
    runs = [json.loads(p.read_text()) for p in files]
    cands = [{"lr": r["lr"], "steps": int(step), "val_em": em} for r in runs for step, em in r["val_curve"]]
    best = max(cands, key=lambda c: (c["val_em"], -c["steps"], -c["lr"]))
    rates = ", ".join(format(r["lr"], "g") for r in runs)
    return {**best, "seed": runs[0]["seed"], "procedure": (
        f"one run per learning rate ({rates}), {runs[0]['steps']} steps at a "
        f"constant rate, greedy validation EM every {runs[0]['eval_every']} steps; the best (rate, step)"),
        "candidates": cands}


def selection_overrides(chosen: dict) -> list[str]:
    """The demo's config overrides that train the chosen (learning rate, step count)."""
    return [*SELECT_OVERRIDES, f"trainer.lr={chosen['lr']}", f"trainer.total_steps={chosen['steps']}"]
