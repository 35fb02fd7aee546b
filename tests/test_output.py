"""Console output of long phases: the world build's stage bar, and beneath it the bars of its long stages (the
warm start's training and its measurement)."""

from __future__ import annotations

from types import SimpleNamespace

from searchr1_lld.world.config import WorldConfig


def test_world_build_shows_its_stage_bar_and_the_long_stages_their_own(tmp_path, monkeypatch, capsys):
    import searchr1_lld.world.build as bw
    import searchr1_lld.world.measure as tm
    import searchr1_lld.world.warm_start as tp

    seen = {}

    def record(name, value):
        seen[name] = value

    monkeypatch.setattr(bw, "generate_world", lambda cfg: SimpleNamespace(passages=[], train_rows=[],
                                                                          counts=lambda: {}))
    monkeypatch.setattr(bw, "write_world_files", lambda world, out: {"corpus": out / "corpus.jsonl"})
    monkeypatch.setattr(bw, "build_index", lambda *a, show_progress=True, **k: record("index", show_progress))
    monkeypatch.setattr(bw, "InProcessRetriever", lambda path: SimpleNamespace(search=None))
    monkeypatch.setattr(tp, "build_tiny_policy", lambda *a, progress=True, **k: record("policy", progress) or {})
    monkeypatch.setattr(tm, "measure_warm_start", lambda *a, progress=False, **k: record("measure", progress) or {})
    (tmp_path / "w").mkdir()
    bw.build_world(tmp_path / "w", WorldConfig(), progress=True, measure=True)
    # the index stage draws no bar of its own (seconds); the warm start's training and its measurement (minutes
    # each) draw theirs under the build's
    assert seen == {"index": False, "policy": True, "measure": True}
    err = capsys.readouterr().err
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and all(line.startswith("build world") for line in lines), lines
    assert "4/4 stages" in lines[-1]
