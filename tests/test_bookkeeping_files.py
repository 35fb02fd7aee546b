"""Small JSON records written whole or not at all."""

from __future__ import annotations

import json

import pytest

from searchr1_lld.bookkeeping import files
from searchr1_lld.bookkeeping.files import write_json_atomic


def test_a_record_is_written_whole_in_its_format_and_replaces_the_earlier_one(tmp_path):
    path = tmp_path / "record.json"
    assert write_json_atomic(path, {"b": 1, "a": [2]}) == path
    assert path.read_text() == '{\n  "b": 1,\n  "a": [\n    2\n  ]\n}\n'
    write_json_atomic(path, {"b": 1, "a": 2}, indent=1, sort_keys=True)
    assert path.read_text() == '{\n "a": 2,\n "b": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary file left behind


def test_a_write_cut_off_leaves_the_earlier_record(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    write_json_atomic(path, {"step": 1})
    with pytest.raises(TypeError):  # the new record cannot be serialised: nothing is written
        write_json_atomic(path, {"step": object()})
    assert json.loads(path.read_text()) == {"step": 1}

    def cut_off(src, dst):  # the process dies after writing the new record, before moving it into place
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", cut_off)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"step": 2})
    assert json.loads(path.read_text()) == {"step": 1}


def test_a_record_is_on_disk_before_it_replaces_the_earlier_one(tmp_path, monkeypatch):
    """The temporary file is fsync'ed, then moved: the order a crash after the move needs to find the new record."""
    calls = []
    real_fsync, real_replace = files.os.fsync, files.os.replace

    def fsync(fd):
        calls.append(("fsync", files.os.fstat(fd).st_size))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", files.Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    write_json_atomic(tmp_path / "record.json", {"step": 3})
    assert calls == [("fsync", len('{\n  "step": 3\n}\n')), ("replace", "record.json")]
