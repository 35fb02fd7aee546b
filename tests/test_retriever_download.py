"""``python -m retriever download wiki18``: offline and disk-space refusals (exit 2, one line) and the join of the
e5 index's parts, with the hub download replaced by local files (no network here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retriever import download
from retriever.__main__ import main

REPO = Path(__file__).resolve().parents[1]


def _error_lines(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def test_offline_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "retriever", "download", "wiki18", "--out", str(tmp_path / "w"),
                           "--quiet"], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = _error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "wiki-18.jsonl.gz" in lines[0] and "HF_HUB_OFFLINE" in lines[0]


def test_not_enough_disk_names_the_sizes(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: type("U", (), {"total": 10**12, "used": 0, "free": 3_000_000_000})())
    monkeypatch.setattr(download, "fetch", lambda *a: calls.append(a))
    assert main(["download", "wiki18", "--out", str(tmp_path), "--index", "e5", "--quiet"]) == 2
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "not enough disk space" in lines[0], lines
    need = download.APPROX_BYTES["wiki-18.jsonl.gz"] + download.APPROX_BYTES["e5_Flat.index"] \
        + download.APPROX_PART_AB_BYTES
    assert f"{need / 1e9:.1f} GB" in lines[0] and "3.0 GB free" in lines[0]
    assert calls == []  # nothing fetched before the check


def test_corpus_only_fits_where_the_index_would_not(tmp_path, monkeypatch):
    free = download.APPROX_BYTES["wiki-18.jsonl.gz"] + 1
    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: type("U", (), {"total": 10**12, "used": 0, "free": free})())
    fetched = []
    monkeypatch.setattr(download, "fetch", lambda repo, name, out: fetched.append(name) or out / name)
    assert download.download_wiki18(tmp_path)["corpus"] == tmp_path / "wiki-18.jsonl.gz"
    assert fetched == ["wiki-18.jsonl.gz"]
    with pytest.raises(download.DownloadError, match="not enough disk space"):
        download.download_wiki18(tmp_path, index="e5")


def test_index_parts_are_joined_and_removed(tmp_path, monkeypatch, capsys):
    src = {"wiki-18.jsonl.gz": b"corpus bytes", "part_aa": bytes(range(256)) * 40, "part_ab": b"\x00tail\xff" * 7}
    calls = []

    def fake_hf_hub_download(repo_id, filename, *, repo_type=None, local_dir=None, **kw):
        calls.append((repo_id, filename, repo_type))
        path = Path(local_dir) / filename
        path.write_bytes(src[filename])
        return str(path)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    monkeypatch.setattr(download.shutil, "disk_usage",  # this machine need not have the real ~100 GB free
                        lambda p: type("U", (), {"total": 10**12, "used": 0, "free": 500 * 10**9})())
    out = tmp_path / "wiki18"
    assert main(["download", "wiki18", "--out", str(out), "--index", "e5", "--quiet"]) == 0
    assert (out / "e5_Flat.index").read_bytes() == src["part_aa"] + src["part_ab"]
    assert not (out / "part_aa").exists() and not (out / "part_ab").exists()
    assert (out / "wiki-18.jsonl.gz").read_bytes() == src["wiki-18.jsonl.gz"]
    assert calls == [("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "dataset"),
                     ("PeterJinGo/wiki-18-e5-index", "part_aa", "dataset"),
                     ("PeterJinGo/wiki-18-e5-index", "part_ab", "dataset")]
    assert str(out / "e5_Flat.index") in capsys.readouterr().out

    calls.clear()  # a second run keeps the joined index and fetches no part again
    assert main(["download", "wiki18", "--out", str(out), "--index", "e5", "--quiet"]) == 0
    assert [c[1] for c in calls] == ["wiki-18.jsonl.gz"]
    assert (out / "e5_Flat.index").read_bytes() == src["part_aa"] + src["part_ab"]
