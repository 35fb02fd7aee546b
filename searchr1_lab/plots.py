"""The lab's curves (one panel per metric, thin lines per seed, bold per-method mean over seeds) and the one table of
colours every figure of the lab draws its arms with (:data:`COLOURS`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.methods import Method

# Curves of the report: file stem -> (title, metric name, y label).
CURVES: dict[str, tuple[str, str, str]] = {
    "reward": ("training reward (EM of sampled responses)", "reward/em_mean", "EM"),
    "correct_logp": ("log-likelihood of correct responses", "lld/correct_logp_old_per_token", "nats / token"),
    "incorrect_logp": ("log-likelihood of incorrect responses", "lld/incorrect_logp_old_per_token", "nats / token"),
    "probe_logp": ("probe set: same correct responses re-measured", "probe/logp_per_token", "nats / token"),
    "delta_correct": ("Delta of correct responses (logp_new - logp_old)", "lld/correct_delta_per_token",
                      "nats / token"),
    "entropy": ("policy entropy (generated tokens)", "actor/entropy", "nats"),
    "grad_norm": ("gradient norm before clipping (max over updates)", "actor/grad_norm", "L2 norm"),
    "grad_norm_signal": ("gradient norm, updates with non-zero advantages (max)", "actor/grad_norm_signal",
                         "L2 norm"),
    "llds_active": ("LLDS activity: share of tokens penalised", "llds/active_token_frac", "fraction"),
    "valid_searches": ("valid searches per training response", "rollout/valid_searches_mean", "searches"),
    "val_em": ("validation EM (greedy, every trainer.eval_every steps)", "eval/val_em", "EM"),
}
# drawn only when some run logged them (eval/val_em: runs with trainer.eval_every > 0); the others always are
OPTIONAL_CURVES = ("val_em", "grad_norm_signal")
# drawn on a log axis: one spike before clipping (695 on one LLDS-MA run of the lab, others at 1-10)
# flattens every other run on a linear axis
LOG_SCALE_CURVES = ("grad_norm", "grad_norm_signal")
# One colour per arm, in every figure of the lab (the comparison's and the pre-registered study's curves, the
# step-size and trust-region figures, the frontier, the headline figure): arm -> colour. The doses of one method are
# shades of its colour (LLDS's lambda: light to dark green). tests/test_findings.py checks that every arm of a committed
# study and every method of the lab has a colour of its own here.
COLOURS = {
    # the paper's arms
    "grpo": "#d62728", "llds_action": "#2ca02c", "llds": "#2ca02c", "llds_response": "#1f77b4", "llds_ma": "#9467bd",
    "llds_lam0.05": "#98df8a", "llds_lam1": "#145a14", "llds_action_lam1": "#145a14",
    # the step-size controls
    "grpo_trust_region": "#ff7f0e", "nll_anchor": "#8c564b", "grpo_lr_matched": "#e377c2", "grpo_kl_matched": "#7f7f7f",
    "grpo_kl0.1": "#bcbd22", "grpo_kl1": "#8a8a10",
    # the field's other fixes by name
    "dapo": "#17becf", "dr_grpo": "#9edae5", "gspo": "#aec7e8", "cispo": "#c5b0d5", "clip_cov": "#c49c94",
    "kl_cov": "#f7b6d2", "nthr": "#393b79", "dapo_clip_higher": "#6b6ecf", "sapo": "#637939", "gmpo": "#8ca252",
    "gpg": "#b5cf6b", "dppo_tv": "#8c6d31", "dppo_kl": "#bd9e39", "grpo_passk": "#e7ba52", "opo": "#843c39",
    "rloo": "#ad494a", "reinforce_pp_baseline": "#d6616b", "remax": "#7b4173", "bnpo": "#a55194", "luspo": "#ce6dbd",
    "vespo": "#de9ed6",
}
UNLISTED = "#000000"  # an arm that is not in COLOURS (a new one: add it there)
SEED_LINE = {"lw": 0.8, "alpha": 0.3}  # one seed's line, wherever curves of several seeds are drawn
MEAN_LINE = {"lw": 1.8}                # their mean over seeds


def colour(arm: str) -> str:
    """The colour of ``arm`` in every figure (:data:`COLOURS`)."""
    return COLOURS.get(arm, UNLISTED)


def line_key_handles() -> list:
    """Legend entries that say what thin and bold lines are: one seed, the mean over seeds."""
    from matplotlib.lines import Line2D  # deferred: matplotlib

    return [Line2D([], [], color="0.4", **SEED_LINE, label="thin: one seed"),
            Line2D([], [], color="0.4", **MEAN_LINE, label="bold: mean over seeds")]


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        if finite(r.get(key)):
            xs.append(int(r["step"]))
            ys.append(float(r[key]))
    return xs, ys


def _seed_mean(curves: Sequence[tuple[list[int], list[float]]]) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for xs, ys in curves:
        for x, y in zip(xs, ys):
            by_step.setdefault(x, []).append(y)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def _draw(ax: Any, records_by_run: dict[tuple[str, int], list[dict]], methods: Sequence[Method], key: str) -> None:
    for m in methods:
        curves = [_series(recs, key) for (mk, _), recs in records_by_run.items() if mk == m.key]
        color = colour(m.key)
        for xs, ys in curves:
            if len(curves) > 1:
                ax.plot(xs, ys, color=color, **SEED_LINE)
        xs, ys = _seed_mean(curves)
        if xs:
            ax.plot(xs, ys, color=color, **MEAN_LINE, marker="o", ms=2.5, label=m.label)


def _reference(ax: Any, references: dict[str, tuple[float, str]], key: str) -> None:
    if key in references and finite(references[key][0]):
        value, label = references[key]
        ax.axhline(value, color="black", ls="--", lw=1.0, label=f"{label} ({value:.3f})")


def _panel(ax: Any, records_by_run: dict[tuple[str, int], list[dict]], methods: Sequence[Method], stem: str,
           references: dict[str, tuple[float, str]], fontsize: int) -> None:
    """One curve of :data:`CURVES` on ``ax``: the runs, the reference line, the titles and the axis scale."""
    title, key, ylabel = CURVES[stem]
    _draw(ax, records_by_run, methods, key)
    _reference(ax, references, key)
    if stem in LOG_SCALE_CURVES and ax.has_data():
        ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=fontsize)
    ax.set_ylabel(ylabel, fontsize=8)


def _figure_legend(fig: Any, axes: Any) -> None:
    """One legend above the figure with every label its panels drew, once, and what thin and bold lines are."""
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        handles += line_key_handles()
        labels += [h.get_label() for h in handles[len(labels):]]
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9)


def plot_curves(records_by_run: dict[tuple[str, int], list[dict]], methods: Sequence[Method], out_dir: Path,
                references: dict[str, tuple[float, str]] | None = None) -> list[Path]:
    """One PNG per curve of :data:`CURVES` (of :data:`OPTIONAL_CURVES` only those some run logged; methods
    overlaid: thin = one seed, bold = mean over seeds; :data:`LOG_SCALE_CURVES` on a log axis) and ``overview.png`` with every such curve side by side. ``references``: metric name -> (value, label),
    drawn as a dashed horizontal line (e.g. the warm start's test EM). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    references = references or {}
    curves = {stem: spec for stem, spec in CURVES.items() if stem not in OPTIONAL_CURVES
              or any(finite(r.get(spec[1])) for recs in records_by_run.values() for r in recs)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / f"{stem}.png" for stem in CURVES.keys() - curves.keys()):
        stale.unlink(missing_ok=True)  # a curve an earlier report of this dir drew
    written = []
    for stem in curves:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        _panel(ax, records_by_run, methods, stem, references, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(handles=[*ax.get_legend_handles_labels()[0], *line_key_handles()], fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    cols = 3
    rows = math.ceil(len(curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3 * rows), squeeze=False)
    for ax, stem in zip(axes.flat, curves):
        _panel(ax, records_by_run, methods, stem, references, fontsize=8)
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    _figure_legend(fig, axes)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = out_dir / "overview.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written




# The comparison's figure: rows = these curves (short titles), columns = learning rates.
GRID_ROWS = {"val_em": "validation EM (greedy)", "reward": "training reward", "correct_logp":
             "log-likelihood of correct responses", "grad_norm": "gradient norm", "entropy": "entropy"}


def plot_grid(runs: Sequence[dict[str, Any]], methods: Sequence[Method], lrs: Sequence[float], path: Path,
              references: dict[str, tuple[float, str]] | None = None, rows: dict[str, str] | None = None) -> Path:
    """One PNG of the comparison: a column per learning rate, a row per curve of ``rows`` (stem of :data:`CURVES`
    -> short title; default :data:`GRID_ROWS`); in each panel the methods overlaid (thin = one seed, bold = mean
    over seeds). ``runs``: compact run records (``method``, ``seed``, ``lr``, ``records``); ``references`` as in
    :func:`plot_curves`. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    references = references or {}
    rows = rows or GRID_ROWS
    fig, axes = plt.subplots(len(rows), len(lrs), figsize=(4.2 * len(lrs), 2.6 * len(rows)),
                             squeeze=False, sharex=True)
    for col, lr in enumerate(lrs):
        by_run = {(r["method"], r["seed"]): r["records"] for r in runs if r["lr"] == lr}
        for row, stem in enumerate(rows):
            ax = axes[row][col]
            _panel(ax, by_run, methods, stem, references, fontsize=8)
            ax.set_title(f"lr {lr:g}: {rows[stem]}", fontsize=9)
    for row, stem in enumerate(rows):  # one y range per row, so the learning rates compare at a glance
        drawn = [axes[row][c] for c in range(len(lrs)) if axes[row][c].has_data()]  # empty panels: 0..1 by default
        if stem not in LOG_SCALE_CURVES and drawn:
            lows, highs = zip(*(ax.get_ylim() for ax in drawn))
            for c in range(len(lrs)):
                axes[row][c].set_ylim(min(lows), max(highs))
    _figure_legend(fig, axes)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.39 / fig.get_figheight()))  # 0.39 in above for the legend
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
