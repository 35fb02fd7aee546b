"""The frontier's registered analysis, its report (``README.md``, ``summary.json``, the figures) and the README block,
from the grid's compact results alone: ``python -m searchr1_lab frontier-report [--registration FILE] [--readme
docs/lab/results.md]``.

Every cell (an arm at one learning rate) is scored by its runs' endpoints (:mod:`.endpoints`); the Pareto frontier
is taken over the cells with runs, on (RMST, mean utility) (:mod:`.pareto`), and how firmly each cell holds its place
there is read with Welch intervals (:mod:`.margins`, not registered); each method's dose is chosen on
validation (:mod:`.selection`), and the chosen settings' test EM is read only once every registered run is in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lld.config import ConfigError
from searchr1_lab.baselines import BASELINE_LABELS
from searchr1_lab.compact import read_runs
from searchr1_lab.frontier.endpoints import cell_endpoints, run_endpoints
from searchr1_lab.frontier.figures import FIGURES, write_figures
from searchr1_lab.frontier.margins import LEVEL, frontier_margins
from searchr1_lab.frontier.pareto import pareto_front
from searchr1_lab.frontier.selection import baseline_test_scores, choose, method_cells, test_scores
from searchr1_lab.prereg.registration import phenomena
from searchr1_lab.methods import read_lab_config
from searchr1_lab.report import analysis_change_lines, fmt, late_text, signed, signed_interval
from searchr1_lab.stepsize.analysis import cell_runs, same_lr
from searchr1_lab.registered.registration import cells
from searchr1_lab.registered.report import StudyReport
from searchr1_lab.studies import RESULTS_PAGE, analysis_changes, current_command, late_readings

FRONTIER_FILE = "docs/lab/frontier/registration.json"
# the paper's phenomena in the report's table: key of prereg.registration.phenomena -> column
PHENOMENA_COLUMNS = {"entropy_start": "entropy start", "entropy_end": "entropy end",
                     "grad_norm_max_ratio": "max grad norm / early", "correct_logp_start": "correct logp start",
                     "correct_logp_end": "correct logp end"}


def method_of_arm(reg: Mapping[str, Any]) -> dict[str, str]:
    """Arm -> its method (the registration's ``frontier.methods``); ConfigError unless every arm has exactly one."""
    owner: dict[str, str] = {}
    for method, arms in reg["frontier"]["methods"].items():
        for arm in arms:
            if arm in owner or arm not in reg["arms"]:
                raise ConfigError(f"frontier.methods: arm {arm!r} is {'listed twice' if arm in owner else 'unknown'}")
            owner[arm] = method
    missing = sorted(set(reg["arms"]) - set(owner))
    if missing:
        raise ConfigError(f"frontier.methods names no method for the arms {missing}")
    return owner


def _mean_phenomena(runs: Sequence[Mapping[str, Any]], settings: Mapping[str, int]) -> dict[str, float | None]:
    rows = [phenomena(r["records"], settings["window"], settings["early_steps"]) for r in runs]
    out = {}
    for key in PHENOMENA_COLUMNS:
        vals = [row[key] for row in rows if row[key] == row[key]]  # NaN != NaN: left out
        out[key] = sum(vals) / len(vals) if vals else None
    return out


def cell_rows(reg: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
              points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per registered cell, in the registration's order: its method, dose, endpoints (``points``: the runs'
    :func:`.endpoints.run_endpoints`) and phenomena."""
    label, owner = reg["label"], method_of_arm(reg)
    rows = []
    for arm_name, arm in reg["arms"].items():
        for lr in arm["lrs"]:
            mine = [p for p in points if p["arm"] == arm_name and same_lr(p["lr"], lr)]
            dose = arm.get("dose", arm.get("label", arm_name)) + (f", lr {lr:g}" if len(arm["lrs"]) > 1 else "")
            rows.append({"arm": arm_name, "lr": lr, "name": f"{arm_name}@{lr:g}", "method": owner[arm_name],
                         "dose": dose, **cell_endpoints(mine, int(label["horizon"])),
                         "phenomena": _mean_phenomena(cell_runs(runs, arm_name, lr), reg["frontier"]["phenomena"])})
    scored = [c for c in rows if c["runs"] and c["utility"]["mean"] is not None]
    front = {scored[i]["name"] for i in pareto_front([(c["rmst"], c["utility"]["mean"]) for c in scored])}
    for c in rows:
        c["on_frontier"] = c["name"] in front
    return rows


def analyse(reg: Mapping[str, Any], runs_dir: str | Path) -> dict[str, Any]:
    """The registered analysis of the compact results in ``runs_dir`` (module docstring)."""
    runs, base = read_runs(runs_dir)
    points = [run_endpoints(r, reg["label"]) for r in runs]
    rows = cell_rows(reg, runs, points)
    planned = cells(reg)
    missing = [(arm, lr, seed) for arm, lr, seed in planned
               if seed not in {r["seed"] for r in cell_runs(runs, arm, lr)}]
    complete = not missing  # every registered run, not merely as many runs: the test split is read once
    chosen = {m: choose(method_cells(rows, arms)) for m, arms in reg["frontier"]["methods"].items()}
    chosen = {m: c for m, c in chosen.items() if c is not None}
    if complete and base is None:
        raise FileNotFoundError(f"{runs_dir} holds no baselines file: the test questions' subjects are read there")
    return {"registration": reg["registration"], "label": reg["label"], "runs_finished": len(runs),
            "runs_planned": len(planned), "complete": complete, "methods": list(reg["frontier"]["methods"]),
            "cells": rows, "frontier": [c["name"] for c in sorted((c for c in rows if c["on_frontier"]),
                                                                   key=lambda c: c["rmst"])],
            "chosen": {m: c["name"] for m, c in chosen.items()},
            "test": test_scores(chosen, runs, base) if complete else None,
            "test_baselines": baseline_test_scores(base) if complete else None,
            "margins": frontier_margins(rows, points, int(reg["label"]["horizon"])),
            "held_out_questions": held_out_questions(reg),
            "analysis_changes": analysis_changes(reg["registration"], report_module=__name__),
            "late_readings": late_readings(reg["registration"])}


def held_out_questions(reg: Mapping[str, Any]) -> int | None:
    """The questions of the held-out subsample utility is measured on (the study config's ``trainer.val_subsample``;
    None for a registration without a config)."""
    if "config" not in reg["registration"]:
        return None
    values, _, _ = read_lab_config(reg["registration"]["config"], [])
    return int(values["trainer"]["val_subsample"])


def _spread(s: Mapping[str, Any], digits: int = 3, sign: bool = False) -> str:
    if s["mean"] is None:
        return "-"
    show = signed if sign else fmt
    return f"{show(s['mean'], digits)} [{show(s['min'], digits)}, {show(s['max'], digits)}]"


def cell_table(s: Mapping[str, Any]) -> list[str]:
    lines = ["| method | dose | runs | collapsed | RMST (steps) | utility: peak gain [min, max] | gain area [min, max] "
             "| final validation EM | on the frontier |", "|" + " --- |" * 9]
    for c in s["cells"]:
        lines.append(f"| {c['method']} | {c['dose']} | {c['runs']} | {c['collapsed']} | {fmt(c['rmst'], 1)} | "
                     f"{_spread(c['utility'])} | {_spread(c['gain_area'], sign=True)} | "
                     f"{fmt(c['final_val_em']['mean'])} | {'yes' if c['on_frontier'] else ''} |")
    return lines


def phenomena_table(s: Mapping[str, Any]) -> list[str]:
    lines = ["| cell | " + " | ".join(PHENOMENA_COLUMNS.values()) + " |", "|" + " --- |" * (1 + len(PHENOMENA_COLUMNS))]
    for c in s["cells"]:
        lines.append(f"| {c['name']} | " + " | ".join(fmt(c["phenomena"][k], 2) for k in PHENOMENA_COLUMNS) + " |")
    return lines


def test_lines(s: Mapping[str, Any]) -> list[str]:
    if s["test"] is None:
        return [f"Withheld until every registered run is in ({s['runs_finished']} of {s['runs_planned']}): the test "
                "split is read once, for the settings chosen on validation."]
    lines = ["| method | chosen on validation | test EM [95 % interval, subjects resampled] | rank on validation | "
             "rank on test |", "|" + " --- |" * 5]
    for m, t in s["test"].items():
        em = t["test_em"]
        lines.append(f"| {m} | {s['chosen'][m]} | {fmt(em['mean'])} [{fmt(em['lo'])}, {fmt(em['hi'])}] | "
                     f"{t['rank_validation']} | {t['rank_test']} |")
    above = [m for m, t in s["test"].items() if t["test_em"]["lo"] > s["test_baselines"]["warm_start"]["hi"]]
    late = (s.get("late_readings") or {}).get("test_baselines")
    label = late_text(late) if late else ""
    return lines + ["", (f"*{label[:1].upper() + label[1:]}:* " if late else "")
                    + "The same test questions without training (one policy each, subjects resampled): "
                    + "; ".join(f"{BASELINE_LABELS[b]} {fmt(em['mean'])} [{fmt(em['lo'])}, {fmt(em['hi'])}]"
                                for b, em in s["test_baselines"].items())
                    + ". Chosen settings whose final policies score above the warm start on test (intervals apart): "
                    + (", ".join(above) or "none") + "."]


def unresolved(s: Mapping[str, Any]) -> list[str]:
    """The cells on the frontier whose place is not resolved (:func:`.margins.frontier_margins`)."""
    return [m["cell"] for m in s.get("margins") or [] if not m["resolved"]]


def frontier_names(s: Mapping[str, Any], bold: bool = False) -> str:
    """The cells on the frontier by survival, each whose place is not resolved marked so."""
    flagged = unresolved(s)
    mark = "**" if bold else ""
    return ", ".join(f"{mark}{n}{mark}" + (" (its place unresolved)" if n in flagged else "")
                     for n in s["frontier"]) or "none yet"


def margin_lines(s: Mapping[str, Any]) -> list[str]:
    """How firmly each cell holds its place on the frontier: the rule, and each lead with its Welch interval."""
    if not s.get("margins"):
        return []
    n = s.get("held_out_questions")
    per_question = f"; a utility lead also in questions of the {n}-question held-out subsample" if n else ""
    lines = ["## How firmly each cell holds its place on the frontier (not registered)", "",
             "A cell is on the frontier because every other cell at least as good on one axis (a challenger) is worse "
             "on the other. Its lead over a challenger is that difference on the other axis, its value minus the "
             f"challenger's, with the Welch {LEVEL * 100:.0f} % interval over the two cells' runs (per-run utility; "
             f"per-run survival time to the horizon, whose mean is the RMST){per_question}. Rule: a cell's place is "
             "resolved when every lead's interval lies above 0; otherwise it is flagged: the frontier keeps or drops it "
             "on a difference its seeds cannot tell from none. Added after the frontier was read, not registered.", "",
             f"| on the frontier | challenger | lead on | lead [Welch {LEVEL * 100:.0f} %] | in questions | resolved |",
             "|" + " --- |" * 6]
    for m in s["margins"]:
        for d in m["leads"]:
            digits = 3 if d["axis"] == "utility" else 1
            questions = (signed(d["lead"]["estimate"] * n, 1) if n and d["axis"] == "utility"
                         and d["lead"]["estimate"] is not None else "")
            inside = d["lead"]["low"] is not None and d["lead"]["low"] > 0
            lines.append(f"| {m['cell']} | {d['challenger']} | {'RMST' if d['axis'] == 'rmst' else 'utility'} | "
                         f"{signed_interval(d['lead'], digits)} | {questions} | {'yes' if inside else 'no'} |")
    return lines + ["", "Flagged: " + (", ".join(unresolved(s)) or "none") + ".", ""]


def render(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """The report's README.md."""
    block, label = reg["registration"], s["label"]
    lines = [f"# {block.get('report_title', block['title'])}", "",
             f"The registered analysis ([registration](registration.md), analysis code at commit "
             f"`{str(block.get('analysis_commit'))[:10]}`) of {s['runs_finished']} of {s['runs_planned']} runs, "
             f"written by `{current_command(block['analysis_command'])}`. Exploratory: 3 seeds a cell, no "
             "hypothesis is tested; the figures describe this sandbox, not real models.", "",
             f"Collapse: held-out EM (`eval/val_sub_em`) at or below {label['ratio']} x the run's own step-0 value at "
             f"{label['persist']} evaluations in a row; survival is the RMST to step {label['horizon']}. Utility: the "
             "run's peak held-out gain over step 0, floored at 0 (a run that never learns has none, however long it "
             "lasts); gain area: its mean gain per step over the run.", "",
             *analysis_change_lines(s["analysis_changes"], s.get("late_readings")),
             "## The frontier", "", "![utility against survival](frontier.png)", "",
             "On the Pareto frontier (no other cell both learned more and lasted longer), by survival: "
             + frontier_names(s, bold=True) + ".", "", *cell_table(s), "", *margin_lines(s),
             "## Each method's dose, chosen on validation, scored once on test", "",
             "Chosen: the largest mean gain area, then utility, then RMST. "
             + "; ".join(f"{m}: {n}" for m, n in s["chosen"].items()) + ".", "", *test_lines(s), "",
             "## The paper's phenomena per method", "", "![phenomena](phenomena.png)", "", *phenomena_table(s), ""]
    return "\n".join(lines)


def readme_markers(reg: Mapping[str, Any]) -> tuple[str, str]:
    name = reg["registration"].get("readme_block", "frontier-results")
    return f"<!-- {name}:begin ({current_command(reg['registration']['analysis_command'])}) -->", f"<!-- {name}:end -->"


def readme_block(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """The study's lines of the results page (:data:`searchr1_lab.studies.RESULTS_PAGE`, between its markers; the
    report linked relative to that page)."""
    front = frontier_names(s)
    late = (s.get("late_readings") or {}).get("test_baselines")
    tested = ("test EM " + "; ".join(f"{m} {fmt(t['test_em']['mean'])}" for m, t in s["test"].items())
              + f" (the warm start, untrained: {fmt(s['test_baselines']['warm_start']['mean'])}"
              + ("; added after the test split was read, not registered" if late else "") + ")"
              if s["test"] is not None else "test withheld until the grid is complete")
    report = os.path.relpath(f"{reg['registration']['report_dir']}/README.md", Path(RESULTS_PAGE).parent)
    return (f"{s['runs_finished']} of {s['runs_planned']} runs ([report]({report}), "
            f"exploratory, 3 seeds a cell). On the learning-stability frontier: {front}. Chosen on validation: "
            + "; ".join(f"{m} {n}" for m, n in s["chosen"].items()) + f"; {tested}.")


REPORT = StudyReport("python -m searchr1_lab frontier-report", FRONTIER_FILE, analyse, render, write_figures,
                     readme_block, readme_markers)


def main(argv: Sequence[str]) -> int:
    return REPORT.main(argv, __doc__.split("\n\n")[0])


__all__ = ["FIGURES", "FRONTIER_FILE", "analyse", "main", "render", "readme_block", "readme_markers", "REPORT"]
