"""The demo's settings chosen on the validation split: the warm start's validation result (step 0, in
``<select dir>/step0.json``), one selection run per learning rate (its validation curve in
``<select dir>/lr<lr>.json``), and the (learning rate, step) with the highest validation EM over them, step 0 (no
training) included.

The demo trains and reports (:mod:`searchr1_lab.demo`); the lab's grid schedules its selection runs
(:func:`searchr1_lab.grid.demo_tasks`) and knows them done by these files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SELECT_STEPS = 30  # steps of each selection run (the demo's --select-steps)
SELECT_EVAL_EVERY = 5  # validation EM every N steps of a selection run (the demo's --select-eval-every)
# what a selection run changes in the demo's config: a constant rate without warm-up, so that any prefix of it is a
# run of that many steps
SELECT_OVERRIDES = ("trainer.lr_schedule=constant", "trainer.warmup_ratio=0.0")
WARM_START_FILE = "step0.json"  # the warm start's greedy validation result: step 0 of every selection run


def selection_file(select_dir: str | Path, lr: float) -> Path:
    """The result file of the selection run at ``lr``."""
    return Path(select_dir) / f"lr{lr:g}.json"


def warm_start_file(select_dir: str | Path) -> Path:
    """The warm start's validation result (``{"val_em", "correct": {id: 0/1}, "world_hash"}``)."""
    return Path(select_dir) / WARM_START_FILE


def read_warm_start(select_dir: str | Path) -> dict[str, Any] | None:
    """The warm start's validation result in ``select_dir``; None when it has not been measured."""
    path = warm_start_file(select_dir)
    return json.loads(path.read_text()) if path.is_file() else None


def choose(select_dir: str | Path) -> dict | None:
    """The (learning rate, step) with the highest validation EM over the warm start (step 0, learning rate None) and
    the selection runs in ``select_dir`` (ties: fewer steps, so the warm start wins a tie; then the lower rate), with
    every candidate; None when there is no selection run. ValueError when the warm start's validation EM is missing
    or was measured on another world than the runs."""
    files = sorted(Path(select_dir).glob("lr*.json"))
    if not files:
        return None
    runs = [json.loads(p.read_text()) for p in files]
    warm = read_warm_start(select_dir)
    if warm is None:
        raise ValueError(f"{warm_start_file(select_dir)} is missing: the warm start (step 0) is a candidate of the "
                         "selection; a selection run (--select-lr) measures it")
    hashes = {r.get("world_hash") for r in runs} | {warm.get("world_hash")}
    if len(hashes) > 1:
        raise ValueError(f"the selection results in {select_dir} come from different worlds ({sorted(map(str, hashes))})"
                         "; rerun the selection on one world")
    cands = [{"lr": None, "steps": 0, "val_em": warm["val_em"]}]
    cands += [{"lr": r["lr"], "steps": int(step), "val_em": em} for r in runs for step, em in r["val_curve"]]
    best = max(cands, key=lambda c: (c["val_em"], -c["steps"], -(c["lr"] or 0.0)))
    rates = ", ".join(format(r["lr"], "g") for r in runs)
    return {**best, "seed": runs[0]["seed"], "world_hash": warm.get("world_hash"), "procedure": (
        f"the warm start (step 0) and one run per learning rate ({rates}), {runs[0]['steps']} steps at a "
        f"constant rate, greedy validation EM every {runs[0]['eval_every']} steps; the best (rate, step), fewer "
        "steps on a tie"), "candidates": cands}


def selection_overrides(chosen: dict) -> list[str]:
    """The demo's config overrides that train the chosen (learning rate, step count); none for step 0."""
    if chosen["steps"] == 0:
        return []
    return [*SELECT_OVERRIDES, f"trainer.lr={chosen['lr']}", f"trainer.total_steps={chosen['steps']}"]
