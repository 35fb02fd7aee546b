"""Tracking: metrics.jsonl (NaN -> null, resume truncation), PNG plots with phase bands, progress bar off."""

import json
import time
from types import SimpleNamespace

from searchr1_lld.bookkeeping.tracking import PLOTS, Tracker, read_metrics


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

    from searchr1_lld.bookkeeping.tracking import plot_metrics

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


_LIBRARY_NOISE_SCRIPT = """
import sys
from searchr1_lld.bookkeeping.tracking import quiet_library_output
if sys.argv[1] == "quiet":
    quiet_library_output()
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[2])
model.save_pretrained(sys.argv[3], max_shard_size="100KB")  # several shards: the shard-writing bar
from deepspeed.accelerator import get_accelerator
get_accelerator()
"""


def test_quiet_library_output_silences_loading_bars_and_the_deepspeed_line(tiny_world, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    noise = ("Loading weights", "Writing model shards", "Setting accelerator")
    outs = {}
    for mode in ("loud", "quiet"):
        proc = subprocess.run([sys.executable, "-c", _LIBRARY_NOISE_SCRIPT, mode, str(tiny_world / "model"),
                               str(tmp_path / mode)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[mode] = proc.stdout + proc.stderr
    if not __import__("torch").cuda.is_available():
        assert all(n in outs["loud"] for n in noise), outs["loud"][-2000:]  # the noise is real without the call
    assert not any(n in outs["quiet"] for n in noise), outs["quiet"][-2000:]


def test_final_training_bar_is_printed_once(tmp_path, capsys):
    cfg = SimpleNamespace(wandb=False, wandb_project="x", wandb_mode="offline", plot_every=0, progress_bar=True)
    tr = Tracker(tmp_path, cfg, total_steps=3)
    for step in (1, 2, 3):
        tr.log(step, {"reward/em_mean": 0.5})
    tr.write("| a table printed after training |")
    tr.close()
    err = capsys.readouterr().err
    finals = [part for part in err.replace("\r", "\n").splitlines() if "3/3" in part]
    assert len(finals) == 1, finals


def _wandb_cfg(**kw):
    return SimpleNamespace(**{**dict(wandb=True, wandb_project="searchr1-lld-test", wandb_mode="offline",
                                     wandb_entity=None, wandb_group="cell-a", wandb_tags=["t1", "t2"], wandb_name="",
                                     plot_every=0, progress_bar=False), **kw})


def test_wandb_run_id_is_stored_and_reused_on_restart(tmp_path, monkeypatch):
    """Offline wandb: the first start stores the run id in the run directory, a restart resumes that same run
    (resume="allow"); group and tags from the config reach wandb; credentials are left to wandb."""
    import wandb

    from searchr1_lld.bookkeeping.tracking import WANDB_RUN_FILE

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    api_key = "dummy-key-of-the-user-0123456789012345678901"
    monkeypatch.setenv("WANDB_API_KEY", api_key)
    seen = []
    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.append(kw) or real_init(**kw))
    tr = Tracker(tmp_path, _wandb_cfg(), {"a": 1}, total_steps=2)
    tr.log(1, {"reward/em_mean": 0.5})
    first_id = tr._wandb.id
    tr.close()
    stored = json.loads((tmp_path / WANDB_RUN_FILE).read_text())["id"]
    assert stored == first_id
    tr = Tracker(tmp_path, _wandb_cfg(), {"a": 1}, total_steps=2, start_step=1)
    tr.log(2, {"reward/em_mean": 0.6})
    assert tr._wandb.id == first_id
    tr.close()
    assert [kw["id"] for kw in seen] == [first_id, first_id] and all(kw["resume"] == "allow" for kw in seen)
    assert seen[0]["group"] == "cell-a" and seen[0]["tags"] == ["t1", "t2"] and seen[0]["name"] == tmp_path.name
    # both starts wrote under one wandb run id (wandb names the dir by start time to the second: two starts in one
    # second share it)
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert run_dirs and all(d.name.endswith(f"-{first_id}") for d in run_dirs)
    import os

    assert os.environ["WANDB_API_KEY"] == api_key  # not touched


def test_eval_results_table_rows():
    from searchr1_lld.bookkeeping.tracking import EVAL_TABLE_COLUMNS, eval_table_rows

    res = {"datasets": {"nq": {"n": 4, "em": 0.5, "f1": 0.6}, "hotpotqa": {"n": 2, "em": 0.0, "f1": 0.1}},
           "average_em": 0.25, "n": 6}
    rows = eval_table_rows([("m", res)])
    assert [r[:4] for r in rows] == [["m", "nq", 4, 0.5], ["m", "hotpotqa", 2, 0.0], ["m", "Avg.", 6, 0.25]]
    assert all(len(r) == len(EVAL_TABLE_COLUMNS) for r in rows)
    assert rows[0][EVAL_TABLE_COLUMNS.index("f1")] == 0.6


def test_online_mode_is_left_to_wandb_credentials(tmp_path, monkeypatch):
    """A `wandb login` user (netrc entry, no WANDB_API_KEY) gets an online start: the mode is not decided here."""
    import wandb

    from searchr1_lld.bookkeeping.tracking import init_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or SimpleNamespace(id=kw["id"]))
    run = init_wandb(tmp_path / "run", _wandb_cfg(wandb_mode="online"), {}, name="r")
    assert [c["mode"] for c in calls] == ["online"] and run.id == calls[0]["id"]


def test_online_without_credentials_says_so_and_logs_offline(tmp_path, monkeypatch):
    import pytest

    from searchr1_lld.bookkeeping.tracking import init_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.warns(UserWarning, match="could not start online .*logging offline instead"):
        run = init_wandb(tmp_path / "run", _wandb_cfg(wandb_mode="online"), {}, name="r")
    try:
        assert run.settings.mode == "offline"
    finally:
        run.finish()


def test_the_training_bar_starts_when_training_does(tmp_path, capsys):
    """What runs before the first step (the evaluation before training) is not on the training bar's clock."""
    cfg = SimpleNamespace(wandb=False, wandb_project="x", wandb_mode="offline", plot_every=0, progress_bar=True)
    tr = Tracker(tmp_path, cfg, total_steps=2)
    time.sleep(1.5)
    assert "train" not in capsys.readouterr().err  # no bar yet
    tr.start_bar()
    for step in (1, 2):
        tr.log(step, {"reward/em_mean": 0.5})
    tr.close()
    final = [part for part in capsys.readouterr().err.replace("\r", "\n").splitlines() if "2/2" in part]
    assert len(final) == 1 and "[00:00<" in final[0], final
