"""The pre-registered comparison's report: the registered analysis (:mod:`.prereg`) as markdown with one figure per
phenomenon beside the paper's description, and its block of docs/lab/results.md.

    python -m searchr1_lab prereg-report [--prereg docs/lab/preregistration.json] [--runs DIR] [--out DIR]
                                             [--readme docs/lab/results.md]

Everything beyond the hypotheses' figures is exploratory description and says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import mean_std
from searchr1_lab.comparison.claims import clean, replace_readme_block
from searchr1_lab.compact import read_runs
from searchr1_lab.methods import ARMS, REPO_ROOT
from searchr1_lab.plots import plot_grid
from searchr1_lab.prereg.registration import CONTROL, PREREG_FILE, analyse, load_preregistration
from searchr1_lab.registered.report import summary_json
from searchr1_lab.report import analysis_change_lines, fmt
from searchr1_lab.studies import RESULTS_PAGE, analysis_changes, current_command, late_readings

README_BEGIN = f"<!-- prereg-results:begin (python -m searchr1_lab prereg-report --readme {RESULTS_PAGE}) -->"
README_END = "<!-- prereg-results:end -->"
# The registered analysis files (``searchr1_lld/lab/prereg.py``, ``detection.py``) were later split into this package
# (``searchr1_lld/lab/prereg/``, ``searchr1_lab/prereg/`` today): its files hold the registered analysis since, so
# the listed changes are those of the registered files and of the package (its report code included).
ANALYSIS_PACKAGE = "searchr1_lld/lab/prereg/"

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
                  {"grad_norm": "gradient norm, all updates",
                   "grad_norm_signal": "gradient norm, updates with signal"}),
    "valid_searches": ("not a symptom the paper names; LLDS-MA's adaptive answer coefficient reads it",
                       {"valid_searches": "valid searches per response"}),
    "reward": ("reward rises through stagnation and decay, then drops to zero in the collapse",
               {"reward": "training reward", "val_em": "validation EM (the label's curve)"}),
}


def _share(w: Mapping[str, Any]) -> str:
    """``k/n = p [lo, hi]`` of a :func:`searchr1_lab.stats.proportions.wilson` cell."""
    if not w.get("n"):
        return "-"
    return f"{w['k']}/{w['n']} = {w['value']:.2f} [{w['lo']:.2f}, {w['hi']:.2f}]"


def _diff(d: Mapping[str, Any]) -> str:
    return "-" if d.get("value") is None else f"{d['value']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


NO_RUNS_YET = "no run at these rates yet"


def _h1_arm(a: Mapping[str, Any]) -> str:
    """An H1 arm's difference and verdict, or that it has no run at the H1 rates yet."""
    if not a["runs"]:
        return NO_RUNS_YET
    return f"{_diff(a['difference'])}: {'supported' if a['supported'] else 'not supported'}"


def _h3_arm(a: Mapping[str, Any]) -> str:
    """An H3 arm's mean difference with its interval and verdict, or that it has no run at the H1 rates yet."""
    ci = a["difference"]
    if ci.get("mean") is None:
        return NO_RUNS_YET
    return (f"{fmt(ci['mean'], 3)} [{fmt(ci['lo'], 3)}, {fmt(ci['hi'], 3)}] over {ci['clusters']} subjects: "
            f"{'supported' if a['supported'] else 'not supported'}")


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


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
             f"rebuilt by `{current_command(reg['analysis_command'])}`. {s['runs_finished']} of {s['runs_planned']} runs finished"
             + ("." if s["complete"] else ": every figure below is interim until the grid is complete."), "",
             *analysis_change_lines(s.get("analysis_changes"), s.get("late_readings")),
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
                     f"{a['grpo_collapsed']}/{a['grpo_runs']}, difference {_h1_arm(a)}.")
    two = s["H2"]
    lines += ["", f"## H2: the `{two['alarm']}` alarm", "",
              f"Collapsed runs warned at least {two['lead_k']} steps ahead: {_share(two['warned_k_ahead'])}. "
              f"Within the rates holding both outcomes ({', '.join(two['mixed_rates']) or 'none'}): fired in "
              f"{_share(two['fired_in_collapsed'])} of collapsed runs, {_share(two['fired_in_not_collapsed'])} of the "
              f"others, difference {_diff(two['difference'])}: "
              + (two["verdict"] if two["verdict"] else "supported" if two["supported"] else "not supported") + "."]
    three = s["H3"]
    lines += ["", "## H3: single-hop test EM, LLDS arm minus GRPO at the H1 rates", ""]
    levels = s.get("single_hop_test_em")
    if levels:
        lines.append(f"Levels (descriptive): the warm start scores {levels['warm_start']:.3f} on the single-hop test "
                     "questions; at the H1 rates the arms' means are " + ", ".join(
                         f"{arm} {v:.3f}" for arm, v in levels["arms"].items()) + ". Every arm loses single-hop "
                     "skill there; H3 asks which loses less.\n")
    if three.get("verdict"):
        lines.append(f"H3 {three['verdict']}.")
    lines += [f"- {arm}: {_h3_arm(a)}." for arm, a in three["arms"].items()]
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
    methods = [ARMS[m] for m in grid["methods"]]
    refs = {"eval/val_em": (collapse_bound, "collapse bound")}
    return [plot_grid(runs, methods, grid["lrs"], Path(out_dir) / f"{stem}.png", refs, rows=rows)
            for stem, (_, rows) in PHENOMENA_FIGURES.items()]


def spiral_statement(s: Mapping[str, Any]) -> str:
    """One plain sentence: did any run collapse on held-out EM, and did the H2 alarm (the likelihood of correct
    responses falling) come at least ``lead_k`` steps first, the order of the paper's death spiral (H2's
    ``warned_k_ahead``: k of the n collapsed runs)."""
    two = s["H2"]
    collapsed, led = two["warned_k_ahead"]["n"], two["warned_k_ahead"]["k"]
    where = "" if s["complete"] else f" (so far, {s['runs_finished']} of {s['runs_planned']} runs)"
    if not collapsed:
        return (f"No run's validation EM collapsed{where}" + (": at these learning rates the sandbox did not "
                "reproduce the death spiral." if s["complete"] else "."))
    if not led:
        return (f"{_runs(collapsed)} collapsed on validation EM{where}, none after the `{two['alarm']}` alarm came "
                f"{two['lead_k']} or more steps ahead: collapse without the paper's lazy likelihood displacement "
                f"before it.")
    return (f"{_runs(collapsed)} collapsed on validation EM{where}; in {led} of them the `{two['alarm']}` "
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
        f"{arm} minus GRPO {_h1_arm(a)}" for arm, a in one["arms"].items())
    lines.append(f"- H1 (LLDS collapses less often than GRPO where GRPO collapses): {verdict}.")
    two = s["H2"]
    lines.append("- H2 (the probe likelihood falls before a collapse): " + (
        two["verdict"] if two["verdict"] else
        f"warned {two['lead_k']}+ steps ahead in {_share(two['warned_k_ahead'])} collapsed runs; firing share "
        f"difference {_diff(two['difference'])}: {'supported' if two['supported'] else 'not supported'}") + ".")
    three = s["H3"]
    lines.append(f"- H3 (LLDS loses less single-hop skill than GRPO{_levels_text(s.get('single_hop_test_em'))}): "
                 + (three.get("verdict") or "; ".join(f"{arm} minus GRPO {_h3_arm(a)}"
                                                      for arm, a in three["arms"].items())) + ".")
    return "\n".join(lines) + "\n"


def single_hop_levels(runs_dir: str | Path, rates: Sequence[str]) -> dict[str, Any]:
    """The levels behind H3's differences (descriptive, not registered): the warm start's single-hop test EM and
    each arm's mean over its runs at the H1 ``rates``."""
    raw, base = read_runs(runs_dir)
    one_hop = [q["id"] for q in base["splits"]["test"]["questions"] if q["hops"] == 1]

    def em(correct: Mapping[str, Any]) -> float:
        return sum(correct[i] for i in one_hop) / len(one_hop)

    arms: dict[str, list[float]] = {}
    for r in raw:
        if f"{r['lr']:g}" in rates:
            arms.setdefault(r["method"], []).append(em(r["test"]["correct"]))
    return {"warm_start": em(base["splits"]["test"]["correct"]["warm_start"]), "rates": list(rates),
            "arms": {arm: sum(v) / len(v) for arm, v in arms.items()}}


def _levels_text(levels: Mapping[str, Any] | None) -> str:
    """``; from the warm start's 0.55, GRPO ends at 0.01 and the LLDS arms at 0.14-0.17`` (empty without levels)."""
    if not levels or CONTROL not in levels["arms"]:
        return ""
    others = [v for arm, v in levels["arms"].items() if arm != CONTROL]
    span = f"{min(others):.2f}-{max(others):.2f}" if others else "-"
    return (f"; from the warm start's {levels['warm_start']:.2f}, GRPO ends at {levels['arms'][CONTROL]:.2f} and the "
            f"LLDS arms at {span} at lr {', '.join(levels['rates'])}")


def write_report(prereg_path: str | Path, runs_dir: str | Path, out_dir: str | Path,
                 readme: str | Path | None = None) -> dict[str, Any]:
    """``out_dir/summary.json``, ``out_dir/README.md`` and the phenomena's figures of the registered analysis;
    with ``readme``, that README's block of the comparison replaced (:func:`readme_block`). Returns the summary
    (full precision; the file rounds it, :func:`searchr1_lab.registered.report.summary_json`)."""
    prereg = load_preregistration(prereg_path)
    summary = clean(analyse(prereg, runs_dir))
    summary["single_hop_test_em"] = single_hop_levels(runs_dir, summary["H3"]["rates"])
    block = prereg["registration"]
    summary["analysis_changes"] = analysis_changes({**block, "analysis_code": [*block.get("analysis_code", []),
                                                                              ANALYSIS_PACKAGE]},
                                                   report_module=__name__)
    summary["late_readings"] = late_readings(block)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(summary_json(summary))
    (out / "README.md").write_text(render(summary))
    write_figures(prereg, runs_dir, out, summary["collapse_bound"])
    if readme is not None:
        path = Path(readme)
        path.write_text(replace_readme_block(path.read_text(), readme_block(summary), README_BEGIN, README_END))
    return summary


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lab prereg-report", description=__doc__.split("\n\n")[0])
    p.add_argument("--prereg", default=str(REPO_ROOT / PREREG_FILE), help="the registration's JSON")
    p.add_argument("--runs", help="the grid's compact results (default: the registration's runs_dir)")
    p.add_argument("--out", help="report dir (default: the registration's report_dir)")
    p.add_argument("--readme", help=f"also replace this page's block of the comparison (the committed one: "
                                    f"{RESULTS_PAGE})")
    args = p.parse_args(list(argv))
    reg = load_preregistration(args.prereg)["registration"]
    s = write_report(args.prereg, args.runs or REPO_ROOT / reg["runs_dir"], args.out or REPO_ROOT / reg["report_dir"],
                     args.readme)
    print(f"{s['runs_finished']} of {s['runs_planned']} runs; report in {args.out or reg['report_dir']}")
    return 0
