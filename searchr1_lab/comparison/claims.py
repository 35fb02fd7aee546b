"""The comparison's claims, rebuilt from the committed compact results alone (``docs/lab/runs/``, :mod:`.compact`):

    python -m searchr1_lab report --runs docs/lab/runs --out docs/lab --readme docs/lab/results.md

writes ``OUT/summary.json`` and ``OUT/README.md`` and replaces the results page's block between :data:`README_BEGIN` and
:data:`README_END` with :func:`readme_block` (a test checks that the page holds exactly what this computes).

What is computed (pure: compact records in, numbers out)
    per run: the phase detector re-run on its logged series (:func:`.analysis.phase_summary`), its verdict, the reward
    collapse (judged from the reward alone), the first step of every alarm, its final validation EM (the trainer's
    greedy EM on the validation split at the last step) and its test EM, overall and on the not-guessable slice;
    selection: per method, the learning rate with the highest mean final validation EM over its seeds (ties: the
    lower rate); the test split plays no part in it;
    test_em_ci: per method at its selected rate, mean test EM with a 95 % bootstrap interval that resamples the
    questions' subjects (clusters: every question of a drawn subject) and the seeds
    (:func:`searchr1_lab.stats.bootstrap.clustered_bootstrap`), overall and on the not-guessable slice; the difference
    between two methods is paired: one common draw of subjects, each method's seeds drawn on their own;
    stable learning rates: per method, the rates at which no seed's reward collapsed;
    detector: per alarm, sensitivity (collapsed runs alarmed before the collapse), specificity (runs that did not
    collapse and never alarmed) and lead times, over every run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from searchr1_lab.analysis import finite, lld_verdict, phase_summary, trend_summary
from searchr1_lab.baselines import BASELINE_LABELS, BASELINE_NAMES, slice_em, subjects
from searchr1_lab.compact import read_runs
from searchr1_lab.stats.bootstrap import clustered_bootstrap, format_interval
from searchr1_lab.methods import ARMS, REPO_ROOT

README_BEGIN = "<!-- lab-results:begin (python -m searchr1_lab report) -->"
README_END = "<!-- lab-results:end -->"
DESIGN_FILE = "design.json"  # the grid the driver was started with (methods, learning rates, seeds, config)
ALARMS = ("early_warning", "steady_decay", "accelerated_collapse", "collapse_alarm")


def run_claims(run: dict[str, Any], questions: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """What the summary says about one compact run."""
    records = run["records"]
    phases = phase_summary(records, run_steps=run["steps"])
    trend = trend_summary(records)
    val = [(r["step"], r["eval/val_em"]) for r in records if finite(r.get("eval/val_em"))]
    first = phases["first_step"]
    alarms = {"early_warning": phases["warning_steps"][0] if phases["warning_steps"] else None,
              "steady_decay": first["steady_decay"], "accelerated_collapse": first["accelerated_collapse"],
              "collapse_alarm": phases["drawdown_steps"][0] if phases["drawdown_steps"] else None}
    test = run["test"]
    if questions and set(test["correct"]) != {q["id"] for q in questions}:
        raise ValueError(f"run {run['method']}-lr{run['lr']:g}-seed{run['seed']} was tested on other questions than "
                         "the baselines (eval.limit must be 0 in the lab config)")
    sliced = slice_em(test["correct"], questions) if questions else {"all": test["em"], "not_guessable": None}
    gn_first, gn_max = trend["grad_norm_first"], trend["grad_norm_max"]
    return {
        "method": run["method"], "label": run["label"], "seed": run["seed"], "lr": run["lr"], "steps": run["steps"],
        "val_em": val[-1][1] if val else None, "val_curve": [list(v) for v in val],
        "test_em": test["em"], "test_em_not_guessable": sliced["not_guessable"],
        "test_em_single_hop": test.get("em_single_hop"), "test_em_multi_hop": test.get("em_multi_hop"),
        "phases": {"first_step": first, "steps_in": phases["steps_in"], "final": phases["final"]},
        "verdict": lld_verdict(trend, phases), "reward_collapse_step": phases["warning"]["collapse_step"],
        "alarms": alarms,
        "dynamics": {"grad_norm_first": gn_first, "grad_norm_max": gn_max,
                     "grad_norm_max_ratio": gn_max / gn_first if finite(gn_first) and gn_first > 0 else None,
                     "entropy_start": trend["entropy_start"], "entropy_end": trend["entropy_end"],
                     "reward_start": trend["reward_start"], "reward_end": trend["reward_end"],
                     "probe_logp_start": trend["probe_logp_start"], "probe_logp_end": trend["probe_logp_end"]},
        "train_s": run.get("train_s"),
    }


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if finite(v)]
    return sum(vals) / len(vals) if vals else None


def detector_claims(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per alarm, against the reward collapse: sensitivity, specificity, lead times (steps before the collapse)."""
    collapsed = [r for r in runs if r["reward_collapse_step"] is not None]
    calm = [r for r in runs if r["reward_collapse_step"] is None]
    out: dict[str, Any] = {"collapsed_runs": len(collapsed), "runs_without_collapse": len(calm)}
    for alarm in ALARMS:
        leads = [r["reward_collapse_step"] - r["alarms"][alarm] for r in collapsed
                 if r["alarms"][alarm] is not None and r["alarms"][alarm] < r["reward_collapse_step"]]
        quiet = sum(r["alarms"][alarm] is None for r in calm)
        out[alarm] = {"sensitivity": len(leads) / len(collapsed) if collapsed else None,
                      "warned": len(leads), "specificity": quiet / len(calm) if calm else None,
                      "false_alarms": len(calm) - quiet, "lead_steps": sorted(leads)}
    return out


def _design(runs_dir: Path, raw: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The grid the results are measured against: ``design.json`` when the grid wrote one, else what the results
    cover."""
    design_path = runs_dir / DESIGN_FILE
    return json.loads(design_path.read_text()) if design_path.is_file() else {
        "methods": sorted({r["method"] for r in raw}), "lrs": sorted({r["lr"] for r in raw}),
        "seeds": sorted({r["seed"] for r in raw}), "config": None}


def selection_claims(runs: Sequence[dict[str, Any]], design: dict[str, Any], complete: bool) -> dict[str, Any]:
    """Per method and learning rate, the mean final validation EM over the seeds (and how many collapsed); per
    method, the rate chosen on it, once the grid is ``complete``."""
    selection: dict[str, Any] = {"rule": "per method, the learning rate with the highest mean final validation EM "
                                         "over its seeds (ties: the lower rate); test EM plays no part",
                                 "complete": complete, "grid": {}, "chosen": {}}
    for m in design["methods"]:
        cells = []
        for lr in design["lrs"]:
            mine = [r for r in runs if r["method"] == m and r["lr"] == lr]
            cells.append({"lr": lr, "seeds": [r["seed"] for r in mine], "val_em": _mean([r["val_em"] for r in mine]),
                          "reward_collapsed": sum(r["reward_collapse_step"] is not None for r in mine)})
        selection["grid"][m] = cells
        scored = [c for c in cells if c["val_em"] is not None]
        if scored and complete:  # nothing is chosen on a part of the grid
            best = max(scored, key=lambda c: (c["val_em"], -c["lr"]))
            selection["chosen"][m] = {"lr": best["lr"], "val_em": best["val_em"], "seeds": best["seeds"]}
    return selection


def held_out_claims(raw: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], seeds: Sequence[int],
                chosen: dict[str, dict[str, Any]], test_ids: list[str], slice_ids: list[str],
                clusters: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Test EM with subject-clustered bootstrap intervals of each method at its ``chosen`` rate (all questions, the
    not-guessable slice; ``clusters``: question id -> subject), and, with two methods, the paired difference of the
    second minus the first."""
    raw_by = {(r["method"], r["lr"], r["seed"]): r for r in raw}

    def correct_at(m: str, lr: float) -> list[dict[str, float]]:
        return [raw_by[(m, lr, s)]["test"]["correct"] for s in seeds if (m, lr, s) in raw_by]

    test_em_ci: dict[str, Any] = {}
    for m, ch in chosen.items():
        mine = [r for r in runs if r["method"] == m and r["lr"] == ch["lr"]]
        test_em_ci[m] = {"lr": ch["lr"], "per_seed": {str(r["seed"]): r["test_em"] for r in mine},
                         "all": clustered_bootstrap(correct_at(m, ch["lr"]), test_ids, clusters),
                         "not_guessable": clustered_bootstrap(correct_at(m, ch["lr"]), slice_ids, clusters)}
    difference = None
    if len(chosen) == 2:
        (a, la), (b, lb) = ((m, chosen[m]["lr"]) for m in reversed(list(chosen)))
        difference = {"of": a, "minus": b, **{
            name: clustered_bootstrap(correct_at(a, la), ids, clusters, other=correct_at(b, lb))
            for name, ids in (("all", test_ids), ("not_guessable", slice_ids))}}
    return test_em_ci, difference


def build_summary(runs_dir: str | Path) -> dict[str, Any]:
    """The summary of every compact result in ``runs_dir`` (see the module docstring)."""
    runs_dir = Path(runs_dir)
    raw, base = read_runs(runs_dir)
    design = _design(runs_dir, raw)
    questions = {s: v["questions"] for s, v in (base or {}).get("splits", {}).items()}
    runs = sorted((run_claims(r, questions.get("test")) for r in raw),
                  key=lambda r: (design["methods"].index(r["method"]) if r["method"] in design["methods"] else 99,
                                 r["lr"], r["seed"]))
    expected = len(design["methods"]) * len(design["lrs"]) * len(design["seeds"])
    complete = len(runs) >= expected and base is not None
    selection = selection_claims(runs, design, complete)
    test_ids = [q["id"] for q in questions.get("test", [])]
    slice_ids = [q["id"] for q in questions.get("test", []) if not q["train_answer"]]
    test_em_ci, difference = held_out_claims(raw, runs, design["seeds"], selection["chosen"], test_ids, slice_ids,
                                             subjects(questions.get("test", [])))
    stable = {m: [c["lr"] for c in selection["grid"][m] if c["seeds"] and not c["reward_collapsed"]]
              for m in design["methods"]}
    baselines = {split: {name: slice_em(v["correct"][name], v["questions"]) for name in BASELINE_NAMES}
                 for split, v in (base or {}).get("splits", {}).items()}
    return {
        "command": f"python -m searchr1_lab report --runs {_shown(runs_dir)}", "design": design,
        "labels": {m: ARMS[m].label for m in design["methods"]}, "runs_finished": len(runs),
        "runs_planned": expected, "complete": complete,
        "world": {k: (base or {}).get(k) for k in ("world_config", "world_hash", "world_counts")},
        "slice_sizes": {"test": len(test_ids), "test_not_guessable": len(slice_ids),
                        "test_subjects": len(set(subjects(questions.get("test", [])).values()))},
        "baselines": baselines.get("test", {}), "baselines_val": baselines.get("val", {}),
        "selection": selection, "test_em_ci": test_em_ci, "difference": difference, "stable_lrs": stable,
        "detector": detector_claims(runs), "runs": runs,
        "run_time_s": _mean([r["train_s"] for r in runs]),
    }


def _shown(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (no machine's path in a committed file)."""
    resolved = path.resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else path.as_posix()


def _f(x: Any, nd: int = 2) -> str:
    return f"{x:.{nd}f}" if finite(x) else "-"


def _ci(cell: dict[str, Any] | None) -> str:
    return format_interval(cell, 3)


def _lrs(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) if values else "none"


def reading(s: dict[str, Any]) -> str:
    """The comparison's answer in words, from the difference's interval and the stable learning rates."""
    diff, labels = s["difference"], s["labels"]
    of, minus, ci = labels[diff["of"]], labels[diff["minus"]], diff["all"]
    if ci["lo"] > 0 or ci["hi"] < 0:
        text = f"Reading: {of} scores {'higher' if ci['lo'] > 0 else 'lower'} on test than {minus} at matched tuning"
    else:
        text = f"Reading: at matched tuning this design detects no test-EM difference between {of} and {minus}"
    stable_of, stable_minus = s["stable_lrs"][diff["of"]], s["stable_lrs"][diff["minus"]]
    if stable_of == stable_minus:
        return text + f", and both are stable at the same learning rates ({_lrs(stable_of)})."
    return text + f"; stable learning rates: {of} {_lrs(stable_of)}, {minus} {_lrs(stable_minus)}."


def readme_block(s: dict[str, Any]) -> str:
    """The README's lab results: the design, and what is finished of it."""
    d = s["design"]
    lines = [f"Design: {', '.join(s['labels'][m] for m in d['methods'])}; learning rates {_lrs(d['lrs'])}; "
             f"seeds {', '.join(map(str, d['seeds']))}; {s['runs_finished']} of {s['runs_planned']} runs finished."]
    b = s["baselines"]
    if b:
        lines.append("Baselines on the test split (EM, all / not-guessable slice of "
                     f"{s['slice_sizes']['test_not_guessable']} questions): " + "; ".join(
                         f"{BASELINE_LABELS[k]} {_f(v['all'], 3)} / {_f(v['not_guessable'], 3)}" for k, v in b.items()))
    if not s["complete"]:
        lines.append("The comparison is pending: no learning rate is selected and no test figure is claimed until "
                     "every run of the design has finished.")
        return "\n\n".join(lines) + "\n"
    lines += ["", "| method | lr chosen on validation (val EM) | test EM [95 % CI] | not-guessable test EM [95 % CI] "
                  "| stable learning rates |", "|---|---|---|---|---|"]
    for m, ci in s["test_em_ci"].items():
        ch = s["selection"]["chosen"][m]
        lines.append(f"| {s['labels'][m]} | {ch['lr']:g} ({_f(ch['val_em'], 3)}) | {_ci(ci['all'])} | "
                     f"{_ci(ci['not_guessable'])} | {_lrs(s['stable_lrs'][m])} |")
    diff = s["difference"]
    if diff:
        lines.append(f"\n{s['labels'][diff['of']]} minus {s['labels'][diff['minus']]}, each at its own selected rate: "
                     f"{_ci(diff['all'])} (not-guessable slice {_ci(diff['not_guessable'])}; 95 % paired bootstrap "
                     f"over the {s['slice_sizes'].get('test_subjects', '-')} test subjects and the seeds). {reading(s)}")
    det = s["detector"]
    lines.append(f"Detector over all {s['runs_finished']} runs ({det['collapsed_runs']} reward collapses): " + "; ".join(
        f"{a.replace('_', ' ')} sensitivity {_f(det[a]['sensitivity'])}, specificity {_f(det[a]['specificity'])}"
        for a in ALARMS) + ".")
    return "\n".join(lines) + "\n"


def replace_readme_block(text: str, block: str, begin: str = README_BEGIN, end: str = README_END) -> str:
    """``text`` with its block between the markers ``begin`` and ``end`` (default: the lab results') replaced by
    ``block`` (ValueError when the markers are missing)."""
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"README has no {begin!r} ... {end!r} block")
    return pattern.sub(lambda _: f"{begin}\n{block}{end}", text)


def readme_block_of(text: str, begin: str = README_BEGIN, end: str = README_END) -> str:
    """The block between the markers ``begin`` and ``end`` (default: the lab results') of a README's ``text``
    (ValueError when missing)."""
    m = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, re.S)
    if not m:
        raise ValueError(f"README has no {begin!r} ... {end!r} block")
    return m.group(1)


def clean(x: Any) -> Any:
    """JSON-safe: NaN / inf -> None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x
