r"""The README's findings: one table row per claim, each read from the ``summary.json`` of the committed report that
makes it (:data:`SUMMARIES`), and the headline figure, held-out EM against the step for GRPO, LLDS and the
trust-region arm with each run's collapse marked, drawn from the trust-region study's committed runs:

    python -m searchr1_lab.findings --readme README.md

replaces the README's block between :data:`FINDINGS_BEGIN` and :data:`FINDINGS_END` with :func:`findings_block` and
writes :data:`HEADLINE_FIGURE` (the numbers it draws are stored in the PNG too, :func:`read_headline`).
``tests/test_findings.py`` checks that the committed block and figure are what this computes from the committed
files. Pure where it can be: summaries in, rows out (:func:`findings_rows`); runs in, series out
(:func:`headline_series`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.comparison.claims import replace_readme_block
from searchr1_lab.compact import read_runs
from searchr1_lab.methods import REPO_ROOT
from searchr1_lab.plots import MEAN_LINE, SEED_LINE, colour
from searchr1_lab.stepsize.account import controls_reading
from searchr1_lab.stepsize.analysis import HELD_OUT, collapse_time, run_name

FINDINGS_BEGIN = "<!-- findings:begin (python -m searchr1_lab.findings --readme README.md) -->"
FINDINGS_END = "<!-- findings:end -->"
# the reports whose summaries the table reads: name -> (summary.json, the report a row links to), repository-relative
SUMMARIES = {"demo": ("docs/demo/summary.json", "docs/demo/README.md"),
             "comparison": ("docs/lab/summary.json", "docs/lab/README.md"),
             "prereg": ("docs/lab/prereg/summary.json", "docs/lab/prereg/README.md"),
             "stepsize": ("docs/lab/stepsize/summary.json", "docs/lab/stepsize/README.md"),
             "trustregion": ("docs/lab/trustregion/summary.json", "docs/lab/trustregion/README.md"),
             "frontier": ("docs/lab/frontier/summary.json", "docs/lab/frontier/README.md")}
HEADLINE_FIGURE = "docs/lab/headline.png"
HEADLINE_RUNS = "docs/lab/trustregion/runs"  # GRPO, LLDS and the trust-region arm at one learning rate
HEADLINE_ARMS = {"grpo": "GRPO", "llds_action": "LLDS (action gate, lambda 0.2)",
                 "grpo_trust_region": "GRPO held to LLDS's step KL (trust region)"}
ARM_NAMES = {"llds_response": "response gate", "llds_action": "action gate", "llds_ma": "LLDS-MA"}


def _iv(lo: float, hi: float, digits: int, signed: bool = False) -> str:
    f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


def _welch(comparison: Mapping[str, Any]) -> tuple[str, str]:
    """An RMST difference (steps) and its Welch 95 % interval."""
    w = comparison["welch"]
    return f"{w['estimate']:+.1f} steps", _iv(w["low"], w["high"], 1, signed=True) + " Welch"


def _counts(comparison: Mapping[str, Any]) -> str:
    a, b = comparison["a"], comparison["b"]
    return f"collapsed {a['count']} vs {b['count']}"


def _every_run(count: str) -> bool:
    """A ``"k/n"`` count with k = n > 0: every run of the arm collapsed."""
    k, n = (int(x) for x in count.split("/"))
    return n > 0 and k == n


def _window(s: Mapping[str, Any]) -> str:
    """Where the step-size controls were matched: ``in the warm-up (steps 1-8)`` or ``over steps 1-20``."""
    first, last = s["step_size_window"]
    warm = s.get("warmup_steps") or 0
    return f"in the warm-up (steps {first}-{last})" if last <= warm else f"over steps {first}-{last}"


def demo_rows(s: Mapping[str, Any]) -> list[list[str]]:
    em, gain = s["test_em"], s["test_gain"]["2-hop"]
    return [[f"The demo: RL learns the second hop (default world, test split, seed {s['seed']})",
             f"two-hop EM {em['warm_start']['2-hop']['mean']:.2f} -> {em['trained']['2-hop']['mean']:.2f}, gain "
             f"{gain['mean']:+.2f}", _iv(gain["lo"], gain["hi"], 2, signed=True) + " bootstrap over subjects",
             "gain claimed on validation" if s["validation"]["claimed"]["all"] else "no gain claimed"]]


def comparison_rows(s: Mapping[str, Any]) -> list[list[str]]:
    d = s["difference"]
    if not d:
        return [["LLDS vs GRPO at matched tuning", "pending", "-", "grid not complete"]]
    lo, hi = d["all"]["lo"], d["all"]["hi"]
    verdict = "no difference detected" if lo <= 0 <= hi else ("LLDS higher" if lo > 0 else "LLDS lower")
    steps = sorted({r["steps"] for r in s["runs"]})
    return [[f"{s['labels'][d['of']]} vs {s['labels'][d['minus']]} at matched tuning: test EM difference "
             f"({'/'.join(map(str, steps))} steps, {len(s['design']['seeds'])} seeds a method)",
             f"{d['all']['mean']:+.3f}",
             _iv(lo, hi, 3, signed=True) + " paired bootstrap over subjects", verdict]]


def prereg_rows(s: Mapping[str, Any]) -> list[list[str]]:
    def per_arm(arms: Mapping[str, Any], value: str, lo: str, hi: str, digits: int) -> tuple[str, str]:
        return ("; ".join(f"{ARM_NAMES.get(a, a)} {x['difference'][value]:+.{digits}f}" for a, x in arms.items()),
                "; ".join(_iv(x["difference"][lo], x["difference"][hi], digits, signed=True) for x in arms.values()))

    def supported(arms: Mapping[str, Any]) -> str:
        return "supported" if all(x["supported"] for x in arms.values()) else "not in every arm"

    one, two, three = s["H1"], s["H2"], s["H3"]
    n1, i1 = per_arm(one["arms"], "value", "lo", "hi", 2)
    n3, i3 = per_arm(three["arms"], "mean", "lo", "hi", 3)
    w = two["warned_k_ahead"]
    return [[f"Registered: LLDS collapses less often than GRPO at lr {', '.join(one['rates'])} (held-out collapse "
             "share minus GRPO's)", n1, i1 + " Newcombe", supported(one["arms"])],
            [f"Registered: the probe likelihood falls {two['lead_k']}+ steps before a held-out collapse",
             f"{w['k']}/{w['n']} = {w['value']:.2f}", _iv(w["lo"], w["hi"], 2) + " Wilson",
             "supported" if two["supported"] else "not supported"],
            [f"Registered: LLDS keeps more single-hop skill than GRPO at lr {', '.join(three['rates'])} (test EM "
             "difference)", n3, i3 + " bootstrap over subjects", supported(three["arms"])]]


def stepsize_rows(s: Mapping[str, Any]) -> list[list[str]]:
    h = s["hypotheses"]
    survival = [h[name]["comparison"] for name in ("H1", "H1c")]
    two = h["H2"]
    controls = sorted(two["controls"].items())
    return [[f"Registered: LLDS outlives GRPO (RMST to step {s['label']['horizon']}; collapsed "
             + "; ".join(f"{c['a']['count']} vs {c['b']['count']} at lr {c['a']['lr']:g}" for c in survival) + ")",
             "; ".join(_welch(c)[0] for c in survival), "; ".join(_welch(c)[1] for c in survival),
             ("not in every test" if not all(h[n]["supported"] for n in ("H1", "H1c")) else
              "supported: a delay, every LLDS run collapsed too" if all(_every_run(c["a"]["count"]) for c in survival)
              else "supported")],
            [f"Registered: LLDS outlives GRPO controls matched to its step size {_window(s)} ("
             + ", ".join(name for name, _ in controls) + ")",
             "; ".join(_welch(res["comparison"])[0] for _, res in controls),
             "; ".join(_welch(res["comparison"])[1] for _, res in controls),
             f"registered: {two['verdict']}; what the data support: {controls_reading(s, two)[0]}"]]


def trustregion_rows(s: Mapping[str, Any]) -> list[list[str]]:
    h = s["hypotheses"]
    five, two = h["H5"]["comparison"], h["H2"]
    n5, i5 = _welch(five)
    n2, i2 = _welch(two["comparison"])
    size = two["step_size"]
    first, last = size["first"], size["last_step"]
    return [[f"Registered: a trust-region controller that holds GRPO to LLDS's step KL delays its collapse "
             f"({_counts(five)})", n5, i5, "supported" if h["H5"]["supported"] else "not supported"],
            [f"Registered: LLDS outlives that trust-region GRPO (step KL matched over the {last - first + 1} steps "
             f"{first}-{last} where both had runs alive)", n2, i2,
             f"{two['verdict']}: the control outlived LLDS (a direction not registered)"
             if two["comparison"]["welch"]["high"] < 0 else two["verdict"]]]


def frontier_rows(s: Mapping[str, Any]) -> list[list[str]]:
    if not s["complete"] or not s.get("test"):
        return [["The frontier: each fix's chosen setting on test", "pending", "-", "grid not complete"]]
    test = {m: t["test_em"] for m, t in s["test"].items()}
    best = max(test, key=lambda m: test[m]["mean"])
    others = max(v["mean"] for m, v in test.items() if m != best)
    warm = s["test_baselines"]["warm_start"]
    below = test[best]["hi"] < warm["lo"]
    return [[f"Exploratory: test EM after {s['label']['horizon']} steps of each fix at its setting chosen on "
             f"validation ({len(test)} methods), against the untrained warm start",
             f"{best} {test[best]['mean']:.3f}, the others <= {others:.3f}; warm start {warm['mean']:.3f}",
             f"{_iv(test[best]['lo'], test[best]['hi'], 3)} vs {_iv(warm['lo'], warm['hi'], 3)} bootstrap over "
             "subjects", "exploratory: every fix ends below the warm start, intervals apart" if below else
             "exploratory: the best fix is not shown below the warm start"]]


ROWS = {"demo": demo_rows, "comparison": comparison_rows, "prereg": prereg_rows, "stepsize": stepsize_rows,
        "trustregion": trustregion_rows, "frontier": frontier_rows}


def findings_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Every claim's row ``[claim, number, interval, verdict, link]`` from the reports' summaries (name ->
    summary.json's content, the names of :data:`SUMMARIES`; a missing report gives no rows)."""
    return [[*row, SUMMARIES[name][1]] for name, rows_of in ROWS.items() if name in summaries
            for row in rows_of(summaries[name])]


def findings_block(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The README's findings table (:func:`findings_rows`), the link relative to the repository root."""
    lines = ["| claim | number | 95 % interval | verdict | report |", "|---|---|---|---|---|"]
    lines += [f"| {claim} | {number} | {interval} | {verdict} | [{Path(link).parent.name}]({link}) |"
              for claim, number, interval, verdict, link in findings_rows(summaries)]
    return "\n".join(lines) + "\n"


def read_summaries(root: Path = REPO_ROOT) -> dict[str, Any]:
    return {name: json.loads((root / path).read_text()) for name, (path, _) in SUMMARIES.items()
            if (root / path).is_file()}


# ---------------------------------------------------------------------------------------------------------------
# the headline figure
# ---------------------------------------------------------------------------------------------------------------

def headline_series(runs: Sequence[Mapping[str, Any]], label: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per run of :data:`HEADLINE_ARMS` (sorted by arm, then seed): its held-out EM by step and its collapse under
    the study's registered ``label`` (``{"ratio", "persist", "horizon"}``): ``{"arm", "lr", "seed", "steps",
    "values", "collapse_step" (None: censored), "bound"}`` (the held-out EM at or below which it counts as
    collapsed)."""
    out = []
    for r in sorted((r for r in runs if r["method"] in HEADLINE_ARMS), key=lambda r: (r["method"], r["seed"])):
        pts = sorted((int(x["step"]), float(x[HELD_OUT])) for x in r["records"]
                     if x.get(HELD_OUT) is not None and int(x["step"]) <= label["horizon"])
        time, event = collapse_time(r["records"], ratio=label["ratio"], persist=label["persist"],
                                    horizon=label["horizon"], name=run_name(r))
        out.append({"arm": r["method"], "lr": r["lr"], "seed": r["seed"], "steps": [p[0] for p in pts],
                    "values": [p[1] for p in pts], "collapse_step": time if event else None,
                    "bound": label["ratio"] * pts[0][1]})
    return out


def write_headline(series: Sequence[Mapping[str, Any]], label: Mapping[str, Any], warmup: int, path: Path) -> Path:
    """Held-out EM against the step, one panel: thin a seed, bold the mean over an arm's seeds, an x at each run's
    collapse, the collapse bound dashed, the learning-rate warm-up shaded (the series stored in the PNG)."""
    import matplotlib  # deferred: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib

    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.axvspan(0.5, warmup + 0.5, color="0.9", label=f"learning-rate warm-up (steps 1-{warmup})")
    for arm, name in HEADLINE_ARMS.items():
        mine = [s for s in series if s["arm"] == arm]
        for s in mine:
            ax.plot(s["steps"], s["values"], color=colour(arm), **SEED_LINE)
            if s["collapse_step"] is not None:
                ax.plot(s["collapse_step"], s["values"][s["steps"].index(s["collapse_step"])], "x", color=colour(arm),
                        ms=7, mew=1.8)
        steps = sorted({t for s in mine for t in s["steps"]})
        means = [sum(s["values"][s["steps"].index(t)] for s in mine if t in s["steps"])
                 / sum(t in s["steps"] for s in mine) for t in steps]
        collapsed = sum(s["collapse_step"] is not None for s in mine)
        ax.plot(steps, means, color=colour(arm), **MEAN_LINE,
                label=f"{name}: {collapsed} of {len(mine)} runs collapsed (bold: mean, thin: each seed)")
    bound = series[0]["bound"] if series else 0.0
    ax.axhline(bound, color="black", ls="--", lw=1,
               label=f"collapse: at or below {label['ratio']:g} x step 0 ({bound:.3f}) for {label['persist']} "
                     "evaluations in a row; x marks where")
    lr = ", ".join(f"{x:g}" for x in sorted({s["lr"] for s in series}))
    ax.set(xlabel="step", ylabel="held-out EM (validation subsample, greedy)", xlim=(0, label["horizon"]),
           title=f"Held-out EM during training, lr {lr} (the trust-region study's runs)")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(list(series))})
    plt.close(fig)
    return path


def read_headline(path: Path) -> list[dict[str, Any]]:
    """The series :func:`write_headline` drew (stored in the PNG)."""
    from PIL import Image  # deferred: pillow, matplotlib's dependency

    with Image.open(path) as image:
        return json.loads(image.text["Description"])


def headline_inputs(root: Path = REPO_ROOT) -> tuple[list[dict[str, Any]], Mapping[str, Any], int]:
    """The headline figure's series, label and warm-up, from the committed runs and their study's summary."""
    summary = json.loads((root / SUMMARIES["trustregion"][0]).read_text())
    runs, _ = read_runs(root / HEADLINE_RUNS)
    return headline_series(runs, summary["label"]), summary["label"], int(summary["warmup_steps"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lab.findings", description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", default=str(REPO_ROOT / "README.md"), help="the README whose findings block is replaced")
    p.add_argument("--figure", default=str(REPO_ROOT / HEADLINE_FIGURE), help="where the headline figure goes")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    readme = Path(args.readme)
    readme.write_text(replace_readme_block(readme.read_text(), findings_block(read_summaries()), FINDINGS_BEGIN,
                                           FINDINGS_END))
    write_headline(*headline_inputs(), Path(args.figure))
    print(f"findings: {readme}, {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
