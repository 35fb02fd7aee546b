"""The frontier report's figures: utility against survival with the Pareto frontier drawn and named
(``frontier.png``), and the paper's phenomena per method as small multiples (``phenomena.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from searchr1_lab.compact import read_runs
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


def frontier_figure(summary: Mapping[str, Any], path: Path) -> Path:
    """One point per cell at (RMST, mean utility), bars from the seeds' smallest to largest utility, the cells on
    the Pareto frontier joined and named."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 6.0))
    cells = [c for c in summary["cells"] if c["runs"] and c["utility"]["mean"] is not None]
    colors = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(summary["methods"]), 1)))
    color = {m: colors[i] for i, m in enumerate(summary["methods"])}
    for c in cells:
        u = c["utility"]
        ax.errorbar(c["rmst"], u["mean"], yerr=[[u["mean"] - u["min"]], [u["max"] - u["mean"]]], fmt="o", ms=6,
                    color=color[c["method"]], capsize=3, label=c["method"])
    by_name = {c["name"]: c for c in cells}
    front = [by_name[name] for name in summary["frontier"]]  # by survival, so the line runs along the frontier
    if front:
        xs, ys = [c["rmst"] for c in front], [c["utility"]["mean"] for c in front]
        ax.plot(xs, ys, "--", color="black", lw=1)
        ax.scatter(xs, ys, s=220, facecolors="none", edgecolors="black", label="on the Pareto frontier")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    ax.set_xlabel(f"survival: RMST to step {summary['label']['horizon']} (steps)")
    ax.set_ylabel("utility: peak held-out EM gain over step 0 (floored at 0)")
    ax.set_title(f"learning against lasting, {summary['runs_finished']} of {summary['runs_planned']} runs", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _label_points(ax, [(c["rmst"], c["utility"]["mean"]) for c in cells], [c["name"] for c in cells])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mean_curve(runs: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Per step, the mean over ``runs`` of the finite values of ``key``."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for rec in r["records"]:
            v = rec.get(key)
            if isinstance(v, (int, float)) and np.isfinite(v):
                by_step.setdefault(int(rec["step"]), []).append(float(v))
    steps = sorted(by_step)
    return steps, [float(np.mean(by_step[s])) for s in steps]


def phenomena_figure(summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """A row per method, a column per phenomenon (:data:`PHENOMENA`); in each panel one line per dose (mean over
    its seeds); one y range per column, so the methods compare at a glance."""
    plt = _pyplot()
    methods = list(summary["methods"])
    fig, axes = plt.subplots(max(len(methods), 1), len(PHENOMENA), figsize=(11, 1.9 * max(len(methods), 1)),
                             squeeze=False, sharex=True, sharey="col")
    for row, method in enumerate(methods):
        for col, (key, title) in enumerate(PHENOMENA.items()):
            ax = axes[row][col]
            for c in (c for c in summary["cells"] if c["method"] == method):
                steps, vals = _mean_curve(cell_runs(runs, c["arm"], c["lr"]), key)
                if steps:
                    ax.plot(steps, vals, lw=1.2, label=c["dose"])
            ax.set_title(f"{method}: {title}" if col == 0 else title, fontsize=7)
            ax.tick_params(labelsize=6)
            if col == 0 and ax.has_data():
                ax.legend(fontsize=5)
            if key == "actor/grad_norm" and ax.has_data():
                ax.set_yscale("log")
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_figures(summary: Mapping[str, Any], reg: Mapping[str, Any], runs_dir: Path, out: Path) -> list[Path]:
    """Both figures into ``out``, from the summary and the compact runs in ``runs_dir``."""
    runs, _ = read_runs(runs_dir)
    return [frontier_figure(summary, out / "frontier.png"), phenomena_figure(summary, runs, out / "phenomena.png")]
