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
