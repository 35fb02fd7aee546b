"""The frontier report's figures: utility and final validation EM against survival, with the Pareto frontier drawn
and named (``frontier.png``), and the paper's phenomena per cell, a column per group of methods (``phenomena.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from searchr1_lab.compact import read_runs
from searchr1_lab.frontier.endpoints import WHOLE_VAL
from searchr1_lab.plots import colour
from searchr1_lab.stepsize.analysis import cell_runs

FIGURES = ("frontier", "phenomena")
# the paper's phenomena, one column each: metric key -> title
PHENOMENA = {"actor/entropy": "entropy", "actor/grad_norm": "gradient norm (before clipping)",
             "lld/correct_logp_old_per_token": "log-likelihood of correct responses (nats/token)"}


def _pyplot():
    import matplotlib  # deferred: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib

    return plt


# where a point's name may go, in points from the point (x, y, horizontal alignment), tried in this order
LABEL_OFFSETS = ((4, 3, "left"), (4, -9, "left"), (-4, 3, "right"), (-4, -9, "right"), (4, 10, "left"),
                 (4, -16, "left"), (-4, 10, "right"), (-4, -16, "right"))


def _label_points(ax, points: Sequence[tuple[float, float]], names: Sequence[str]) -> None:
    """Each point named beside it, at the first of :data:`LABEL_OFFSETS` where its name stays inside the axes and
    overlaps no name placed before it (the first offset when none is free), so cells that sit close together stay
    readable."""
    ax.figure.canvas.draw()  # the axes' final limits and place: a name's box is measured where it will be drawn
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for (x, y), name in zip(points, names):
        for dx, dy, ha in LABEL_OFFSETS:
            text = ax.annotate(name, (x, y), fontsize=6, xytext=(dx, dy), textcoords="offset points", ha=ha)
            box = text.get_window_extent(renderer)
            inside = ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1 and ax.bbox.y0 <= box.y0 and box.y1 <= ax.bbox.y1
            if inside and not any(box.overlaps(other) for other in placed):
                break
            text.remove()
        else:
            text = ax.annotate(name, (x, y), fontsize=6, xytext=LABEL_OFFSETS[0][:2], textcoords="offset points")
            box = text.get_window_extent(renderer)
        placed.append(box)


LR_MARKERS = ("o", "s", "^", "D")  # a cell's marker by its learning rate, highest first (GRPO ran at two)
SPREAD_LABEL = "point: mean of a cell's seeds; bar: their minimum to maximum"


def cell_label(c: Mapping[str, Any]) -> str:
    """A cell as its legend names it: ``LLDS (action gate): lambda 0.2 (x1)``; a dose that names its method already
    (``GRPO, lr 0.0014``) stands alone."""
    return c["dose"] if c["dose"].startswith(c["method"]) else f"{c['method']}: {c['dose']}"


def _markers(cells: Sequence[Mapping[str, Any]]) -> dict[float, str]:
    lrs = sorted({c["lr"] for c in cells}, reverse=True)
    return {lr: LR_MARKERS[i % len(LR_MARKERS)] for i, lr in enumerate(lrs)}


def _cells_panel(ax, cells: Sequence[Mapping[str, Any]], key: str, markers: Mapping[float, str]) -> None:
    """One point per cell at (RMST, mean of ``key``), a bar from its seeds' smallest to largest value, in its arm's
    colour and its learning rate's marker."""
    for c in cells:
        v = c[key]
        if v["mean"] is None:
            continue
        ax.errorbar(c["rmst"], v["mean"], yerr=[[v["mean"] - v["min"]], [v["max"] - v["mean"]]],
                    fmt=markers[c["lr"]], ms=6, color=colour(c["arm"]), capsize=3,
                    label=cell_label(c))


def frontier_figure(summary: Mapping[str, Any], path: Path, start_val_em: float | None = None) -> Path:
    """Two panels against survival (RMST), one point per cell with its seeds' spread: the utility (peak held-out
    gain), with the cells on the Pareto frontier joined and named, and the final whole-validation EM, with the warm
    start's (``start_val_em``, step 0 of every run) as a dashed line."""
    plt = _pyplot()
    fig, (ax, ax_em) = plt.subplots(1, 2, figsize=(15, 6.4), sharex=True)
    cells = [c for c in summary["cells"] if c["runs"] and c["utility"]["mean"] is not None]
    markers = _markers(cells)
    _cells_panel(ax, cells, "utility", markers)
    _cells_panel(ax_em, cells, "final_val_em", markers)
    by_name = {c["name"]: c for c in cells}
    front = [by_name[name] for name in summary["frontier"]]  # by survival, so the line runs along the frontier
    if front:
        xs, ys = [c["rmst"] for c in front], [c["utility"]["mean"] for c in front]
        ax.plot(xs, ys, "--", color="black", lw=1)
        ax.scatter(xs, ys, s=220, facecolors="none", edgecolors="black", label="on the Pareto frontier")
    if start_val_em is not None:
        ax_em.axhline(start_val_em, color="black", ls="--", lw=1,
                      label=f"the warm start (step 0 of every run): {start_val_em:.3f}")
    horizon = summary["label"]["horizon"]
    for a in (ax, ax_em):
        a.set_xlabel(f"survival: RMST to step {horizon} (steps)")
        a.grid(alpha=0.3)
    ax.set_ylabel("utility: peak held-out EM gain over step 0 (floored at 0)")
    ax.set_title("how much each cell learns against how long it lasts", fontsize=10)
    ax_em.set_ylabel(f"whole-validation EM at step {horizon} (the end)")
    ax_em.set_title("where each cell ends", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    extra = dict(zip(*ax_em.get_legend_handles_labels()[::-1]))
    ax_em.legend([extra[k] for k in extra if k.startswith("the warm start")],
                 [k for k in extra if k.startswith("the warm start")], fontsize=7, loc="upper right")
    fig.legend(unique.values(), unique.keys(), fontsize=7, loc="lower center", ncol=4,
               title=f"{summary['runs_finished']} of {summary['runs_planned']} runs; {SPREAD_LABEL}; "
                     + ", ".join(f"{m}: lr {lr:g}" for lr, m in markers.items()), title_fontsize=8)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    _label_points(ax, [(c["rmst"], c["utility"]["mean"]) for c in cells], [c["name"] for c in cells])
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _mean_curve(runs: Sequence[Mapping[str, Any]], key: str, horizon: int) -> tuple[list[int], list[float]]:
    """Per step 0..``horizon``, the mean over ``runs`` of the finite values of ``key`` (NaN where no run has one, so
    a line breaks there instead of bridging the gap)."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for rec in r["records"]:
            v = rec.get(key)
            if isinstance(v, (int, float)) and np.isfinite(v):
                by_step.setdefault(int(rec["step"]), []).append(float(v))
    if not by_step:
        return [], []
    steps = list(range(min(by_step), min(max(by_step), horizon) + 1))
    return steps, [float(np.mean(by_step[s])) if s in by_step else float("nan") for s in steps]


# the phenomena figure's columns: which methods share a panel (a method not named here joins the last column)
PHENOMENA_GROUPS = {"GRPO and the likelihood fixes": ("GRPO", "LLDS (action gate)", "LLDS-MA", "likelihood anchor"),
                    "step-size controls": ("reference KL", "trust-region step size"),
                    "the field's other fixes": ()}
ENDED = "x: the line ends (no run of the cell logged it after this step)"


def phenomena_groups(methods: Sequence[str]) -> dict[str, list[str]]:
    """:data:`PHENOMENA_GROUPS` over ``methods``: each method in the first group that names it, else in the last."""
    named = {m for group in PHENOMENA_GROUPS.values() for m in group}
    last = list(PHENOMENA_GROUPS)[-1]
    return {title: [m for m in methods if m in group or (title == last and m not in named)]
            for title, group in PHENOMENA_GROUPS.items()}


def phenomena_figure(summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """A row per phenomenon (:data:`PHENOMENA`), a column per group of methods (:func:`phenomena_groups`); in each
    panel one line per cell (the mean over its seeds, its arm's colour, dashed at a lower learning rate), an x where
    a line ends before the horizon; one y range per row."""
    plt = _pyplot()
    groups = phenomena_groups(summary["methods"])
    horizon = int(summary["label"]["horizon"])
    top_lr = max((c["lr"] for c in summary["cells"]), default=0.0)
    fig, axes = plt.subplots(len(PHENOMENA), len(groups), figsize=(5.2 * len(groups), 3.0 * len(PHENOMENA) + 2),
                             squeeze=False, sharex=True, sharey="row", layout="constrained")
    for col, (title, methods) in enumerate(groups.items()):
        for row, (key, name) in enumerate(PHENOMENA.items()):
            ax = axes[row][col]
            for c in (c for c in summary["cells"] if c["method"] in methods):
                steps, vals = _mean_curve(cell_runs(runs, c["arm"], c["lr"]), key, horizon)
                if not steps:
                    continue
                style = "-" if c["lr"] == top_lr else "--"
                ax.plot(steps, vals, style, color=colour(c["arm"]), lw=1.3, label=cell_label(c))
                last = max(i for i, v in enumerate(vals) if np.isfinite(v))
                if steps[last] < horizon:
                    ax.plot(steps[last], vals[last], "x", color=colour(c["arm"]), ms=8, mew=2)
            ax.set_title(f"{title}: {name}" if row == 0 else name, fontsize=9)
            if key == "actor/grad_norm" and ax.has_data():
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if row == len(PHENOMENA) - 1:
                ax.set_xlabel("step")
        if axes[-1][col].has_data():
            axes[-1][col].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.suptitle(f"the paper's phenomena per cell: each line the mean over the cell's seeds ({summary['runs_finished']}"
                 f" runs; dashed: a lower learning rate); {ENDED}", fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def start_val_em(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """The whole-validation EM at step 0 (the warm start every run began from), the mean over the runs that have it."""
    values = [float(rec[WHOLE_VAL]) for r in runs for rec in r["records"]
              if int(rec["step"]) == 0 and isinstance(rec.get(WHOLE_VAL), (int, float))]
    return float(np.mean(values)) if values else None


def write_figures(summary: Mapping[str, Any], reg: Mapping[str, Any], runs_dir: Path, out: Path) -> list[Path]:
    """Both figures into ``out``, from the summary and the compact runs in ``runs_dir``."""
    runs, _ = read_runs(runs_dir)
    return [frontier_figure(summary, out / "frontier.png", start_val_em(runs)),
            phenomena_figure(summary, runs, out / "phenomena.png")]
