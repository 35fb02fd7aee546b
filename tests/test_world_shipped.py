"""The shipped warm start: exported from a built world, installed only into the world it was built for, on the very
data it was trained on, byte for byte; and the one in assets/warm-start is the default world's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import REPO_ROOT, TEST_WORLD_CONFIG
from searchr1_lld.world.build import build_world, main as build_main, read_card, world_config_hash
from searchr1_lld.world.config import load_world_config
from searchr1_lld.world.generate import generate_world, write_world_files
from retriever.corpus import file_sha256
from searchr1_lld.world.shipped import (DATA_FILES, MANIFEST, SHIPPED_WARM_START, export_warm_start, read_manifest,
                                        shipped_for)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_shipped_warm_start_installs_byte_for_byte_with_its_builds_card(tiny_world: Path, tmp_path: Path) -> None:
    asset = tmp_path / "asset"
    manifest = export_warm_start(tiny_world, asset)
    assert manifest["config_hash"] == world_config_hash(TEST_WORLD_CONFIG)
    assert set(manifest["data_sha256"]) == set(DATA_FILES)

    card = build_world(tmp_path / "w", TEST_WORLD_CONFIG, progress=False, warm_start_from=asset)
    built = read_card(tiny_world)
    assert _files(tmp_path / "w" / "model") == _files(tiny_world / "model")
    assert _files(tmp_path / "w" / "tokenizer") == _files(tiny_world / "tokenizer")
    assert card["config_hash"] == built["config_hash"]
    assert card["policy"] == built["policy"] and card["warm_start"] == built["warm_start"]
    assert card["warm_start_from"]["dir"] == str(asset)
    assert card["warm_start_from"]["timings_s"] == built["timings_s"]
    assert "measure_s" not in card["timings_s"]  # nothing was rolled out: the shipped build's measurement stands


def test_a_shipped_warm_start_is_refused_for_another_world_other_data_or_other_bytes(tiny_world: Path,
                                                                                     tmp_path: Path) -> None:
    asset = tmp_path / "asset"
    export_warm_start(tiny_world, asset)
    other = dataclasses.replace(TEST_WORLD_CONFIG, warmstart_lr=TEST_WORLD_CONFIG.warmstart_lr / 2)  # same data
    with pytest.raises(ValueError, match=f"built for the world config {world_config_hash(TEST_WORLD_CONFIG)}"):
        build_world(tmp_path / "a", other, progress=False, warm_start_from=asset)
    assert not (tmp_path / "a" / "index").exists()  # refused before the index was built

    manifest = read_manifest(asset)
    manifest["data_sha256"]["qa/train.jsonl"] = "0" * 64  # as if the generator had changed under the same hash
    (asset / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="qa/train.jsonl differs from the file the warm start"):
        build_world(tmp_path / "b", TEST_WORLD_CONFIG, progress=False, warm_start_from=asset)

    export_warm_start(tiny_world, asset)
    with open(asset / "model" / "config.json", "a") as f:
        f.write(" ")
    with pytest.raises(ValueError, match=r"does not match its manifest: \['config.json'\]"):
        build_world(tmp_path / "c", TEST_WORLD_CONFIG, progress=False, warm_start_from=asset)
    assert read_card(tmp_path / "c") is None  # no finished world is claimed

    with pytest.raises(FileNotFoundError, match="not a shipped warm start"):
        read_manifest(tmp_path)
    assert shipped_for(world_config_hash(TEST_WORLD_CONFIG), tmp_path) is None
    assert shipped_for(world_config_hash(TEST_WORLD_CONFIG), asset) == asset


def test_the_build_command_refuses_a_warm_start_for_another_world(tmp_path: Path, capsys) -> None:
    rc = build_main(["--config", "configs/world/registered.yaml", "--out", str(tmp_path / "w"), "--quiet",
                     "--warm-start-from", str(SHIPPED_WARM_START)])
    assert rc == 2
    assert "was built for the world config" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one way to get the policy, not two
        build_main(["--out", str(tmp_path / "v"), "--warm-start-from", str(SHIPPED_WARM_START), "--train-warm-start"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_shipped_warm_start_is_the_default_worlds_and_passed_acceptance(tmp_path: Path) -> None:
    cfg = load_world_config(REPO_ROOT / "configs" / "world" / "default.yaml")
    manifest = read_manifest(SHIPPED_WARM_START)
    assert manifest["config_hash"] == world_config_hash(cfg), \
        "the default world changed: build it (make world-from-scratch) and export its warm start"
    write_world_files(generate_world(cfg), tmp_path)  # the generator still writes the data it was trained on
    assert {name: file_sha256(tmp_path / name) for name in DATA_FILES} == manifest["data_sha256"]
    assert {p.name: file_sha256(p) for p in sorted((SHIPPED_WARM_START / "model").iterdir())} \
        == manifest["model_sha256"]
    assert manifest["card"]["acceptance"]["passed"] and manifest["card"]["acceptance"]["split"] == "val"
    # the committed card of the default world's build (docs/lab.md's figures) is this warm start's
    committed = json.loads((REPO_ROOT / "docs" / "lab" / "warm-start" / "balanced.json").read_text())
    assert committed["config_hash"] == manifest["config_hash"]
    assert committed["warm_start"] == manifest["card"]["warm_start"]
    assert committed["policy"] == manifest["card"]["policy"]
    assert shipped_for(world_config_hash(cfg)) == SHIPPED_WARM_START


def test_every_build_of_a_world_takes_its_shipped_warm_start_unless_told_to_train(tiny_world: Path, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    import searchr1_lld.world.build as build_module
    import searchr1_lld.world.shipped as shipped_module

    asset = tmp_path / "asset"
    export_warm_start(tiny_world, asset)
    monkeypatch.setattr(shipped_module, "SHIPPED_WARM_START", asset)
    build_module.ensure_world(tmp_path / "w", TEST_WORLD_CONFIG, progress=False)
    assert read_card(tmp_path / "w")["warm_start_from"]["dir"] == str(asset)

    asked = []
    monkeypatch.setattr(build_module, "build_world", lambda out, cfg, **kw: asked.append(kw["warm_start_from"]))
    build_module.ensure_world(tmp_path / "x", TEST_WORLD_CONFIG, progress=False, use_shipped=False)
    other = dataclasses.replace(TEST_WORLD_CONFIG, warmstart_lr=TEST_WORLD_CONFIG.warmstart_lr / 2)
    build_module.ensure_world(tmp_path / "y", other, progress=False)
    assert asked == [None, None]  # told to train; no shipped warm start for that config
