"""The demo's figures and report, pure: per-slice EM and gains with subject-clustered intervals, the claim on
validation, the example trajectory, the report (``summary.json``, ``README.md``), the README's demo line and the
spread over seeds. :mod:`searchr1_lab.demo` runs the recipe and hands its results here."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from searchr1_lab.baselines import BASELINE_LABELS
from searchr1_lab.stats.bootstrap import clustered_bootstrap, format_interval
from searchr1_lab.methods import REPO_ROOT

POLICY_LABELS = {**BASELINE_LABELS, "trained": "trained"}
REPRODUCE = """## Reproduce

The selection, on the validation split: the warm start's validation EM (step 0, measured by the first selection run)
and one run per learning rate (here 1e-3; then 2e-3 the same way; `--select-steps` and
`--select-eval-every` set its length and how often it is scored):

```
python -m searchr1_lab.demo --select-lr 1e-3 --select-dir docs/demo/select
```

The demo at the chosen settings (what `make demo` runs, plus this report and the README's demo line): the gain
claimed on validation, then the test split scored once:

```
python -m searchr1_lab.demo --report docs/demo --readme README.md
```

The same recipe (the settings chosen once) trained and scored on 3 seeds, one report per seed and their spread:

```
python -m searchr1_lab.demo --seeds 0,1,2 --report docs/demo/seeds
```
"""
INTERVAL_TEXT = ("95 % paired bootstrap intervals that resample subjects (the entity a question asks about), not "
                 "questions: every question of a drawn subject counts, and a gain scores both policies on one draw")


def pick_example(before: dict[str, dict], after: dict[str, dict]) -> str | None:
    """The id of one test question the trained policy answers and the warm start does not: a multi-hop one where the
    trained policy searched once per hop and the warm start searched fewer times (the second search it learned)
    first, then a multi-hop one the trained policy searched twice (a right answer after fewer searches is a lucky
    guess, not the second hop), then any multi-hop one, then the first id in order; None if there is none."""
    won = [i for i in sorted(after) if i in before and after[i]["em"] > before[i]["em"]]
    multi = [i for i in won if after[i].get("hops") == 2]
    searched = [i for i in multi if len(after[i].get("queries") or []) >= 2]
    learned = [i for i in searched if len(before[i].get("queries") or []) < 2]
    return (learned or searched or multi or won or [None])[0]


_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def format_example(rid: str, before: dict, after: dict, width: int = 1500) -> str:
    """Question, gold answers and the two greedy trajectories: the model's text whole (every search and the answer)
    with each observation cut to its first document; a response longer than ``width`` after that is cut there."""
    def body(r: dict) -> str:
        text = _INFORMATION.sub(lambda m: f"<information>{(m.group(1).strip().splitlines() or [''])[0]} ..."
                                          "</information>", r["response_text"].strip())
        return text if len(text) <= width else text[:width] + " ..."

    return "\n".join([
        f"example test question ({rid}, {before.get('hops')}-hop): {before['question']}  gold: {before['golden_answers']}",
        f"--- warm start (EM {before['em']:.0f}, queries {before['queries']}, answer {before['prediction']!r}):",
        body(before),
        f"--- trained (EM {after['em']:.0f}, queries {after['queries']}, answer {after['prediction']!r}):",
        body(after),
    ])


def replace_readme_line(text: str, line: str) -> str:
    """``text`` with its one line that begins with ``Demo result:`` replaced by ``line``."""
    lines = text.split("\n")
    at = [i for i, old in enumerate(lines) if old.startswith("Demo result:")]
    if len(at) != 1:
        raise ValueError(f"the README must have exactly one 'Demo result:' line, found {len(at)}")
    lines[at[0]] = line
    return "\n".join(lines)


def _world_how(summary: dict[str, Any]) -> str:
    """How the demo's world came to be: reused, or built with the shipped warm start (older summaries: neither)."""
    how = ["built earlier, reused"] if summary.get("world_reused") else []
    if summary.get("world_policy_shipped"):
        how.append(f"its policy the warm start shipped in {summary['world_policy_shipped']}")
    return f" ({'; '.join(how)})" if how else ""


def timing_line(summary: dict[str, Any]) -> str:
    """The report's line of times. ``time_s.training`` is the run's own training seconds over every pass (steps
    trained in an earlier call included), ``time_s.train_call`` this call's; a summary without ``train_call`` kept
    only the call's time, which for a run that had finished before is the time to load it."""
    t = summary["time_s"]
    if "train_call" in t:
        training = f"training {t['training']:.0f} s (the run's own steps; this call {t['train_call']:.0f} s)"
    else:
        training = (f"the call that trained or loaded the run {t['training']:.0f} s (the run's own training time "
                    "was not recorded)")
    return (f"- wall time: world {t['world']:.0f} s{_world_how(summary)}, {training}, evaluation {t['eval']:.0f} s; "
            f"world config hash {summary['world_config_hash']}")


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (a committed report names no machine's dirs)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def question_slices(questions: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Question ids per slice: ``all``, ``not_guessable`` (no gold answer is a training answer), ``<h>-hop``."""
    out = {"all": [q["id"] for q in questions],
           "not_guessable": [q["id"] for q in questions if not q["train_answer"]]}
    for h in sorted({q["hops"] for q in questions}):
        out[f"{h}-hop"] = [q["id"] for q in questions if q["hops"] == h]
    return out


def em_intervals(correct: dict[str, int], questions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per slice, one policy's EM (``correct``: id -> 0/1) with its subject-clustered 95 % interval."""
    clusters = {q["id"]: q["subject"] for q in questions}
    return {name: clustered_bootstrap([correct], ids, clusters) for name, ids in question_slices(questions).items()}


def gain_intervals(before: dict[str, int], after: dict[str, int],
                   questions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per slice, EM of ``after`` minus EM of ``before`` with its paired subject-clustered 95 % interval."""
    clusters = {q["id"]: q["subject"] for q in questions}
    return {name: clustered_bootstrap([after], ids, clusters, other=[before])
            for name, ids in question_slices(questions).items()}


def claimed(gains: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Per slice, whether a gain is claimed: its interval lies wholly above 0."""
    return {name: iv["lo"] is not None and iv["lo"] > 0 for name, iv in gains.items()}


def _settings_text(summary: dict) -> str:
    ch = summary["selection"]
    if ch["steps"] == 0:
        return "the warm start (step 0) chosen on validation: nothing trained"
    return f"lr {ch['lr']:g} and {ch['steps']} steps chosen on validation"


def _claim_text(summary: dict) -> str:
    val = summary["validation"]
    gain = format_interval(val["gain"]["all"])
    if val["claimed"]["all"]:
        return f"the gain is claimed: on validation it is {gain}, above 0"
    return f"no gain is claimed: on validation it is {gain}, which does not exclude 0"


def readme_line(summary: dict) -> str:
    """The README's one-line demo result, from the demo's summary.json."""
    em, gain, n = summary["test_em"], summary["test_gain"], summary["slice_n"]
    two = "".join(f"; {name} ({n[k]}) {em['warm_start'][k]['mean']:.2f} -> {em['trained'][k]['mean']:.2f}, gain "
                  f"{format_interval(gain[k])}" for k, name in (("2-hop", "two-hop"), ("1-hop", "single-hop"))
                  if k in gain)
    return (f"Demo result: test EM {em['warm_start']['all']['mean']:.2f} -> {em['trained']['all']['mean']:.2f}, gain "
            f"{format_interval(gain['all'])}{two}; majority-answer baseline {em['majority']['all']['mean']:.2f}, warm "
            f"start without retrieval {em['warm_start_no_retrieval']['all']['mean']:.2f} ({n['all']} test questions "
            f"over {summary['test_subjects']} subjects, 95 % paired bootstrap over subjects; seed {summary['seed']}, "
            f"{_settings_text(summary)}, where {_claim_text(summary)}; 2-core {summary['machine'].split(',')[0]})")



def em_table(em: dict[str, dict[str, dict]], gain: dict[str, dict], slice_n: dict[str, int], split: str) -> str:
    """EM [95 % interval] of every policy and baseline in ``em`` per slice, and the trained policy's gain."""
    cols = list(slice_n)
    head = {"all": "all", "not_guessable": "not guessable"}
    lines = [f"| {split} EM [95 % CI] | " + " | ".join(f"{head.get(c, c)} ({slice_n[c]})" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for key, label in POLICY_LABELS.items():
        if key in em:
            lines.append(f"| {label} | " + " | ".join(format_interval(em[key].get(c)) for c in cols) + " |")
    lines.append("| gain: trained - warm start | " + " | ".join(format_interval(gain.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _selection_lines(ch: dict) -> list[str]:
    cand = [f"| {'-' if c['lr'] is None else format(c['lr'], 'g')} | {c['steps']} | {c['val_em']:.2f} |"
            for c in ch["candidates"]]
    return ["## The selection (validation split)", "", ch["procedure"][:1].upper() + ch["procedure"][1:] + ".", "",
            "| lr | step | validation EM |", "|---:|---:|---:|", *cand, ""]


RESULT_FIGURE = "em_by_hop.png"  # the demo's result as one figure (docs/demo's is the one README.md shows)
FIGURE_SLICES = {"1-hop": "single-hop", "2-hop": "two-hop", "all": "all"}
FIGURE_POLICIES = {"warm_start": "#9e9e9e", "trained": "#2ca02c"}  # policy -> bar colour


def figure_rows(summary: dict) -> list[dict[str, Any]]:
    """What the result figure draws, from the summary's test EM: per slice (single-hop, two-hop, all) its question
    count and the warm start's and the trained policy's EM with their 95 % intervals."""
    em, n = summary["test_em"], summary["slice_n"]
    return [{"slice": label, "questions": n[key],
             **{p: {k: em[p][key][k] for k in ("mean", "lo", "hi")} for p in FIGURE_POLICIES}}
            for key, label in FIGURE_SLICES.items() if key in n]


def write_figure(summary: dict, path: Path) -> Path:
    """The demo's result as one bar chart: warm start vs trained test EM by hop with their 95 % intervals
    (:func:`figure_rows`, also stored as JSON in the PNG's ``Description`` text, :func:`read_figure_rows`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, width = figure_rows(summary), 0.38
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for k, (policy, color) in enumerate(FIGURE_POLICIES.items()):
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        iv = [r[policy] for r in rows]
        ax.bar(xs, [v["mean"] for v in iv], width, color=color, label=POLICY_LABELS[policy],
               yerr=[[v["mean"] - v["lo"] for v in iv], [v["hi"] - v["mean"] for v in iv]], capsize=4)
        for x, v in zip(xs, iv):
            ax.text(x, v["hi"] + 0.02, f"{v['mean']:.2f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(rows)), [f"{r['slice']} ({r['questions']})" for r in rows])
    ax.set(ylim=(0, 1.08), ylabel="test EM (greedy)",
           title=f"The demo: test EM by hop, seed {summary['seed']} ({summary['machine']})")
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    fig.text(0.01, 0.01, "whiskers: 95 % bootstrap intervals over subjects; (n): test questions", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(rows)})
    plt.close(fig)
    return path


def read_figure_rows(path: Path) -> list[dict[str, Any]]:
    """The numbers a result figure was drawn from (:func:`write_figure` stores them in the PNG)."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text["Description"])


def write_report(report_dir: Path, summary: dict, table: str, example: str, command: str) -> None:
    """``summary.json``, its figure (:data:`RESULT_FIGURE`) and a README.md that shows them (the numbers README.md's
    demo line quotes); ``command``: what wrote it."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_figure(summary, report_dir / RESULT_FIGURE)
    val = summary["validation"]
    lines = [
        "# The demo's result", "",
        f"Generated by {command}.", "",
        f"- machine: {summary['machine']}; torch {summary['torch']}",
        f"- run: configs/tiny.yaml, seed {summary['seed']}, {summary['steps']} steps of {summary['method']}; "
        f"{_settings_text(summary)} (validation EM {summary['selection']['val_em']:.2f}); greedy evaluation",
        f"- intervals: {INTERVAL_TEXT}",
        f"- claim, on validation ({val['questions']} questions over {val['subjects']} subjects, after the selection "
        f"on the same split): {_claim_text(summary)}",
        f"- test ({summary['slice_n']['all']} questions over {summary['test_subjects']} subjects), scored once, "
        "after the claim",
        timing_line(summary), "",
        em_table(summary["test_em"], summary["test_gain"], summary["slice_n"], "test"), "",
        f"![warm start vs trained test EM by hop, 95 % intervals]({RESULT_FIGURE})", "",
        "## The claim (validation split)", "",
        em_table(val["em"], val["gain"], val["slice_n"], "validation"), "",
        *_selection_lines(summary["selection"]),
        "## The evaluator's table (test)", "", table, "", "## One test question", "", "```", example, "```", "",
        REPRODUCE,
    ]
    (report_dir / "README.md").write_text("\n".join(lines))


def seeds_summary(summaries: list[dict]) -> dict[str, Any]:
    """Per seed, the test gain (all, two-hop, single-hop) and the validation claim; the spread of the gains over the
    seeds."""
    rows = [{"seed": s["seed"], "claimed": s["validation"]["claimed"]["all"],
             **{f"gain_{k}": s["test_gain"].get(k) for k in ("all", "2-hop", "1-hop")},
             "warm_start": s["test_em"]["warm_start"]["all"]["mean"], "trained": s["test_em"]["trained"]["all"]["mean"]}
            for s in summaries]
    spread = {}
    for key in ("gain_all", "gain_2-hop", "gain_1-hop"):
        means = [r[key]["mean"] for r in rows if r[key] and r[key]["mean"] is not None]
        spread[key] = {"min": min(means), "max": max(means), "mean": statistics.fmean(means),
                       "std": statistics.stdev(means) if len(means) > 1 else 0.0} if means else None
    return {"seeds": rows, "spread": spread, "every_seed_gains": all(r["gain_all"]["lo"] is not None and
                                                                      r["gain_all"]["lo"] > 0 for r in rows)}


def write_seeds_report(report_dir: Path, seeds: dict[str, Any], command: str) -> None:
    """``seeds.json`` and ``README.md`` of a ``--seeds`` run: one row per seed and the spread."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "seeds.json").write_text(json.dumps(seeds, indent=2) + "\n")
    rows = [f"| {r['seed']} | {r['warm_start']:.2f} | {r['trained']:.2f} | {format_interval(r['gain_all'])} | "
            f"{format_interval(r['gain_2-hop'])} | {format_interval(r['gain_1-hop'])} | {'yes' if r['claimed'] else 'no'} | "
            f"[seed{r['seed']}](seed{r['seed']}/README.md) |"
            for r in seeds["seeds"]]
    spread = "; ".join(f"{k.removeprefix('gain_')} gain from {v['min']:+.2f} to {v['max']:+.2f} (mean {v['mean']:+.2f}, "
                       f"std {v['std']:.2f})" for k, v in seeds["spread"].items() if v)
    lines = ["# The demo's recipe on several seeds", "", f"Generated by `{command}`: the settings chosen on validation "
             "once, then trained, claimed on validation and tested once per seed.", "", f"Intervals: {INTERVAL_TEXT}.",
             "", "| seed | warm start test EM | trained test EM | gain [95 % CI] | two-hop gain [95 % CI] | single-hop gain "
             "[95 % CI] | claimed on validation | report |", "|---:|---:|---:|---|---|---|---|---|", *rows, "",
             f"Spread over the seeds: {spread or '-'}. Every seed's test gain above 0: "
             f"{'yes' if seeds['every_seed_gains'] else 'no'}.", ""]
    (report_dir / "README.md").write_text("\n".join(lines))
