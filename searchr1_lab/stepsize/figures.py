"""The step-size studies' figures (module docstring of :mod:`.report`): survival per arm, collapse against step size,
the curves over the steps, the movement to collapse, and each arm's step KL against the step (matched or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.compact import read_runs
from searchr1_lab.plots import MEAN_LINE, SEED_LINE, colour
from searchr1_lab.stepsize.analysis import HELD_OUT, same_lr, values_by_step
from searchr1_lab.stepsize.movement import MEASURES, movement

# the rows of curves.png: metric, y label, drawn on a log axis
CURVE_ROWS = ((HELD_OUT, "held-out EM (validation subsample)", False), ("lld/step_kl", "per-step KL", True),
              ("reward/em_mean", "training reward", False),
              ("lld/correct_logp_old_per_token", "log-likelihood of correct\nresponses (nats/token)", False),
              ("actor/entropy", "entropy (nats)", False), ("actor/grad_norm", "gradient norm", True))
MEASURE_NAMES = {"kl": "summed step KL", "sqrt_kl": "path length (summed sqrt step KL)",
                 "probe_drop": "probe likelihood drop (nats/token)"}
FIGURES = ("survival.png", "step_size.png", "curves.png", "movement.png", "step_kl.png")




def _arm_colors(reg: Mapping[str, Any]) -> dict[str, str]:
    """Each arm's colour, from the lab's one table (:data:`searchr1_lab.plots.COLOURS`)."""
    return {arm: colour(arm) for arm in reg["arms"]}


def write_figures(s: Mapping[str, Any], reg: Mapping[str, Any], runs_dir: str | Path, out: Path) -> None:
    """:data:`FIGURES` in ``out`` (the report's module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _arm_colors(reg)
    lrs = sorted({c["lr"] for c in s["survival"]}, reverse=True)
    runs = read_runs(runs_dir)[0]
    drawings = {"survival.png": lambda: draw_survival(plt, s, colors, lrs),
                "step_size.png": lambda: draw_step_size(plt, s, colors, lrs),
                "curves.png": lambda: draw_curves(plt, runs, reg, colors, lrs),
                "movement.png": lambda: draw_movement(plt, runs, s, colors, lrs),
                "step_kl.png": lambda: draw_step_kl(plt, runs, s, reg, colors)}
    for name, draw in drawings.items():
        fig = draw()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def draw_survival(plt: Any, s: Mapping[str, Any], colors: Mapping[str, str], lrs: Sequence[float]) -> Any:
    """Kaplan-Meier curves per arm, one panel per learning rate."""
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs), 4.2), squeeze=False, sharey=True)
    for ax, lr in zip(axes[0], lrs):
        for c in s["survival"]:
            if c["lr"] == lr and c["runs"]:
                xs, ys = zip(*c["km"])
                ax.step([*xs, s["label"]["horizon"]], [*ys, ys[-1]], where="post", color=colors[c["arm"]],
                        label=f"{c['arm']} ({c['count']})")
        ax.set(title=f"lr {lr:g}", xlabel="step", ylim=(-0.03, 1.03), xlim=(0, s["label"]["horizon"]))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel("share of runs not collapsed (Kaplan-Meier)")
    return fig


def draw_step_size(plt: Any, s: Mapping[str, Any], colors: Mapping[str, str], lrs: Sequence[float]) -> Any:
    """Collapse step against measured step size, one point per run (hollow triangles: censored)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    size = {arm: 90 - 60 * i / max(len(colors) - 1, 1) for i, arm in enumerate(colors)}  # coinciding points nest
    for p in s["points"]:
        if finite(p["step_size"]):
            color = colors.get(p["arm"], "k")
            ax.scatter(p["step_size"], p["collapse_time"], s=size.get(p["arm"], 30), marker="o" if p["event"] else "^",
                       edgecolors=color, facecolors=color if p["event"] else "none", linewidths=1.2)
            drawn = drawn or p["step_size"] > 0
    for arm, color in colors.items():
        ax.scatter([], [], color=color, label=arm)
    first, last = s["step_size_window"]
    ax.set(xscale="log" if drawn else "linear", xlabel=f"measured step size: mean per-step KL, steps {first}-{last}",
           ylabel="collapse step (triangle: not collapsed, censored)")
    ax.legend(fontsize=7)
    return fig


def draw_curves(plt: Any, runs: Sequence[Mapping[str, Any]], reg: Mapping[str, Any], colors: Mapping[str, str],
                lrs: Sequence[float]) -> Any:
    """:data:`CURVE_ROWS` over the steps, one line per run, one column per learning rate."""
    fig, axes = plt.subplots(len(CURVE_ROWS), len(lrs), figsize=(6 * len(lrs), 2.6 * len(CURVE_ROWS)), squeeze=False,
                             sharex=True)
    for col, lr in enumerate(lrs):
        for row, (key, ylabel, log) in enumerate(CURVE_ROWS):
            ax = axes[row][col]
            positive = False
            for arm in reg["arms"]:
                mine = [r for r in runs if r["method"] == arm and same_lr(r["lr"], lr)]
                for r in mine:
                    pts = [(x["step"], x[key]) for x in r["records"] if finite(x.get(key))]
                    if pts:
                        ax.plot(*zip(*pts), color=colors[arm], lw=0.7, alpha=0.5,
                                label=f"{arm} (one line per seed)" if r is mine[0] else None)
                        positive = positive or any(y > 0 for _, y in pts)
            ax.set(ylabel=ylabel, title=f"lr {lr:g}" if row == 0 else "",
                   yscale="log" if log and positive else "linear")
            if row == len(CURVE_ROWS) - 1:
                ax.set_xlabel("step")
        if axes[0][col].get_legend_handles_labels()[0]:
            axes[0][col].legend(fontsize=7)
    return fig


def draw_movement(plt: Any, runs: Sequence[Mapping[str, Any]], s: Mapping[str, Any], colors: Mapping[str, str],
                  lrs: Sequence[float]) -> Any:
    """Each registered run's movement by each step up to its collapse (:data:`.movement.MEASURES`, one row each), one
    line per run, one column per learning rate; a cross where the run collapsed, a triangle where a censored one
    ended."""
    ends = {(p["arm"], p["lr"], p["seed"]): (p["collapse_time"], p["event"]) for p in s["points"]}
    fig, axes = plt.subplots(len(MEASURES), len(lrs), figsize=(6 * len(lrs), 3 * len(MEASURES)), squeeze=False,
                             sharex=True)
    for col, lr in enumerate(lrs):
        for row, measure in enumerate(MEASURES):
            ax = axes[row][col]
            for arm, color in colors.items():
                mine = [r for r in runs if r["method"] == arm and same_lr(r["lr"], lr)
                        and (arm, r["lr"], r["seed"]) in ends]
                for r in mine:
                    time, event = ends[(arm, r["lr"], r["seed"])]
                    steps = sorted({int(x["step"]) for x in r["records"] if int(x["step"]) <= time})
                    ys = [movement(r["records"], t, measure) for t in steps]
                    ax.plot(steps, ys, color=color, lw=0.8, alpha=0.6,
                            label=f"{arm} (one line per seed)" if r is mine[0] else None)
                    ax.plot(steps[-1:], ys[-1:], "x" if event else ">", color=color, ms=7)
            ax.set(ylabel=MEASURE_NAMES[measure], title=f"lr {lr:g} (x: collapse, >: censored)" if row == 0 else "")
            if row == len(MEASURES) - 1:
                ax.set_xlabel("step")
        if axes[0][col].get_legend_handles_labels()[0]:
            axes[0][col].legend(fontsize=7)
    return fig




def compared_arms(reg: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The arms whose step sizes a mechanism or matched-control hypothesis compares, each at its rate: the treatment
    first, then its controls (the rate each ran at; the treatment's when it ran at several)."""
    out: list[tuple[str, float]] = []
    for spec in reg["hypotheses"].values():
        controls = spec.get("controls") or ([spec["matched_control"]] if "matched_control" in spec else [])
        if not controls:
            continue
        lr = float(reg["lrs"][spec["lr"]]) if isinstance(spec["lr"], str) else float(spec["lr"])
        for arm in (spec["treatment"], *controls):
            rates = [float(x) for x in reg["arms"][arm]["lrs"]]
            pick = lr if any(same_lr(lr, x) for x in rates) else rates[0]
            if (arm, pick) not in out:
                out.append((arm, pick))
    return out


def mean_by_step(runs: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Per step after 0 that any run logged ``key`` at: the mean over the runs that did."""
    by_step = values_by_step(runs, key)
    return list(by_step), [sum(v) / len(v) for v in by_step.values()]


def draw_step_kl(plt: Any, runs: Sequence[Mapping[str, Any]], s: Mapping[str, Any], reg: Mapping[str, Any],
                 colors: Mapping[str, str]) -> Any:
    """Per-step KL against the step for the treatment and its step-size controls (thin: each run; thick: the mean
    over runs; dashed black: the trust-region target where an arm followed one), the learning-rate warm-up and the
    registered step-size window marked: whether a control took the treatment's step size, step by step."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    warm = s.get("warmup_steps")
    if warm:
        ax.axvspan(0.5, warm + 0.5, color="0.9", label=f"learning-rate warm-up (steps 1-{warm})")
    first, last = s["step_size_window"]
    ax.axvline(first - 0.5, color="0.5", ls=":", lw=1)
    ax.axvline(last + 0.5, color="0.5", ls=":", lw=1, label=f"registered step-size window ({first}-{last})")
    target_drawn = False
    for arm, lr in compared_arms(reg):
        mine = [r for r in runs if r["method"] == arm and same_lr(r["lr"], lr)]
        for r in mine:
            pts = [(x["step"], x["lld/step_kl"]) for x in r["records"] if finite(x.get("lld/step_kl"))
                   and x["step"] > 0]
            if pts:
                ax.plot(*zip(*pts), color=colors[arm], **SEED_LINE)
        steps, means = mean_by_step(mine, "lld/step_kl")
        if steps:
            ax.plot(steps, means, color=colors[arm], **MEAN_LINE,
                    label=f"{arm} (lr {lr:g}): bold the mean of {len(mine)} seeds, thin each seed")
        t_steps, targets = mean_by_step(mine, "step_size/target_kl")
        if t_steps and not target_drawn:
            ax.plot(t_steps, targets, color="k", ls="--", lw=1.2, label="trust-region target")
            target_drawn = True
    ax.set_ylim(bottom=1e-4)  # a dead policy's steps (KL ~ 0) would squash the rest
    ax.set(yscale="log", xlabel="step", ylabel="per-step KL (lld/step_kl)",
           title="step size per step: the treatment and its step-size controls")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return fig
