"""Metrics tracking: a local ``metrics.jsonl`` (always), wandb (when configured), a tqdm bar, and PNG plots.

    tracker = Tracker(run_dir, cfg.logging, config_dict, total_steps=cfg.trainer.total_steps)
    tracker.log(step, metrics)      # one JSON line per step; wandb.log; bar postfix; plots every plot_every steps
    tracker.close()                 # final plots, wandb.finish

Only the main process writes (pass ``enabled=False`` on the others). Non-finite floats are written to JSON as
``null``.

wandb (:func:`init_wandb`, imported lazily): the mode is $WANDB_MODE when set, else ``logging.wandb_mode``; the
credentials are wandb's own (``wandb login``'s netrc entry, or $WANDB_API_KEY), never overridden here. The run id
is stored in ``RUN/wandb_run.json`` at the first start and passed back with ``resume="allow"`` on every restart,
so a resumed run continues the same wandb run (one set of curves). An online start that wandb refuses (no
credentials, no network) is reported in one warning and logs offline instead (``wandb sync RUN/wandb/offline-run-*``
uploads it later); a failing wandb never stops training.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import LoggingConfig
from searchr1_lld.instruments.phases import PHASES
from searchr1_lld.data.jsonl import read_jsonl

def describe_machine() -> str:
    """This CPU's model name and core count, e.g. ``AMD EPYC 7B13, 2 cores`` (a CPU run's figures depend on the CPU;
    the demo's and the lab's summaries record it)."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


# Key figures shown on the progress bar (short label -> metric name).
BAR_FIGURES = {
    "em": "reward/em_mean",
    "lld": "lld/rate",
    "dC": "lld/correct_delta_per_token",
    "H": "actor/entropy",
    "gn": "actor/grad_norm",
    "llds": "llds/active_token_frac",
}

# Plots: file name -> (title, panels); a panel is (y-axis label, [metric names]) and holds one quantity, so curves of
# different scales never share an axis (panels are stacked, sharing the step axis).
PLOTS: dict[str, tuple[str, list[tuple[str, list[str]]]]] = {
    "reward.png": ("reward and search behaviour", [
        ("EM (sampled responses)", ["reward/em_mean"]),
        ("valid searches / response", ["rollout/valid_searches_mean"]),
    ]),
    "likelihood.png": ("mean log-likelihood per token of correct / incorrect responses", [
        ("nats / token", ["lld/correct_logp_old_per_token", "lld/incorrect_logp_old_per_token",
                          "probe/logp_per_token"]),
    ]),
    "delta.png": ("likelihood displacement Delta = logp_new - logp_old, and the LLD rate", [
        ("Delta (nats / token)", ["lld/correct_delta_per_token", "lld/incorrect_delta_per_token"]),
        ("LLD rate (fraction)", ["lld/rate"]),
    ]),
    "entropy.png": ("policy entropy (generated tokens)", [("nats", ["actor/entropy"])]),
    "grad_norm.png": ("gradient norm before clipping", [("L2 norm", ["actor/grad_norm"])]),
    "llds.png": ("LLDS activity", [
        ("fraction", ["llds/active_token_frac", "llds/gated_responses_frac", "llds/gated_actions_frac"]),
        ("LLDS loss", ["llds/loss"]),
    ]),
}

PHASE_COLORS = {"healthy": "#d9f2d9", "early_stagnation": "#fff3c4", "steady_decay": "#ffd8a8", "accelerated_collapse": "#ffb3b3"}


# Progress bars of libraries that tell the user nothing here (one per model load / save, done in well under a second for
# the tiny policy; the phase they belong to has its own bar). Download bars of the hub are kept.
SILENCED_LIBRARY_BARS = ("Loading weights", "Writing model shards")


def quiet_library_output() -> None:
    """Silence third-party output that is noise to the user of a CLI: DeepSpeed's "Setting accelerator to CPU" line
    (DS_ACCELERATOR=cpu is set when there is no GPU and the user has not chosen one) and the transformers bars named in
    :data:`SILENCED_LIBRARY_BARS`. Call once at the start of an entry point, before the libraries are used."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return
    if not hasattr(hf_logging, "set_tqdm_hook"):  # pragma: no cover - older transformers
        return

    def hook(factory, args, kwargs):
        if kwargs.get("desc") in SILENCED_LIBRARY_BARS:
            kwargs = {**kwargs, "disable": True}
        return factory(*args, **kwargs)

    hf_logging.set_tqdm_hook(hook)


class ticking:
    """``with ticking(bar):`` redraws a tqdm bar every ``interval`` seconds from a background thread, so a phase whose
    steps are long (a world-build stage) still shows its elapsed time moving."""

    def __init__(self, bar: Any, interval: float = 1.0):
        import threading

        self.bar, self.interval = bar, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        fp = getattr(self.bar, "fp", None)
        if getattr(self.bar, "disable", False) or not (fp is not None and hasattr(fp, "isatty") and fp.isatty()):
            return  # nothing drawn, or a log file (a redraw per second would only fill it)
        while not self._stop.wait(self.interval):
            self.bar.refresh()

    def __enter__(self) -> Any:
        self._thread.start()
        return self.bar

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # tensors / numpy scalars
        return _jsonable(value.item())
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` back (``null`` -> NaN)."""
    return [{k: (float("nan") if v is None else v) for k, v in row.items()} for row in read_jsonl(path)]


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v) and r.get("step") is not None:
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def make_figure(records: Sequence[dict[str, Any]], title: str, panels: list[tuple[str, list[str]]]) -> Any:
    """One figure of :data:`PLOTS`: a panel per quantity (stacked, shared step axis), phase bands in the background,
    every legend right of the panels, outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    steps = [r.get("step") for r in records]
    phases = [r.get("phase/name") for r in records]
    present = [p for p in PHASES if p in phases]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.2 + 2.3 * len(panels)), sharex=True, squeeze=False)
    for ax, (ylabel, keys) in zip(axes[:, 0], panels):
        for s, ph in zip(steps, phases):  # phase bands
            if ph in PHASE_COLORS and s is not None:
                ax.axvspan(s - 0.5, s + 0.5, color=PHASE_COLORS[ph], lw=0, zorder=0)
        for key in keys:
            xs, ys = _series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o", ms=3, label=key, zorder=2)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[0, 0].set_title(title, fontsize=9)
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if present:  # one phase legend for the figure, right of the last panel, below its metric legend
        ax = axes[-1, 0]
        if ax.get_legend() is not None:
            ax.add_artist(ax.get_legend())
        ax.legend(handles=[Patch(color=PHASE_COLORS[p], label=p) for p in present], title="phase", fontsize=7,
                  title_fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0), borderaxespad=0)
    fig.tight_layout(rect=(0.0, 0.0, 0.74, 1.0))  # the right quarter holds the legends
    return fig


def plot_metrics(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the PNG plots of :data:`PLOTS` to ``out_dir``; returns the paths."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, (title, panels) in PLOTS.items():
        fig = make_figure(records, title, panels)
        path = out_dir / fname
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


WANDB_RUN_FILE = "wandb_run.json"  # {"id": ...} of the run's wandb run, reused on restart


def wandb_run_id(run_dir: str | Path) -> tuple[str, bool]:
    """(the wandb run id stored in ``run_dir``, True) or (a new id, False), stored in ``run_dir`` now (before
    wandb starts, so a crash during the first step still restarts into the same run)."""
    path = Path(run_dir) / WANDB_RUN_FILE
    if path.is_file():
        try:
            return str(json.loads(path.read_text())["id"]), True
        except (ValueError, KeyError, TypeError):
            warnings.warn(f"{path} is unreadable: a new wandb run id is stored")
    import secrets
    import string

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # wandb's id form
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": run_id}) + "\n")
    return run_id, False


def init_wandb(run_dir: str | Path, logging_cfg: LoggingConfig, config: dict[str, Any], *, name: str,
               job_type: str = "train") -> Any:
    """A wandb run for ``run_dir`` (its files under ``run_dir/wandb``) with the ``logging.wandb_*`` settings
    (project, entity, group, tags), resumed by the id stored in ``run_dir`` (:func:`wandb_run_id`); None when wandb
    cannot start (one warning says why)."""
    mode = os.environ.get("WANDB_MODE") or logging_cfg.wandb_mode
    try:
        import wandb
    except ImportError:
        warnings.warn("logging.wandb=true but wandb is not installed (pip install wandb): wandb disabled")
        return None
    run_id, _ = wandb_run_id(run_dir)
    kwargs = dict(project=logging_cfg.wandb_project, entity=getattr(logging_cfg, "wandb_entity", None) or None,
                  group=getattr(logging_cfg, "wandb_group", "") or None,
                  tags=list(getattr(logging_cfg, "wandb_tags", []) or []) or None, job_type=job_type,
                  name=getattr(logging_cfg, "wandb_name", "") or name, config=config, dir=str(run_dir),
                  id=run_id, resume="allow")
    try:
        return wandb.init(mode=mode, **kwargs)
    except Exception as e:  # tracking must never stop training
        if mode != "online":
            warnings.warn(f"wandb disabled: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
            return None
        warnings.warn(f"logging.wandb_mode=online: wandb could not start online ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:300]}); logging offline instead (run `wandb login` or set "
                      f"WANDB_API_KEY, then `wandb sync {Path(run_dir) / 'wandb'}/offline-run-*`)")
    try:
        return wandb.init(mode="offline", **kwargs)
    except Exception as e:
        warnings.warn(f"wandb disabled: {type(e).__name__}: {e}")
        return None


EVAL_TABLE_COLUMNS = ("name", "dataset", "n", "em", "sub_em", "f1", "mean_valid_searches", "mean_turns",
                      "invalid_action_rate", "truncation_rate", "answer_rate")


def eval_table_rows(methods: Sequence[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    """Rows of :data:`EVAL_TABLE_COLUMNS`: one per (method, dataset), then one ``Avg.`` row per method (its
    ``average_em`` in the em column, its question count in n, the other columns empty)."""
    rows = []
    for name, res in methods:
        for dataset, m in res["datasets"].items():
            rows.append([name, dataset] + [m.get(c) for c in EVAL_TABLE_COLUMNS[2:]])
        rows.append([name, "Avg.", res["n"], res["average_em"]] + [None] * (len(EVAL_TABLE_COLUMNS) - 4))
    return rows


def log_eval_results(run: Any, methods: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """An evaluation's results to a wandb run: the table ``eval/results`` (:func:`eval_table_rows`) and, in the
    run's summary, ``eval/<dataset>/em`` and ``eval/avg_em`` (prefixed by the method's name when there are several)."""
    import wandb

    run.log({"eval/results": wandb.Table(columns=list(EVAL_TABLE_COLUMNS), data=eval_table_rows(methods))})
    for name, res in methods:
        prefix = "eval/" if len(methods) == 1 else f"eval/{name}/"
        for dataset, m in res["datasets"].items():
            run.summary[f"{prefix}{dataset}/em"] = m["em"]
        run.summary[f"{prefix}avg_em"] = res["average_em"]


class Tracker:
    """metrics.jsonl + optional wandb + tqdm bar + periodic plots for one run."""

    def __init__(
        self,
        run_dir: str | Path,
        logging_cfg: LoggingConfig,
        config: dict[str, Any] | None = None,
        *,
        total_steps: int = 0,
        start_step: int = 0,
        enabled: bool = True,
        run_name: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.cfg = logging_cfg
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.plot_dir = self.run_dir / "plots"
        self._wandb = None
        self._bar = None
        self._bar_steps: tuple[int, int] | None = None  # (total, first) steps of the bar start_bar shows
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.metrics_path.exists():  # resumed run: keep earlier steps, drop any beyond the resume point
            kept = [r for r in read_metrics(self.metrics_path) if r.get("step", 0) <= start_step]
            self.records = kept
            with open(self.metrics_path, "w") as f:
                for r in kept:
                    f.write(json.dumps(_jsonable(r)) + "\n")
        if getattr(logging_cfg, "wandb", False) and logging_cfg.wandb_mode != "disabled":
            self._init_wandb(config or {}, run_name or self.run_dir.name)
        if getattr(logging_cfg, "progress_bar", True) and total_steps and start_step < total_steps:
            self._bar_steps = (total_steps, start_step)

    def start_bar(self) -> None:
        """Show the training bar from now on (its clock and rate then count training only, not what ran before the
        first step, such as the evaluation before training); the first :meth:`log` starts it otherwise."""
        if self._bar_steps is None:
            return
        from tqdm.auto import tqdm

        total, start = self._bar_steps
        self._bar_steps = None
        self._bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)

    def _init_wandb(self, config: dict[str, Any], name: str) -> None:
        self._wandb = init_wandb(self.run_dir, self.cfg, config, name=name, job_type="train")

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        """``metrics`` of ``step`` to metrics.jsonl and wandb, the progress bar untouched (e.g. measurements before the
        first step, step 0)."""
        if not self.enabled:
            return
        row = {"step": step, **metrics}
        self.records.append(row)
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(_jsonable(row)) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in _jsonable(metrics).items() if v is not None}, step=step)
            except Exception as e:
                warnings.warn(f"wandb.log failed, disabling wandb: {e}")
                self._wandb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A training step's ``metrics``: :meth:`record`, the progress bar advanced, the plots on schedule."""
        if not self.enabled:
            return
        self.start_bar()
        self.record(step, metrics)
        if self._bar is not None:
            post = {}
            for label, key in BAR_FIGURES.items():
                v = metrics.get(key)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    post[label] = f"{v:.3g}"
            if "phase/name" in metrics:
                post["phase"] = metrics["phase/name"]
            self._bar.set_postfix(post, refresh=False)
            if self._bar.total and self._bar.n + 1 >= self._bar.total:
                # last step: count it without drawing and close, which draws the final state once (messages after
                # training are then printed below it, not around a redrawn bar)
                self._bar.n += 1
                self._bar.close()
                self._bar = None
            else:
                self._bar.update(1)
        every = getattr(self.cfg, "plot_every", 0)
        if every and step % every == 0:
            self.plot()

    def write(self, message: str) -> None:
        """Print a message without breaking the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def plot(self) -> list[Path]:
        if not self.enabled or not self.records:
            return []
        return plot_metrics(self.records, self.plot_dir)

    def close(self) -> None:
        if not self.enabled:
            return
        self.plot()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:
                pass
            self._wandb = None
