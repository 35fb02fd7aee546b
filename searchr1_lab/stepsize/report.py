"""The step-size study's report: the registered analysis (:mod:`.analysis`) of the grid's compact results, its
figures, a plain-language verdict and the README's block, all written by one command:

    python -m searchr1_lab stepsize-report [--registration docs/lab/stepsize/registration.json] [--runs DIR]
        [--out DIR] [--readme docs/lab/results.md]

Writes ``summary.json`` (every number), ``README.md`` (the verdict, the hypotheses, the label's sensitivity, the
alarms, how well the controls matched LLDS's step size), ``survival.png`` (Kaplan-Meier curves per arm, one panel per
learning rate), ``step_size.png`` (collapse against measured step size, one point per run) and ``curves.png`` (held-out
EM, per-step KL and the paper's phenomena over the steps: reward, the likelihood of correct responses, entropy,
gradient norm; one line per run) and ``movement.png`` (how far each run had moved by each step, its collapse marked:
:mod:`.movement`, exploratory). An unfinished grid is reported as interim: no verdict is final until every
registered run has finished.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.compact import read_runs
from searchr1_lab.methods import read_lab_config
from searchr1_lab.report import analysis_change_lines, signed, signed_bca, signed_interval
from searchr1_lab.registered.report import StudyReport
from searchr1_lab.studies import analysis_changes, current_command, late_readings
from searchr1_lab.stepsize import account
from searchr1_lab.stepsize.analysis import (HELD_OUT, cell_survival, exploratory_alarms, hypotheses, run_points,
                                            same_lr, sensitivity_table)
from searchr1_lab.stepsize.figures import FIGURES, MEASURE_NAMES, write_figures
from searchr1_lab.stepsize.movement import MEASURES, cells_movement, movement_sensitivity, movement_study
from searchr1_lab.stepsize.readings import (cell_table, small_sample_rows, unregistered_comparisons,
                                            warmup_steps)
from searchr1_lab.registered.registration import STEPSIZE_FILE, cells

__all__ = ["FIGURES", "README_BEGIN", "README_END", "analyse", "main", "readme_block", "readme_markers", "render",
           "write_report"]


def readme_markers(reg: Mapping[str, Any]) -> tuple[str, str]:
    """The README block of a study: ``<!-- NAME:begin (its analysis command) -->`` .. ``<!-- NAME:end -->``, NAME the
    registration's ``readme_block`` (default ``stepsize-results``)."""
    block = reg["registration"]
    name = block.get("readme_block", "stepsize-results")
    command = current_command(block.get("analysis_command",
                                        "python -m searchr1_lab stepsize-report --readme README.md"))
    return f"<!-- {name}:begin ({command}) -->", f"<!-- {name}:end -->"


README_BEGIN, README_END = readme_markers({"registration": {}})  # the step-size study's block


def step_size_window(reg: Mapping[str, Any]) -> tuple[int, int]:
    """The steps whose mean per-step KL is a run's measured step size (the registration's ``step_size``)."""
    window = reg.get("step_size", {"first": 1, "last": 20})
    return int(window["first"]), int(window["last"])


def matching(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per arm and rate: the mean, min and max over its runs of the measured step size (mean per-step KL over the
    registered window), and its runs' count: how close each control came to LLDS's step size."""
    out = []
    for arm, lr in dict.fromkeys((p["arm"], p["lr"]) for p in points):
        sizes = [p["step_size"] for p in points if p["arm"] == arm and same_lr(p["lr"], lr) and finite(p["step_size"])]
        out.append({"arm": arm, "lr": lr, "runs": len(sizes), "mean": statistics.fmean(sizes) if sizes else None,
                    "min": min(sizes, default=None), "max": max(sizes, default=None)})
    return out


def analyse(reg: Mapping[str, Any], runs_dir: str | Path) -> dict[str, Any]:
    """The registered analysis of the compact results in ``runs_dir``, and the descriptive tables beside it."""
    runs, _ = read_runs(runs_dir)
    planned = cells(reg)
    names = {(a, round(lr, 12), s) for a, lr, s in planned}
    mine = [r for r in runs if (r["method"], round(float(r["lr"]), 12), r["seed"]) in names]
    label = reg["label"]
    first, last = step_size_window(reg)
    points = run_points(mine, label, step_window=(first, last))
    survival = [cell_survival(mine, arm, lr, label) for arm, arm_spec in reg["arms"].items() for lr in arm_spec["lrs"]]
    hyps = hypotheses(mine, reg)
    warm = study_warmup_steps(reg)
    return {"registration": reg["registration"], "world": reg.get("world"), "label": label,
            "step_size_window": [first, last], "runs_planned": len(planned), "runs_finished": len(mine),
            "complete": len(mine) >= len(planned), "arms": reg["arms"], "survival": survival,
            "hypotheses": hyps, "sensitivity": sensitivity_table(mine, reg), "warmup_steps": warm,
            "cells": cell_table(mine, reg, after=warm), "small_sample": small_sample_rows(hyps),
            "unregistered": unregistered_comparisons(mine, reg, unnamed_pairs(reg)),
            "exploratory_alarms": exploratory_alarms(mine, reg),
            "exploratory_movement": {"cells": cells_movement(mine, label), "primary": movement_study(mine, reg),
                                     "sensitivity": {m: movement_sensitivity(mine, reg, m) for m in MEASURES}},
            "matching": matching(points), "points": points,
            "analysis_changes": analysis_changes(reg["registration"], report_module=__name__),
            "late_readings": late_readings(reg["registration"])}


def study_warmup_steps(reg: Mapping[str, Any]) -> int:
    """The rollout steps of the study's config that hold learning-rate warm-up updates (:func:`.readings.warmup_steps`)."""
    values, _, _ = read_lab_config(reg["registration"]["config"], [])
    trainer = values.get("trainer", {})
    return warmup_steps(float(trainer.get("warmup_ratio", 0.0)), int(trainer.get("total_steps", 1)))


def unnamed_pairs(reg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The arms no hypothesis names, each paired with the first hypothesis's treatment (exploratory comparisons)."""
    named = {v for spec in reg["hypotheses"].values() for k, v in spec.items()
             if k in ("treatment", "control", "baseline", "matched_control")}
    named |= {c for spec in reg["hypotheses"].values() for c in spec.get("controls", ())}
    first = next((spec["treatment"] for spec in reg["hypotheses"].values() if "treatment" in spec), None)
    return [(arm, first) for arm in reg["arms"] if arm not in named and first is not None]


# ---------------------------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------------------------


def _num(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _welch(comp: Mapping[str, Any]) -> str:
    """``[+11.3, +19.1]``: the 95 % Welch interval of a comparison's RMST difference (``-`` without one)."""
    welch = comp.get("welch") or {}
    return "-" if welch.get("low") is None else f"[{signed(welch['low'])}, {signed(welch['high'])}]"


def _comparison_text(c: Mapping[str, Any]) -> str:
    """``llds_action (2e-3) 4/5 collapsed, RMST 41.2 vs grpo (2e-3) 5/5, 11.0: difference 30.2 [21.0, 39.1] steps
    (bootstrap 95 %; Welch 95 % [+19.8, +40.6]), log-rank one-sided p 0.004: supported``."""
    comp = c["comparison"]
    a, b, d, lr = comp["a"], comp["b"], comp["rmst_difference"], comp["logrank"]
    if a["rmst"] is None or b["rmst"] is None:
        return f"{a['arm']} (lr {a['lr']:g}) against {b['arm']} (lr {b['lr']:g}): no runs of one of them yet"
    return (f"{a['arm']} (lr {a['lr']:g}) {a['count']} collapsed, RMST {_num(a['rmst'])} vs {b['arm']} "
            f"(lr {b['lr']:g}) {b['count']}, RMST {_num(b['rmst'])}: difference {_num(d['estimate'])} [{_num(d['low'])}, "
            f"{_num(d['high'])}] steps (bootstrap 95 %; Welch 95 % {_welch(comp)}), log-rank one-sided p "
            f"{lr['p_one_sided']:.3g}{_holm(comp)}: "
            f"{'supported' if c['supported'] else 'not supported'}")


def _holm(comp: Mapping[str, Any]) -> str:
    return f" (Holm-adjusted {comp['p_holm']:.3g})" if comp.get("p_holm") is not None else ""


def hypothesis_lines(hyps: Mapping[str, Any], reg: Mapping[str, Any]) -> list[str]:
    """One bullet per registered hypothesis, in the registration's order (its registered title, then what was
    measured)."""
    lines = []
    for name, spec in reg["hypotheses"].items():
        res, title = hyps[name], spec.get("title", name)
        if "endpoint" in res:
            lines.append(f"- **{name}** ({title}): {account.endpoint_text(res, spec)}.")
        elif "utility_ok" in res:
            lines.append(f"- **{name}** ({title}): {account.matched_text(res, spec)}.")
        elif "comparison" in res:
            lines.append(f"- **{name}** ({title}): {_comparison_text(res)}.")
        elif "controls" in res:
            lines.append(f"- **{name}** ({title}): verdict **{mechanism_verdict(res)}**. Against the baseline: "
                         f"{_comparison_text(res['baseline'])}.")
            lines += [f"  - against {ctrl}: {_comparison_text(res['controls'][ctrl])}." for ctrl in spec["controls"]]
        else:
            lines.append(f"- **{name}** ({title}): " + alarm_text(res, spec))
    return lines


def alarm_text(res: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """The alarms at a matched false-alarm rate (the reference first, then the registered ones in order)."""
    if not res.get("estimable", True):
        return f"at lr {res['lr']:g}, {res['reason']}."
    parts = []
    for name in (res["reference"], *spec["alarms"]):
        a = res["alarms"][name]
        diff = a.get("versus_reference") or {}
        verdict = "" if name == res.get("reference") else (
            f", lead minus {res['reference']}'s {_num(diff.get('estimate'))} [{_num(diff.get('low'))}, "
            f"{_num(diff.get('high'))}]: {'supported' if a.get('supported') else 'not supported'}")
        parts.append(f"{name} (threshold {_num(a['threshold'], 3)}, false alarms {a['false_alarms']}, detected "
                     f"{a['detections']}, median lead {_num(a['median_lead'])} steps{verdict})")
    return f"at lr {res['lr']:g}: " + "; ".join(parts) + "."


def exploratory_alarm_lines(s: Mapping[str, Any], reg: Mapping[str, Any]) -> list[str]:
    """The alarms re-tested under the healthy-stretch false-alarm rule, marked as not registered."""
    found = s.get("exploratory_alarms") or {}
    if not found:
        return []
    lines = ["## Alarms against each run's healthy stretch (exploratory, not registered)", "",
             "The registered alarm test sets its false-alarm rate on runs that did not collapse. This re-test, chosen "
             "after the grid had started and not registered, needs none: a firing is false while a run's held-out EM "
             "is still at or above its own step-0 value (its healthy stretch), each alarm's threshold lets at most "
             "the registered share of the runs fire there, and a collapsed run's lead counts from the end of its "
             "stretch: how early in the decline the alarm noticed. Same alarms, rates and bootstrap as the "
             "registered test.", ""]
    return lines + [f"- **{name}** ({reg['hypotheses'][name].get('title', name)}): "
                    + alarm_text(res, reg["hypotheses"][name]) for name, res in found.items()] + [""]



def _sides(labels: Sequence[Mapping[str, Any]]) -> str:
    """``2/6 above 0, 0/6 below``: over the labels, how many of a difference's intervals lie above 0 and below."""
    above = sum(1 for d in labels if d.get("low") is not None and d["low"] > 0)
    below = sum(1 for d in labels if d.get("high") is not None and d["high"] < 0)
    return f"{above}/{len(labels)} above 0, {below}/{len(labels)} below"


def movement_lines(s: Mapping[str, Any], reg: Mapping[str, Any]) -> list[str]:
    """How far each compared pair's runs moved before they collapsed (exploratory), a table per measure's difference
    and where the intervals lie over the registered labels."""
    found = s.get("exploratory_movement") or {}
    if not found.get("primary"):
        return []
    lines = ["## How far the runs moved before they collapsed (exploratory, not registered)", "",
             "A method that only takes smaller steps should collapse after as much movement as GRPO, only later; one "
             "that moves the cliff should travel further first. Each registered comparison re-read with the movement "
             "to collapse (to the horizon when censored) as the endpoint: treatment mean, control mean, and the "
             "difference (treatment minus control) with its 95 % bootstrap interval over runs, and the BCa interval "
             "from the same replicates, under the primary label; the last column counts where the bootstrap interval "
             "lies under the registered labels of the sensitivity "
             f"grid. {_when_chosen(reg, 'movement')}; three measures, because they do not always agree.", "",
             "| comparison | measure | treatment | control | difference | BCa (not registered) | over the labels |",
             "|---|---|---|---|---|---|---|"]
    sens = found["sensitivity"]
    for i, pair in enumerate(found["primary"]):
        name = (f"{pair['hypothesis']}: {pair['treatment']} ({pair['lr']:g}) vs {pair['control']} "
                f"({pair['control_lr']:g})")
        for measure, res in pair["measures"].items():
            lines.append(f"| {name} | {MEASURE_NAMES[measure]} | {_num(res['mean_treatment'], 2)} | "
                         f"{_num(res['mean_control'], 2)} | {signed_interval(res['difference'], 2)} | "
                         f"{signed_bca(res['difference'], 2)} | {_sides(sens[measure][i]['labels'])} |")
    lines += ["", "Per cell (mean, min-max over its runs; censored runs count to the horizon):", "",
              "| arm | lr | runs (censored) | " + " | ".join(MEASURE_NAMES[m] for m in MEASURES) + " |",
              "|---|---|---|" + "---|" * len(MEASURES)]
    lines += [f"| {c['arm']} | {c['lr']:g} | {c['runs']} ({c['censored']}) | "
              + " | ".join(f"{_num(c[m]['mean'], 2)} ({_num(c[m]['min'], 2)}-{_num(c[m]['max'], 2)})" for m in MEASURES)
              + " |" for c in found["cells"]]
    return lines + ["", "![How far each run had moved by each step, its collapse marked](movement.png)", ""]


def _when_chosen(reg: Mapping[str, Any], reading: str) -> str:
    """When an exploratory reading was chosen: named by the registration among what it reports (``reported``), or
    (for a registration that does not name it) after the grid had started."""
    return ("Named in the registration as reported, not registered" if reading in reg.get("reported", ())
            else "Chosen after the grid had started")


def verdict_text(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """The study's answer in plain words, from the primary label's hypotheses (interim when the grid is not done):
    a matched-control hypothesis's verdict, or a mechanism hypothesis's registered verdict beside what the data
    support (:func:`.account.controls_reading`)."""
    hyps = s["hypotheses"]
    head = "" if s["complete"] else (f"Interim ({s['runs_finished']} of {s['runs_planned']} runs): nothing below is "
                                     "final. ")
    matched = next((h for h in hyps.values() if "utility_ok" in h), None)
    mech = next((h for h in hyps.values() if "controls" in h), None)
    endpoints = {n: h for n, h in hyps.items() if "endpoint" in h}
    if matched is None and mech is None and not endpoints:
        return head + "No mechanism hypothesis is registered."
    if not s["runs_finished"]:
        return head + "No run has finished yet."
    if matched is None and mech is None:
        return head + endpoint_verdicts_text(endpoints) + account.sensitivity_sentence(s, reg)
    if matched is not None:
        return head + matched_verdict_text(matched) + account.sensitivity_sentence(s, reg)
    if mechanism_verdict(mech) == "waiting for runs":
        return head + "The comparisons wait for finished runs of both LLDS and GRPO."
    reading, why = account.controls_reading(s, mech)
    said = {"mechanism": "LLDS survived longer than GRPO and than every GRPO control set to take steps as small as "
                         "LLDS's.",
            "smaller steps suffice": "LLDS survived longer than GRPO, but not longer than every GRPO control set to "
                                     "take steps as small as LLDS's over the registered window.",
            "inconclusive": "LLDS did not survive significantly longer than GRPO, so the question of mechanism does "
                            "not arise here."}[mech["verdict"]]
    return (head + f"Registered verdict: **{mech['verdict']}** (the registered rule). {said} What the data support "
            f"on mechanism: **{reading}**. " + " ".join(why) + account.sensitivity_sentence(s, reg))


def endpoint_verdicts_text(endpoints: Mapping[str, Mapping[str, Any]]) -> str:
    """The endpoint hypotheses' registered verdicts in a sentence, each with its comparison."""
    said = [f"{name} ({h['treatment']} against {h['control']}, `{h['key']}` after step {h['step']}): "
            f"**{h['verdict']}**" + (f" ({h['reason']})" if h.get("reason") else "") for name, h in endpoints.items()]
    return "Registered verdicts: " + "; ".join(said) + "."


def matched_verdict_text(res: Mapping[str, Any]) -> str:
    """A matched-control hypothesis's verdict in a sentence."""
    a, b = res["comparison"]["a"]["arm"], res["comparison"]["b"]["arm"]
    if res["comparison"]["a"]["rmst"] is None or res["comparison"]["b"]["rmst"] is None:
        return f"The comparison of {a} with {b} waits for finished runs of both."
    return {"mechanism": f"{a} outlived {b}, which took the same step size after the warm-up, and learned no less: "
                         "the sandbox supports a mechanism beyond smaller steps.",
            "smaller steps suffice": f"{a} and {b}, which took the same step size after the warm-up, survived "
                                     "equivalently (within the registered margin): in this sandbox, smaller steps "
                                     "suffice to explain LLDS's survival.",
            "inconclusive": f"Inconclusive: {_inconclusive_reason(res)}."}[res["verdict"]]


def _inconclusive_reason(res: Mapping[str, Any]) -> str:
    a, b = res["comparison"]["a"]["arm"], res["comparison"]["b"]["arm"]
    if not res["step_size"]["matched"]:
        return (f"{b} did not hold {a}'s step size after the warm-up (ratio {res['step_size']['ratio']:.2f}), so "
                "survival says nothing about mechanism")
    if res["supported"] and not res["utility_ok"]:
        return f"{a} outlived {b} but was not shown to learn as much"
    welch = res["comparison"].get("welch") or {}
    if welch.get("high") is not None and welch["high"] < 0:
        return (f"{a} neither outlived {b} nor survived equivalently within the registered margin; {b} outlived "
                f"{a} (RMST difference {welch['estimate']:+.1f} [{welch['low']:+.1f}, {welch['high']:+.1f}] steps, "
                "Welch 95 %), which the registered verdicts do not name (not registered)")
    return f"{a} neither outlived {b} nor survived equivalently within the registered margin"


def mechanism_verdict(res: Mapping[str, Any]) -> str:
    """A mechanism hypothesis's verdict, or ``waiting for runs`` while its baseline comparison has none."""
    comp = res["baseline"]["comparison"]
    return res["verdict"] if comp["a"]["rmst"] is not None and comp["b"]["rmst"] is not None else "waiting for runs"


def _sensitivity_verdict(verdict: str | bool, controls: Mapping[str, bool] | None) -> str:
    """One cell of the sensitivity table: the verdict, and for a mechanism hypothesis which controls were outlived."""
    text = verdict if isinstance(verdict, str) else ("supported" if verdict else "not supported")
    if not controls:
        return text
    outlived = [c for c, beaten in sorted(controls.items()) if beaten]
    others = [c for c, beaten in sorted(controls.items()) if not beaten]
    return f"{text} (outlived: {', '.join(outlived) or 'none'}; not: {', '.join(others) or 'none'})"


def sensitivity_lines(s: Mapping[str, Any], reg: Mapping[str, Any]) -> list[str]:
    """The label's sensitivity as a table: one row per (ratio, persist), the verdicts and the collapse counts."""
    rows = s["sensitivity"]
    hyps = [h for h in reg["hypotheses"] if rows and h in rows[0]["verdicts"]]
    cells_ = [f"{c['arm']} {c['lr']:g}" for c in rows[0]["cells"]] if rows else []
    out = ["| ratio | persist | " + " | ".join(hyps) + " | " + " | ".join(cells_) + " |",
           "|---|---|" + "---|" * (len(hyps) + len(cells_))]
    for row in rows:
        mark = " (primary)" if row["primary"] else ""
        verdicts = [_sensitivity_verdict(row["verdicts"][h], row.get("controls", {}).get(h)) for h in hyps]
        out.append(f"| {row['ratio']} | {row['persist']}{mark} | " + " | ".join(verdicts) + " | "
                   + " | ".join(c["count"] for c in row["cells"]) + " |")
    return out


def render(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """The report's README.md."""
    label = s["label"]
    first, last = s["step_size_window"]
    block = reg["registration"]
    prose = Path(block.get("prose", "registration.md")).name
    lines = [f"# {reg['registration'].get('report_title', 'Mechanism or step size? The death spiral over long runs')}",
             "", f"The registered analysis ([registration]({prose}), analysis code at commit "
             f"`{str(reg['registration'].get('analysis_commit'))[:10]}`) of {s['runs_finished']} of {s['runs_planned']} "
             f"runs, written by `{current_command(block.get('analysis_command', 'python -m searchr1_lab stepsize-report'))}`.",
             "", *analysis_change_lines(s["analysis_changes"], s.get("late_readings")),
             f"**Verdict.** {verdict_text(s, reg)}", "",
             f"Collapse label (primary): held-out EM on the fixed validation subsample (`{HELD_OUT}`) at or below "
             f"{label['ratio']} x the run's own step-0 value at {label['persist']} evaluations in a row; a run that "
             f"never does is censored at step {label['horizon']}. Step size: the mean per-step KL between the policy "
             f"before and after each step (`lld/step_kl`) over steps {first}-{last}.", "",
             "## Hypotheses (primary label)", "", *hypothesis_lines(s["hypotheses"], reg), "",
             "![Kaplan-Meier survival per arm](survival.png)", "",
             *account.small_sample_lines(s.get("small_sample") or []), *account.cell_lines(s),
             *account.unregistered_lines(s.get("unregistered") or []),
             "## The label's sensitivity (registered)", "", *sensitivity_lines(s, reg), "",
             *exploratory_alarm_lines(s, reg), *movement_lines(s, reg),
             f"## Step size over the registered window (steps {first}-{last})", "",
             "| arm | lr | runs | mean step KL | min | max |", "|---|---|---|---|---|---|"]
    lines += [f"| {m['arm']} | {m['lr']:g} | {m['runs']} | {_num(m['mean'], 4)} | {_num(m['min'], 4)} | "
              f"{_num(m['max'], 4)} |" for m in s["matching"]]
    lines += ["", "![Collapse step against measured step size, one point per run](step_size.png)", "",
              "![Held-out EM, per-step KL, reward, correct-response likelihood, entropy and gradient norm over the "
              "steps, one line per run](curves.png)", "",
              "## Cells", "", "| arm | lr | collapsed | collapse steps (censored: -) | RMST (steps) |",
              "|---|---|---|---|---|"]
    lines += [f"| {c['arm']} | {c['lr']:g} | {c['count']} | "
              + ", ".join(str(t) if e else "-" for t, e in zip(c["times"], c["events"])) + f" | {_num(c['rmst'])} |"
              for c in s["survival"]]
    return "\n".join(lines) + "\n"


def _short(c: Mapping[str, Any]) -> str:
    """``llds_action 2/5 vs grpo 5/5 collapsed, RMST difference +30.2 steps, Welch [+19.8, +40.6] (bootstrap
    [+21.0, +39.1]), p 0.004: supported``."""
    comp = c["comparison"]
    a, b, d = comp["a"], comp["b"], comp["rmst_difference"]
    if a["rmst"] is None or b["rmst"] is None:
        return f"{a['arm']} vs {b['arm']}: no runs of one of them yet"
    return (f"{a['arm']} {a['count']} vs {b['arm']} (lr {b['lr']:g}) {b['count']} collapsed, RMST difference "
            f"{signed(d['estimate'])} steps, Welch {_welch(comp)} (bootstrap [{signed(d['low'])}, "
            f"{signed(d['high'])}]), p "
            f"{comp['logrank']['p_one_sided']:.2g}{_holm(comp)}: {'supported' if c['supported'] else 'not supported'}")


def readme_block(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """The README's block: runs finished and the verdict; the endpoint comparisons; the survival comparisons; the
    mechanism test (a mechanism hypothesis's controls, or a matched-control hypothesis); the alarms (each hypothesis
    by name, in the registration's order; a line only where the study has such hypotheses)."""
    hyps, specs = s["hypotheses"], reg["hypotheses"]
    survival = [f"{n} {_short(hyps[n])}" for n in specs if "comparison" in hyps[n] and "utility_ok" not in hyps[n]]
    mechanism = [f"{n} **{mechanism_verdict(hyps[n])}** (registered): " + "; ".join(
        _short(hyps[n]["controls"][c]) for c in specs[n]["controls"]) for n in specs if "controls" in hyps[n]]
    mechanism += [f"{n} {account.matched_text(hyps[n], specs[n])}" for n in specs if "utility_ok" in hyps[n]]
    alarms = [f"{n} " + alarm_text(hyps[n], specs[n]) for n in specs if "alarms" in specs[n]]
    endpoints = [f"{n} {account.endpoint_text(hyps[n], specs[n])}" for n in specs if "endpoint" in hyps[n]]
    lines = [f"{s['runs_finished']} of {s['runs_planned']} runs finished. {verdict_text(s, reg)}"]
    if endpoints:
        lines.append("- Endpoints against the warm start: " + "; ".join(endpoints) + ".")
    if survival:
        lines.append("- Survival (one-sided log-rank p, Holm-adjusted over the confirmatory family; RMST difference "
                     "with its 95 % Welch interval on the runs' restricted survival times, and the registered "
                     "bootstrap's): " + "; ".join(survival) + ".")
    if mechanism:
        lines.append("- Mechanism, against the step-size-matched controls: " + "; ".join(mechanism) + ".")
    if alarms:
        lines.append("- Alarms at a matched false-alarm rate: " + " ".join(alarms))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------------------------------


REPORT = StudyReport("python -m searchr1_lab stepsize-report", STEPSIZE_FILE, analyse, render, write_figures,
                     readme_block, readme_markers)


def write_report(registration: str | Path, runs_dir: str | Path, out_dir: str | Path,
                 readme: str | Path | None = None) -> dict[str, Any]:
    """``summary.json``, ``README.md`` and the figures in ``out_dir``; with ``readme``, its block replaced."""
    return REPORT.write(registration, runs_dir, out_dir, readme)


def main(argv: Sequence[str]) -> int:
    return REPORT.main(argv, __doc__.split("\n\n")[0])
