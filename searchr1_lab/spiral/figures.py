"""The calibration's figure of one setting: the series the signature reads against step, one line per seed, with
the warm-up's end and each run's learning phase marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.frontier.figures import _pyplot
from searchr1_lab.plots import _series

# panel -> the metrics drawn in it (label, key)
PANELS = {"training reward and held-out EM": (("reward", "reward/em_mean"), ("held-out EM", "eval/val_sub_em")),
          "probe set: log-likelihood of correct responses (nats/token)": (("probe", "probe/logp_per_token"),),
          "entropy (nats/token)": (("entropy", "actor/entropy"),),
          "gradient norm before clipping": (("gradient norm", "actor/grad_norm"),)}
# the panels whose explosion threshold (k x the learning-phase level, the signature's (c)) is drawn: key -> level
LEVELS = {"actor/entropy": "entropy_level", "actor/grad_norm": "grad_norm_level"}


def setting_figure(runs: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], title: str,
                   path: Path, explosion_ratio: float) -> Path:
    """One row of panels (:data:`PANELS`) for the runs of one setting; ``rows``: their report rows (the learning
    phase's bounds and the warm-up's end, drawn dotted; ``explosion_ratio`` x the learning-phase level of entropy and
    gradient norm, dashed)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 2.8), sharex=True)
    for ax, (panel, metrics) in zip(axes, PANELS.items()):
        for run in runs:
            for label, key in metrics:
                xs, ys = _series(run["records"], key)
                marker = "o" if key == "eval/val_sub_em" else None
                ax.plot(xs, ys, lw=0.9, marker=marker, ms=2, label=f"{label}, seed {run['seed']}")
        for row in rows:
            learning = row["signature"]["learning"]["evidence"]
            for step in (row["warmup_end"], learning.get("start"), learning.get("peak")):
                if step is not None:
                    ax.axvline(step, ls=":", lw=0.7, color="grey")
            for _, key in metrics:
                level = row["signature"]["explosion"]["evidence"].get(LEVELS.get(key, ""))
                if level is not None:
                    ax.axhline(explosion_ratio * level, ls="--", lw=0.7, color="grey")
        if any(key == "actor/grad_norm" for _, key in metrics) and ax.has_data():
            ax.set_yscale("log")
        ax.set_title(panel, fontsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=6)
        if len(metrics) > 1 or len(runs) > 1:
            ax.legend(fontsize=5)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
