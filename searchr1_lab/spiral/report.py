"""The death-spiral calibration's report: which parts of the signature (:mod:`.signature`) each exploratory run
showed, one table over every plan of the calibration, and one figure per setting.

    python -m searchr1_lab spiral-report [--registration docs/lab/spiral/calibration/default/plan.json] [--out DIR]

A plan (``docs/lab/spiral/calibration/<plan>/plan.json``) has the form of a registration
(:mod:`..registered.registration`) with status ``exploratory``; its ``report_dir`` is the calibration's directory,
whose every ``*/plan.json`` the report reads (``--registration``: any one of them, as the grid driver passes it;
default: the calibration's). The signature's parameters are the plan's ``signature`` file. Written into ``--out``
(default: the calibration's directory): ``README.md`` (the table), ``summary.json`` (its rows) and
``<plan>-<setting>-lr<rate>.png`` (the figures). A run's test split is never read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.compact import compact_name, lr_tag, read_gz_json
from searchr1_lab.methods import REPO_ROOT
from searchr1_lab.report import fmt, signed
from searchr1_lab.spiral.figures import setting_figure
from searchr1_lab.spiral.signature import Signature, load_params, run_series, signature
from searchr1_lab.registered import registration as plans

CALIBRATION_DIR = "docs/lab/spiral/calibration"
PLAN_FILE = "plan.json"


def read_plans(calibration_dir: Path) -> dict[str, dict[str, Any]]:
    """Plan name (its directory) -> the plan, for every ``*/plan.json`` of ``calibration_dir``, by name."""
    return {p.parent.name: plans.load_registration(p) for p in sorted(calibration_dir.glob(f"*/{PLAN_FILE}"))}


def part_cells(sig: Signature) -> dict[str, str]:
    """The table's cells of one run's signature: each part ``yes`` / ``no`` with the numbers that decided it."""
    a, b, c = sig.learning.evidence, sig.lld.evidence, sig.explosion.evidence
    yes = lambda part: "**yes**" if part.present else "no"  # noqa: E731
    learning = "no: no step after warm-up"
    if a.get("peak") is not None:
        learning = (f"{yes(sig.learning)}: steps {a['start']}-{a['peak']} ({a['steps']}), "
                    f"reward {signed(a['reward_gain'], 2)}, held-out {signed(a['held_out_gain'], 2)}")
    lld = (f"{yes(sig.lld)}: {fmt(-b['drop'], 2)} nats/token, steps {b['from_step']}-{b['to_step']}"
           if b.get("drop") is not None else "no: no rising stretch")
    if "reason" in c:
        burst = f"no: {c['reason']}"
    else:
        since = f" from {c['longest_from']}" if c["longest_from"] is not None else ""
        burst = (f"{yes(sig.explosion)}: longest {c['longest_steps']} steps{since} (entropy alone "
                 f"{c['entropy_alone_steps']}, gradient norm alone {c['grad_norm_alone_steps']})")
    return {"learning": learning, "lld": lld, "explosion": burst, "signature": yes(sig)}


def run_row(plan: str, run: Mapping[str, Any], sig: Signature) -> dict[str, Any]:
    """One run's row: its identity, how far it ran, its warm-up's end and its signature's parts."""
    steps = max((int(r["step"]) for r in run["records"]), default=0)
    return {"plan": plan, "setting": run["method"], "lr": run["lr"], "seed": run["seed"], "steps": steps,
            "warmup_end": run_series(run["records"]).warmup_end, "signature": sig.to_dict(),
            "cells": part_cells(sig)}


def calibration_rows(calibration_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every plan's cells in plan and cell order: the rows of the runs that have a compact file, and the names of the
    cells still to run."""
    rows, missing = [], []
    for name, plan in read_plans(calibration_dir).items():
        params = load_params(REPO_ROOT / plan["registration"]["signature"])
        runs_dir = REPO_ROOT / plan["registration"]["runs_dir"]
        for arm, lr, seed in plans.cells(plan):
            path = runs_dir / compact_name(arm, lr, seed)
            if not path.is_file():
                missing.append(f"{name}/{arm}-lr{lr_tag(lr)}-seed{seed}")
                continue
            run = read_gz_json(path)
            rows.append(run_row(name, run, signature(run_series(run["records"]), params)))
    return rows, missing


def table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The calibration's table: a row per run, a column per part of the signature."""
    lines = ["| plan | setting | lr | seed | steps | warm-up end | (a) learning phase | (b) LLD in it | "
             "(c) sustained explosion | signature |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["cells"]
        lines.append(f"| {r['plan']} | `{r['setting']}` | {lr_tag(r['lr'])} | {r['seed']} | {r['steps']} | "
                     f"{r['warmup_end']} | {c['learning']} | {c['lld']} | {c['explosion']} | {c['signature']} |")
    return lines


def render(rows: Sequence[Mapping[str, Any]], missing: Sequence[str], figures: Sequence[str],
           calibration: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's README.md."""
    count = lambda part: sum(r["signature"][part]["present"] for r in rows)  # noqa: E731
    shown = sum(r["signature"]["present"] for r in rows)
    lines = ["# The death-spiral calibration: which parts of the paper's signature each setting showed", "",
             "Exploratory: one seed a setting, no hypothesis, nothing here confirms anything "
             "([the plan and how to resume it](../calibration.md)). A run shows the signature when it has (a) a "
             "learning phase after the warm-up, (b) the probe set's likelihood falling inside it while the reward "
             "still rises, and (c) entropy and gradient norm both above k times their learning-phase level for M "
             "consecutive steps after that fall began; the criterion and its values were fixed before any of these "
             "runs ([signature.md](../signature.md)). The test split is not read.", "",
             f"Runs finished: {len(rows)} of {len(rows) + len(missing)}. (a) on {count('learning')}, (b) on "
             f"{count('lld')}, (c) on {count('explosion')}; the whole signature on {shown}.", ""]
    lines += ["Plans: " + "; ".join(f"{name} ({p['registration']['title']}; world {p['world']['hash']})"
                                    for name, p in calibration.items()), ""]
    lines += table_lines(rows)
    if missing:
        lines += ["", "Not run yet: " + ", ".join(f"`{m}`" for m in missing) + "."]
    lines += ["", "## One figure per setting", "",
              "Training reward and held-out EM, the probe set's log-likelihood per token, entropy and gradient norm "
              "against step, one line per seed; dotted: the warm-up's end and the learning phase's bounds; "
              "dashed: k times the learning-phase level of entropy and gradient norm.", ""]
    lines += [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def write_report(calibration_dir: Path, out: Path) -> list[Path]:
    """``out/README.md``, ``out/summary.json`` and one figure per setting that has a finished run; the paths."""
    out.mkdir(parents=True, exist_ok=True)
    calibration = read_plans(calibration_dir)
    rows, missing = calibration_rows(calibration_dir)
    figures = []
    for name, plan in calibration.items():
        params = load_params(REPO_ROOT / plan["registration"]["signature"])
        for arm, spec in plan["arms"].items():
            for lr in spec["lrs"]:
                runs = [read_gz_json(p) for seed in plans.arm_seeds(plan, spec)
                        if (p := REPO_ROOT / plan["registration"]["runs_dir"] / compact_name(arm, lr, seed)).is_file()]
                if runs:
                    stem = f"{name}-{arm}-lr{lr_tag(lr)}.png"
                    mine = [r for r in rows if (r["plan"], r["setting"], r["lr"]) == (name, arm, lr)]
                    setting_figure(runs, mine, f"{name}: {spec.get('label', arm)}, lr {lr_tag(lr)}", out / stem,
                                   params.explosion_ratio)
                    figures.append(stem)
    (out / "summary.json").write_text(json.dumps({"rows": rows, "missing": missing}, indent=1, sort_keys=True)
                                      + "\n")
    (out / "README.md").write_text(render(rows, missing, figures, calibration))
    return [out / "README.md", out / "summary.json", *(out / f for f in figures)]


def main(argv: Sequence[str]) -> int:
    """``spiral-report``: the calibration's report (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m searchr1_lab spiral-report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--registration", help="a plan of the calibration (its report_dir is the calibration's "
                   f"directory; default {CALIBRATION_DIR})")
    p.add_argument("--out", help="the report's directory (default: the calibration's)")
    p.add_argument("--readme", help="accepted as the grid driver passes it; the calibration writes no README block")
    args = p.parse_args(list(argv))
    calibration_dir = REPO_ROOT / (json.loads(Path(args.registration).read_text())["registration"]["report_dir"]
                                   if args.registration else CALIBRATION_DIR)
    for path in write_report(calibration_dir, Path(args.out) if args.out else calibration_dir):
        print(path)
    return 0
