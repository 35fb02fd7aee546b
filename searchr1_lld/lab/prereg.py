"""The pre-registered death-spiral comparison, analysed exactly as registered (pure but for reading and writing files).

    python -m searchr1_lld.lab prereg-report [--prereg docs/lab/preregistration.json] [--runs DIR] [--out DIR]
                                             [--readme README.md]

The registration (``docs/lab/preregistration.json``, with its prose twin ``docs/lab/preregistration.md``) fixes the
grid, the held-out collapse label, the alarms and the hypotheses before any of its runs; this module reads it and the
grid's compact results (:mod:`.compact`: one file per run, and the baselines' file with the warm start's answers on
the validation and test splits) and computes:

- per run: the held-out collapse label (:func:`.detection.held_out_collapse_step` of its validation-EM curve against
  the warm start's validation EM), the training-reward collapse (secondary), the first step of every registered alarm
  and the phenomena (likelihood displacement, entropy, gradient norm, valid searches, reward; :func:`phenomena`);
- H1: at the rates where GRPO's held-out EM collapses on at least half of its seeds, each LLDS arm's share of
  collapsed runs minus GRPO's (Newcombe interval); supported for an arm when the interval lies below 0;
- H2: the probe-likelihood alarm, per collapsed run whether it fired at least ``lead_k`` steps before the collapse,
  and within the rates that hold both outcomes, how often it fired (at all) in runs that collapsed vs runs that did
  not; supported when that difference's interval lies above 0;
- H3: single-hop test EM of each LLDS arm minus GRPO at the H1 rates (paired bootstrap over test subjects and seeds);
  supported for an arm when the interval lies above 0;
- every alarm scored against the held-out label overall and within each rate (:func:`.detection.score_alarm`).

Anything else the report shows is exploratory and says so: the phenomena, each beside the paper's description with a
figure (a column per learning rate, the arms overlaid), and the README's block of the comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lld.config import ConfigError
from searchr1_lld.lab.analysis import finite, mean_std, val_em_curve, window_mean
from searchr1_lld.lab.baselines import subjects
from searchr1_lld.lab.claims import clean, replace_readme_block
from searchr1_lld.lab.compact import read_runs
from searchr1_lld.lab.detection import (Alarm, drop_below_start, early_median, held_out_collapse_step,
                                        newcombe_difference, ratio_over_early, score_alarm, wilson)
from searchr1_lld.lab.intervals import clustered_bootstrap
from searchr1_lld.lab.methods import METHODS, REPO_ROOT
from searchr1_lld.lab.plots import plot_grid
from searchr1_lld.lab.report import fmt
from searchr1_lld.instruments.phases import reward_collapse_step

PREREG_FILE = "docs/lab/preregistration.json"
CONTROL = "grpo"  # the arm every hypothesis compares against
README_BEGIN = "<!-- prereg-results:begin (python -m searchr1_lld.lab prereg-report --readme README.md) -->"
README_END = "<!-- prereg-results:end -->"

# The paper's phenomena, one figure each: file stem -> (the paper's description, the curves drawn: stem of
# plots.CURVES -> panel title). The numbers beside them are the phenomena table's.
PHENOMENA_FIGURES: dict[str, tuple[str, dict[str, str]]] = {
    "likelihood": ("correct responses' likelihood stagnates while reward rises, then decays; below a threshold the "
                   "collapse accelerates; the negative gradients of low-likelihood incorrect responses dominate and, "
                   "through prefixes they share with correct ones, drag the correct responses down",
                   {"correct_logp": "correct responses (sampled)", "probe_logp": "probe set (fixed correct responses)",
                    "incorrect_logp": "incorrect responses (sampled)"}),
    "entropy": ("entropy explodes in the accelerated collapse", {"entropy": "entropy"}),
    "grad_norm": ("the gradient norm explodes in the accelerated collapse",
                  {"grad_norm": "gradient norm, all updates", "grad_norm_signal": "gradient norm, updates with signal"}),
    "valid_searches": ("not a symptom the paper names; LLDS-MA's adaptive answer coefficient reads it",
                       {"valid_searches": "valid searches per response"}),
    "reward": ("reward rises through stagnation and decay, then drops to zero in the collapse",
               {"reward": "training reward", "val_em": "validation EM (the label's curve)"}),
}


def load_preregistration(path: str | Path = REPO_ROOT / PREREG_FILE) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def make_alarm(spec: Mapping[str, Any]) -> Alarm:
    """An :class:`.detection.Alarm` from its registered ``spec``: ``{"name", "kind", "key", ...}`` with kind
    ``drop_below_start`` (``drop``, optional ``reference_key`` / ``start_points``) or ``ratio_over_early``
    (``ratio``, ``early_steps``). The alarm refuses a collapse signal among the keys it reads."""
    kind, key = spec["kind"], spec["key"]
    if kind == "drop_below_start":
        ref = spec.get("reference_key")
        rule = drop_below_start(key, float(spec["drop"]), int(spec.get("start_points", 1)), reference_key=ref)
        reads = {key} | ({ref} if ref else set())
    elif kind == "ratio_over_early":
        rule = ratio_over_early(key, float(spec["ratio"]), int(spec["early_steps"]))
        reads = {key}
    else:
        raise ValueError(f"alarm {spec.get('name')!r}: unknown kind {kind!r} (drop_below_start, ratio_over_early)")
    return Alarm(spec["name"], frozenset(reads), spec.get("description", ""), rule)


def warm_val_em(base: Mapping[str, Any]) -> float:
    """The warm start's greedy validation EM from the baselines' file (its answers question by question)."""
    correct = base["splits"]["val"]["correct"]["warm_start"]
    return sum(correct.values()) / len(correct)


def val_curve(records: Sequence[Mapping[str, Any]], warm_em: float) -> list[list[float]]:
    """``[[step, validation EM], ...]`` of a run, starting with the warm start's at step 0."""
    return [[0, warm_em], *val_em_curve(records)]


def _ratio_to_early(records: Sequence[Mapping[str, Any]], key: str, early: int) -> float:
    """Largest value of ``key`` over the median of its first ``early`` finite values (NaN when undefined)."""
    vals = [float(r[key]) for r in records if finite(r.get(key))]
    base = early_median(vals, early)
    return max(vals) / base if finite(base) and base > 0 else float("nan")


def phenomena(records: Sequence[Mapping[str, Any]], window: int, early_steps: int) -> dict[str, float]:
    """The paper's phenomena in one run: start and end (means of the first / last ``window`` finite values) of the
    sampled correct and incorrect responses' log-likelihood per token, entropy, valid searches and reward; the probe
    set's likelihood before any update of it and at the end; the largest gradient norm over its early median (the
    first ``early_steps`` values), over all updates and over the updates with non-zero advantages."""
    out: dict[str, float] = {}
    for name, key in (("correct_logp", "lld/correct_logp_old_per_token"),
                      ("incorrect_logp", "lld/incorrect_logp_old_per_token"), ("entropy", "actor/entropy"),
                      ("valid_searches", "rollout/valid_searches_mean"), ("reward", "reward/em_mean")):
        out[f"{name}_start"] = window_mean(records, key, "first", window)
        out[f"{name}_end"] = window_mean(records, key, "last", window)
    out["probe_logp_initial"] = window_mean(records, "probe/initial_logp_per_token", "first", 1)
    out["probe_logp_end"] = window_mean(records, "probe/logp_per_token", "last", 1)
    out["grad_norm_max_ratio"] = _ratio_to_early(records, "actor/grad_norm", early_steps)
    out["grad_norm_signal_max_ratio"] = _ratio_to_early(records, "actor/grad_norm_signal", early_steps)
    return out


def run_labels(run: Mapping[str, Any], warm_em: float, label: Mapping[str, Any], alarms: Sequence[Alarm],
               phen: Mapping[str, Any]) -> dict[str, Any]:
    """One run's label, secondary label, alarms and phenomena."""
    records = run["records"]
    curve = val_curve(records, warm_em)
    rewards = [r.get("reward/em_mean") for r in records]
    idx = reward_collapse_step(rewards, ratio=label["reward_ratio"], persist=label["persist"])
    return {"method": run["method"], "lr": run["lr"], "seed": run["seed"], "code": run.get("code"),
            "collapse_step": held_out_collapse_step(curve, warm_em, ratio=label["ratio"], persist=label["persist"]),
            "reward_collapse_step": int(records[idx]["step"]) if idx is not None else None,
            "val_em_curve": curve, "val_em_end": curve[-1][1], "test_em": run["test"]["em"],
            "alarms": {a.name: a.first_step(records) for a in alarms},
            "phenomena": phenomena(records, phen["window"], phen["early_steps"])}


def h1(labels: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Collapse counts per arm and rate; the rates where GRPO collapsed on at least half its seeds; per LLDS arm its
    pooled collapse share there minus GRPO's, with Newcombe's interval; supported when the interval is below 0."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in arms:
        for lr in sorted({r["lr"] for r in labels}):
            mine = [r for r in labels if r["method"] == arm and r["lr"] == lr]
            cells.setdefault(arm, {})[f"{lr:g}"] = wilson(sum(r["collapse_step"] is not None for r in mine), len(mine))
    rates = [lr for lr, c in cells.get(CONTROL, {}).items() if c["n"] and c["k"] >= c["n"] / 2]
    out: dict[str, Any] = {"cells": cells, "rates": rates, "arms": {}}
    if not rates:
        out["verdict"] = "not testable: GRPO's held-out EM collapsed on at least half the seeds at no rate"
        return out
    k0, n0 = (sum(cells[CONTROL][lr][x] for lr in rates) for x in ("k", "n"))
    for arm in arms:
        if arm == CONTROL:
            continue
        k, n = (sum(cells[arm][lr][x] for lr in rates) for x in ("k", "n"))
        d = newcombe_difference(k, n, k0, n0)
        out["arms"][arm] = {"collapsed": k, "runs": n, "grpo_collapsed": k0, "grpo_runs": n0, "difference": d,
                            "supported": d["hi"] is not None and d["hi"] < 0}
    return out


def h2(labels: Sequence[Mapping[str, Any]], alarm: str, lead_k: int) -> dict[str, Any]:
    """The likelihood alarm ``alarm``: among collapsed runs, the share it warned at least ``lead_k`` steps ahead;
    within the rates holding both outcomes, its firing share in collapsed minus non-collapsed runs (supported when
    that interval lies above 0)."""
    collapsed = [r for r in labels if r["collapse_step"] is not None]
    early = sum(r["alarms"][alarm] is not None and r["collapse_step"] - r["alarms"][alarm] >= lead_k for r in collapsed)
    mixed = [lr for lr in sorted({r["lr"] for r in labels})
             if len({r["collapse_step"] is None for r in labels if r["lr"] == lr}) == 2]
    inside = [r for r in labels if r["lr"] in mixed]
    fired_c = [r["alarms"][alarm] is not None for r in inside if r["collapse_step"] is not None]
    fired_q = [r["alarms"][alarm] is not None for r in inside if r["collapse_step"] is None]
    d = newcombe_difference(sum(fired_c), len(fired_c), sum(fired_q), len(fired_q))
    return {"alarm": alarm, "lead_k": lead_k, "warned_k_ahead": wilson(early, len(collapsed)),
            "mixed_rates": [f"{lr:g}" for lr in mixed], "fired_in_collapsed": wilson(sum(fired_c), len(fired_c)),
            "fired_in_not_collapsed": wilson(sum(fired_q), len(fired_q)), "difference": d,
            "supported": d["lo"] is not None and d["lo"] > 0,
            "verdict": None if mixed else "not testable: no rate holds both collapsed and non-collapsed runs"}


def h3(raw: Sequence[Mapping[str, Any]], base: Mapping[str, Any], arms: Sequence[str],
       rates: Sequence[str]) -> dict[str, Any]:
    """Single-hop test EM of each LLDS arm minus GRPO over the H1 ``rates`` (every seed of each), paired bootstrap
    over the test split's subjects and the runs."""
    questions = base["splits"]["test"]["questions"]
    one_hop = [q["id"] for q in questions if q["hops"] == 1]
    clusters = subjects(questions)

    def correct(arm: str) -> list[dict[str, float]]:
        return [r["test"]["correct"] for r in raw if r["method"] == arm and f"{r['lr']:g}" in rates]

    out: dict[str, Any] = {"rates": list(rates), "questions": len(one_hop), "arms": {}}
    for arm in arms:
        if arm == CONTROL or not rates:
            continue
        ci = clustered_bootstrap(correct(arm), one_hop, clusters, other=correct(CONTROL))
        out["arms"][arm] = {"difference": ci, "supported": ci["lo"] is not None and ci["lo"] > 0}
    if not rates:
        out["verdict"] = "not testable: no H1 rate"
    return out


def phenomena_table(labels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per method and rate: the mean over its seeds of every phenomenon (:func:`phenomena`)."""
    rows = []
    for arm in dict.fromkeys(r["method"] for r in labels):
        for lr in sorted({r["lr"] for r in labels if r["method"] == arm}):
            mine = [r["phenomena"] for r in labels if r["method"] == arm and r["lr"] == lr]
            mean = {k: mean_std([p[k] for p in mine])[0] for k in mine[0]}
            rows.append({"method": arm, "lr": lr, "runs": len(mine), **mean})
    return rows


def analyse(prereg: Mapping[str, Any], runs_dir: str | Path) -> dict[str, Any]:
    """The registered analysis of the compact results in ``runs_dir`` (see the module docstring)."""
    raw, base = read_runs(runs_dir)
    if base is None:
        raise FileNotFoundError(f"{runs_dir} holds no baselines file: the warm start's validation EM defines the label")
    grid = prereg["grid"]
    planned = len(grid["methods"]) * len(grid["lrs"]) * len(grid["seeds"])
    alarms = [make_alarm(spec) for spec in prereg["alarms"]]
    warm = warm_val_em(base)
    labels = [run_labels(r, warm, prereg["label"], alarms, prereg["phenomena"]) for r in raw]
    hyp = prereg["hypotheses"]
    one = h1(labels, grid["methods"])
    return {"registration": prereg["registration"], "warm_start_val_em": warm,
            "collapse_bound": prereg["label"]["ratio"] * warm, "runs_finished": len(raw), "runs_planned": planned,
            "complete": len(raw) >= planned, "H1": one, "H2": h2(labels, hyp["H2"]["alarm"], hyp["H2"]["lead_k"]),
            "H3": h3(raw, base, grid["methods"], one["rates"]),
            "alarms": [score_alarm([{**lab, "records": r["records"]} for lab, r in zip(labels, raw)], a)
                       for a in alarms],
            "phenomena": phenomena_table(labels), "runs": labels}


def _share(w: Mapping[str, Any]) -> str:
    """``k/n = p [lo, hi]`` of a :func:`.detection.wilson` cell."""
    if not w.get("n"):
        return "-"
    return f"{w['k']}/{w['n']} = {w['value']:.2f} [{w['lo']:.2f}, {w['hi']:.2f}]"


def _diff(d: Mapping[str, Any]) -> str:
    return "-" if d.get("value") is None else f"{d['value']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def _runs_lines(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[str]:
    """The report's runs: validation EM at the end per arm (in the order of ``arms``) and rate (mean and sd over
    seeds), then every run's validation curve (from the warm start's at step 0), its collapse steps and test EM."""
    lrs = sorted({r["lr"] for r in runs})
    lines = ["", "## Validation EM at the end, per arm and rate (mean ± sd over seeds; exploratory description)", "",
             "| arm | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for arm in arms:
        cells = []
        for lr in lrs:
            mu, sd, n = mean_std([r["val_em_end"] for r in runs if r["method"] == arm and r["lr"] == lr])
            cells.append(f"{fmt(mu, 3)} ± {fmt(sd, 3)} ({n})" if n else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "## Runs", "", "| arm | lr | seed | validation EM by step | held-out collapse | reward collapse "
              "| test EM |", "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["lr"], list(arms).index(r["method"]), r["seed"])):
        curve = " ".join(f"{int(step)}:{fmt(em, 2)}" for step, em in r["val_em_curve"])
        lines.append(f"| {r['method']} | {r['lr']:g} | {r['seed']} | {curve} | {r['collapse_step'] or '-'} | "
                     f"{r['reward_collapse_step'] or '-'} | {fmt(r['test_em'], 3)} |")
    return lines


def _phenomena_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's phenomena: the table of :func:`phenomena_table`'s ``rows``, then each phenomenon beside the
    paper's description with its figure (:data:`PHENOMENA_FIGURES`)."""
    lines = ["", "## Phenomena per arm and rate (means over seeds; exploratory description)", "",
             "| arm | lr | runs | probe logp initial -> end | correct logp start -> end | incorrect logp start -> end "
             "| entropy start -> end | grad norm max / early (all; with signal) | valid searches start -> end "
             "| reward start -> end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in rows:
        pair = lambda a, b: f"{fmt(p[a], 2)} -> {fmt(p[b], 2)}"  # noqa: E731
        lines.append(f"| {p['method']} | {p['lr']:g} | {p['runs']} | {pair('probe_logp_initial', 'probe_logp_end')} | "
                     f"{pair('correct_logp_start', 'correct_logp_end')} | "
                     f"{pair('incorrect_logp_start', 'incorrect_logp_end')} | {pair('entropy_start', 'entropy_end')} | "
                     f"{fmt(p['grad_norm_max_ratio'], 1)}; {fmt(p['grad_norm_signal_max_ratio'], 1)} | "
                     f"{pair('valid_searches_start', 'valid_searches_end')} | {pair('reward_start', 'reward_end')} |")
    lines += ["", "## The paper's phenomena beside this grid's (exploratory description)", "",
              "Each figure: a column per learning rate, the arms overlaid (thin: one seed, bold: the mean over seeds); "
              "its numbers are the table above.", "", "| phenomenon | the paper's description | figure |",
              "|---|---|---|"]
    lines += [f"| {stem.replace('_', ' ')} | {desc} | [{stem}.png]({stem}.png) |"
              for stem, (desc, _) in PHENOMENA_FIGURES.items()]
    lines += [""] + [f"![{stem.replace('_', ' ')}]({stem}.png)" for stem in PHENOMENA_FIGURES]
    return lines


def render(s: Mapping[str, Any]) -> str:
    """The registered analysis as markdown (every figure from :func:`analyse`'s summary)."""
    reg = s["registration"]
    lines = ["# The pre-registered death-spiral comparison: results", "",
             f"Registered in `docs/lab/preregistration.md` (analysis code at commit `{reg.get('analysis_commit')}`); "
             f"rebuilt by `{reg['analysis_command']}`. {s['runs_finished']} of {s['runs_planned']} runs finished"
             + ("." if s["complete"] else ": every figure below is interim until the grid is complete."), "",
             f"Held-out label: validation EM at or below {fmt(s['collapse_bound'], 3)} (0.3 x the warm start's "
             f"{fmt(s['warm_start_val_em'], 3)}) at every evaluation from some step to the end.", "",
             f"**{spiral_statement(s)}**", "",
             "## H1: collapse share per arm and learning rate (held-out label)", "",
             "| arm | " + " | ".join(f"lr {lr}" for lr in next(iter(s["H1"]["cells"].values()), {})) + " |",
             "|---|" + "---|" * len(next(iter(s["H1"]["cells"].values()), {}))]
    for arm, cells in s["H1"]["cells"].items():
        lines.append(f"| {arm} | " + " | ".join(_share(c) for c in cells.values()) + " |")
    one = s["H1"]
    lines.append("")
    if one.get("verdict"):
        lines.append(f"H1 {one['verdict']}.")
    for arm, a in one["arms"].items():
        lines.append(f"- {arm} minus GRPO at lr {', '.join(one['rates'])}: {a['collapsed']}/{a['runs']} vs "
                     f"{a['grpo_collapsed']}/{a['grpo_runs']}, difference {_diff(a['difference'])}: "
                     f"{'supported' if a['supported'] else 'not supported'}.")
    two = s["H2"]
    lines += ["", f"## H2: the `{two['alarm']}` alarm", "",
              f"Collapsed runs warned at least {two['lead_k']} steps ahead: {_share(two['warned_k_ahead'])}. "
              f"Within the rates holding both outcomes ({', '.join(two['mixed_rates']) or 'none'}): fired in "
              f"{_share(two['fired_in_collapsed'])} of collapsed runs, {_share(two['fired_in_not_collapsed'])} of the "
              f"others, difference {_diff(two['difference'])}: "
              + (two["verdict"] if two["verdict"] else "supported" if two["supported"] else "not supported") + "."]
    three = s["H3"]
    lines += ["", "## H3: single-hop test EM, LLDS arm minus GRPO at the H1 rates", ""]
    if three.get("verdict"):
        lines.append(f"H3 {three['verdict']}.")
    for arm, a in three["arms"].items():
        ci = a["difference"]
        lines.append(f"- {arm}: {fmt(ci['mean'], 3)} [{fmt(ci['lo'], 3)}, {fmt(ci['hi'], 3)}] over {ci['clusters']} "
                     f"subjects: {'supported' if a['supported'] else 'not supported'}.")
    lines += ["", "## Alarms against the held-out label (overall; within each rate)", "",
              "| alarm | reads | where | collapsed | sensitivity [95 % Wilson] | specificity [95 % Wilson] | leads |",
              "|---|---|---|---|---|---|---|"]
    for a in s["alarms"]:
        for where, sc in [("all rates", a["overall"]), *((f"lr {lr}", v) for lr, v in a["by_lr"].items())]:
            lines.append(f"| {a['alarm']} | {', '.join(a['reads'])} | {where} | {sc['collapsed']}/{sc['runs']} | "
                         f"{_share(sc['sensitivity'])} | {_share(sc['specificity'])} | "
                         f"{', '.join(map(str, sc['lead_steps'])) or '-'} |")
    lines += _phenomena_lines(s["phenomena"]) + _runs_lines(s["runs"], list(s["H1"]["cells"]))
    return "\n".join(lines) + "\n"


def write_figures(prereg: Mapping[str, Any], runs_dir: str | Path, out_dir: str | Path,
                  collapse_bound: float) -> list[Path]:
    """One PNG per phenomenon of :data:`PHENOMENA_FIGURES` in ``out_dir`` (a column per registered learning rate,
    the arms overlaid; the validation-EM panels with the label's bound); the paths written."""
    runs, _ = read_runs(runs_dir)
    grid = prereg["grid"]
    methods = [METHODS[m] for m in grid["methods"]]
    refs = {"eval/val_em": (collapse_bound, "collapse bound")}
    return [plot_grid(runs, methods, grid["lrs"], Path(out_dir) / f"{stem}.png", refs, rows=rows)
            for stem, (_, rows) in PHENOMENA_FIGURES.items()]


def spiral_statement(s: Mapping[str, Any]) -> str:
    """One plain sentence: did any run collapse on held-out EM, and did the H2 alarm (the likelihood of correct
    responses falling) come at least ``lead_k`` steps first, the order of the paper's death spiral."""
    two = s["H2"]
    collapsed = [r for r in s["runs"] if r["collapse_step"] is not None]
    led = [r for r in collapsed if r["alarms"].get(two["alarm"]) is not None
           and r["collapse_step"] - r["alarms"][two["alarm"]] >= two["lead_k"]]
    where = "" if s["complete"] else f" (so far, {s['runs_finished']} of {s['runs_planned']} runs)"
    if not collapsed:
        return (f"No run's validation EM collapsed{where}" + (": at these learning rates the sandbox did not "
                "reproduce the death spiral." if s["complete"] else "."))
    if not led:
        return (f"{len(collapsed)} runs collapsed on validation EM{where}, none after the `{two['alarm']}` alarm came "
                f"{two['lead_k']} or more steps ahead: collapse without the paper's lazy likelihood displacement "
                f"before it.")
    return (f"{len(collapsed)} runs collapsed on validation EM{where}; in {len(led)} of them the `{two['alarm']}` "
            f"alarm (the likelihood of correct responses falling) came {two['lead_k']} or more steps first, the "
            f"paper's order.")


def readme_block(s: Mapping[str, Any]) -> str:
    """The README's block of the registered comparison: what has finished, the collapse counts and each
    hypothesis's verdict (all from :func:`analyse`'s summary)."""
    lines = [f"{s['runs_finished']} of {s['runs_planned']} runs finished"
             + (" (interim: no verdict below is final until the grid is complete)." if not s["complete"] else "."),
             spiral_statement(s)]
    cells = s["H1"]["cells"]
    lines.append("Held-out collapses (validation EM at or below 0.3 x the warm start's to the end) per arm at "
                 "learning rates " + ", ".join(next(iter(cells.values()), {})) + ": " + "; ".join(
                     f"{arm} " + ", ".join(f"{c['k']}/{c['n']}" if c.get("n") else "-" for c in by_lr.values())
                     for arm, by_lr in cells.items()) + ".")
    one = s["H1"]
    verdict = one.get("verdict") or "; ".join(
        f"{arm} minus GRPO {_diff(a['difference'])}: {'supported' if a['supported'] else 'not supported'}"
        for arm, a in one["arms"].items())
    lines.append(f"- H1 (LLDS collapses less often than GRPO where GRPO collapses): {verdict}.")
    two = s["H2"]
    lines.append(f"- H2 (the probe likelihood falls before a collapse): " + (
        two["verdict"] if two["verdict"] else
        f"warned {two['lead_k']}+ steps ahead in {_share(two['warned_k_ahead'])} collapsed runs; firing share "
        f"difference {_diff(two['difference'])}: {'supported' if two['supported'] else 'not supported'}") + ".")
    three = s["H3"]
    lines.append("- H3 (LLDS keeps single-hop skill GRPO loses): " + (three.get("verdict") or "; ".join(
        f"{arm} minus GRPO {fmt(a['difference']['mean'], 3)} [{fmt(a['difference']['lo'], 3)}, "
        f"{fmt(a['difference']['hi'], 3)}]: {'supported' if a['supported'] else 'not supported'}"
        for arm, a in three["arms"].items())) + ".")
    return "\n".join(lines) + "\n"


def write_report(prereg_path: str | Path, runs_dir: str | Path, out_dir: str | Path,
                 readme: str | Path | None = None) -> dict[str, Any]:
    """``out_dir/summary.json``, ``out_dir/README.md`` and the phenomena's figures of the registered analysis;
    with ``readme``, that README's block of the comparison replaced (:func:`readme_block`). Returns the summary."""
    prereg = load_preregistration(prereg_path)
    summary = clean(analyse(prereg, runs_dir))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "README.md").write_text(render(summary))
    write_figures(prereg, runs_dir, out, summary["collapse_bound"])
    if readme is not None:
        path = Path(readme)
        path.write_text(replace_readme_block(path.read_text(), readme_block(summary), README_BEGIN, README_END))
    return summary


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lld.lab prereg-report", description=__doc__.split("\n\n")[0])
    p.add_argument("--prereg", default=str(REPO_ROOT / PREREG_FILE), help="the registration's JSON")
    p.add_argument("--runs", help="the grid's compact results (default: the registration's runs_dir)")
    p.add_argument("--out", help="report dir (default: the registration's report_dir)")
    p.add_argument("--readme", help="also replace this README's block of the comparison")
    args = p.parse_args(list(argv))
    reg = load_preregistration(args.prereg)["registration"]
    s = write_report(args.prereg, args.runs or REPO_ROOT / reg["runs_dir"], args.out or REPO_ROOT / reg["report_dir"],
                     args.readme)
    print(f"{s['runs_finished']} of {s['runs_planned']} runs; report in {args.out or reg['report_dir']}")
    return 0


def _git(repo: str | Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


def registration_violations(repo: str | Path, prereg_file: str, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the runs cannot count as pre-registered, one sentence each (empty: they all can). ``prereg_file``: the
    registration's path in the git repository ``repo``; ``runs``: compact run records (their ``code``).

    The registration's commit is the last commit that changed ``prereg_file``; checked: the file in the working tree
    is that commit's, and its recorded ``analysis_commit`` is an ancestor of it; every run records the clean commit it
    started from, which descends from the registration's commit and holds the registration as it is (a run started
    before the registration took its present form, or from a dirty tree, is named)."""
    last = _git(repo, "log", "-1", "--format=%H", "--", prereg_file).stdout.strip()
    if not last:
        return [f"{prereg_file} is not committed"]
    now = (Path(repo) / prereg_file).read_text()
    out: list[str] = []
    if _git(repo, "show", f"{last}:{prereg_file}").stdout != now:
        out.append(f"{prereg_file} has uncommitted changes")
    analysis = json.loads(now)["registration"].get("analysis_commit")
    if not analysis or _git(repo, "merge-base", "--is-ancestor", str(analysis), last).returncode != 0:
        out.append(f"analysis_commit {analysis!r} is not an ancestor of the registration's commit {last[:10]}")
    for run in runs:
        name = f"{run.get('method')}-lr{run.get('lr')}-seed{run.get('seed')}"
        code = run.get("code") or {}
        commit = code.get("commit")
        if not commit:
            out.append(f"{name} records no commit")
            continue
        if code.get("dirty"):
            out.append(f"{name} started from a tree with uncommitted changes ({commit[:10]})")
        if _git(repo, "merge-base", "--is-ancestor", last, commit).returncode != 0:
            out.append(f"{name} started from {commit[:10]}, which does not descend from the registration's commit "
                       f"{last[:10]}")
        elif _git(repo, "show", f"{commit}:{prereg_file}").stdout != now:
            out.append(f"{name} started from {commit[:10]}, whose {prereg_file} differs from the registration's")
    return out


def registration_of(compact_dir: str | Path, prereg_path: str | Path = REPO_ROOT / PREREG_FILE
                    ) -> dict[str, Any] | None:
    """The registration whose ``runs_dir`` is ``compact_dir`` (its ``registration`` block), or None."""
    if not Path(prereg_path).is_file():
        return None
    reg = load_preregistration(prereg_path)["registration"]
    return reg if Path(compact_dir).resolve() == (REPO_ROOT / reg["runs_dir"]).resolve() else None


def check_registered(compact_dir: str | Path, prereg_path: str | Path = REPO_ROOT / PREREG_FILE) -> None:
    """Refuse (ConfigError) to run a grid into the registration's ``runs_dir`` before its status is ``registered``:
    a run of a draft registration could not count as pre-registered. Any other directory passes."""
    reg = registration_of(compact_dir, prereg_path)
    if reg is not None and reg.get("status") != "registered":
        raise ConfigError(f"{reg['runs_dir']} holds the runs of the registration {prereg_path}, whose status is "
                          f"{reg.get('status')!r}: register it (status 'registered') before its grid runs")
