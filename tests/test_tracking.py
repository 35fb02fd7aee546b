"""Tracking: metrics.jsonl (NaN -> null, resume truncation), PNG plots with phase bands, progress bar off."""

import json
from types import SimpleNamespace

from searchr1_lld.tracking import PLOTS, Tracker, read_metrics


def _cfg(plot_every=2):
    return SimpleNamespace(wandb=False, wandb_project="x", wandb_mode="offline", plot_every=plot_every, progress_bar=False)


def test_metrics_jsonl_and_plots(tmp_path):
    tr = Tracker(tmp_path, _cfg(), {"a": 1}, total_steps=4)
    phases = ["healthy", "early_stagnation", "steady_decay", "accelerated_collapse"]
    for step in range(1, 5):
        tr.log(step, {"reward/em_mean": 0.1 * step, "lld/rate": float("nan"), "actor/grad_norm": 1.0 * step,
                      "phase/name": phases[step - 1]})
    tr.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert json.loads(lines[0])["lld/rate"] is None
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 4 and rows[-1]["reward/em_mean"] == 0.4
    for name in PLOTS:
        png = tmp_path / "plots" / name
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_resume_drops_steps_beyond_checkpoint(tmp_path):
    tr = Tracker(tmp_path, _cfg(plot_every=0), total_steps=0)
    for step in (1, 2, 3):
        tr.log(step, {"reward/em_mean": float(step)})
    tr.close()
    tr2 = Tracker(tmp_path, _cfg(plot_every=0), start_step=2)
    tr2.log(3, {"reward/em_mean": 30.0})
    tr2.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward/em_mean"] == 30.0


def test_disabled_tracker_writes_nothing(tmp_path):
    tr = Tracker(tmp_path / "x", _cfg(), enabled=False)
    tr.log(1, {"a": 1.0})
    tr.close()
    assert not (tmp_path / "x").exists()


def test_plots_put_one_quantity_per_axis_and_legends_outside_the_data(tmp_path, monkeypatch):
    """EM (~0.02) and valid searches (~1.1) never share an axis (EM would be a flat line); no legend covers data."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend

    from searchr1_lld.tracking import plot_metrics

    figures = {}
    real_savefig = Figure.savefig

    def capture(self, path, *a, **kw):
        figures[str(path).rsplit("/", 1)[-1]] = self
        return real_savefig(self, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", capture)
    phases = ["healthy"] * 4 + ["early_stagnation"] * 3 + ["steady_decay"] * 3
    keys = {k for _, panels_or_keys in PLOTS.values() for p in panels_or_keys for k in (p[1] if isinstance(p, tuple) else [p])}
    records = [{"step": s, "phase/name": phases[s - 1], **{k: 0.01 * s for k in keys},
                "reward/em_mean": 0.02 + 0.001 * s, "rollout/valid_searches_mean": 1.1 + 0.01 * s} for s in range(1, 11)]
    plot_metrics(records, tmp_path)
    assert set(figures) == set(PLOTS)
    reward_axes = [ax for ax in figures["reward.png"].axes if ax.get_lines()]
    on_axis = [{line.get_label() for line in ax.get_lines()} for ax in reward_axes]
    assert not any({"reward/em_mean", "rollout/valid_searches_mean"} <= labels for labels in on_axis), on_axis
    for name, fig in figures.items():
        fig.canvas.draw()
        data_right = max(ax.get_window_extent().x1 for ax in fig.axes)
        legends = [c for ax in fig.axes for c in ax.get_children() if isinstance(c, Legend)]
        assert legends, name
        for leg in legends:
            box = leg.get_window_extent()
            assert box.x0 >= data_right, f"{name}: a legend overlaps the plotting area"
            assert box.x1 <= fig.bbox.x1 + 1, f"{name}: a legend is cut off at the figure's edge"
