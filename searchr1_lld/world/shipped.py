"""A warm-started policy shipped with the repository, so that a world build need not train it again.

The policy stage of a world build (tokenizer and warm start, :mod:`.warm_start`) is ~20 minutes of a 2-core CPU for
the default world; everything else takes seconds. ``assets/warm-start/`` holds the default world's policy as that
build made it (``python -m searchr1_lld.world export``) and a manifest: the world config's hash, the SHA-256 of every
file it ships and of the data files it was trained and measured on (``corpus.jsonl``, ``qa/train.jsonl``,
``qa/val.jsonl``), and the build's own card (its warm-start statistics, validation measurement, acceptance, timings).

A build given such a directory (``python -m searchr1_lld.world build --warm-start-from DIR``, what ``make world``
runs) generates the corpus, the splits and the index as always, refuses the shipped policy unless the config hash and
every data file's hash match, copies it, checks the copied bytes and records the shipped build's measurement (the
same weights on the same validation file) in ``world.json``. Without the flag every build (``ensure_world``: the
command, ``train.py --world``, the demo, the lab) takes ``assets/warm-start`` when it was built for its config, and
trains the policy otherwise or with ``--train-warm-start`` (``make world-from-scratch``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from retriever.corpus import file_sha256

REPO = Path(__file__).resolve().parents[2]
SHIPPED_WARM_START = REPO / "assets" / "warm-start"  # the default world's warm start (make world)
MANIFEST = "manifest.json"
DATA_FILES = ("corpus.jsonl", "qa/train.jsonl", "qa/val.jsonl")  # what the policy was trained and measured on
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # model/ holds them too (a self-contained policy dir)
CARD_KEYS = ("policy", "warm_start", "acceptance", "timings_s", "created_unix")  # of the build's world.json


def read_manifest(src: str | Path) -> dict[str, Any]:
    """The manifest of a shipped warm start (FileNotFoundError naming the file when ``src`` holds none)."""
    path = Path(src) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a shipped warm start "
                                "(python -m searchr1_lld.world export makes one from a built world)")
    return json.loads(path.read_text())


def export_warm_start(world_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Copy the finished world's policy (``world_dir/model``) to ``out/model`` and write ``out/manifest.json``;
    returns the manifest. ValueError when ``world_dir`` holds no finished build."""
    world_dir, out = Path(world_dir), Path(out)
    card_path = world_dir / "world.json"
    if not card_path.is_file():
        raise ValueError(f"{world_dir} holds no finished world (no world.json)")
    card = json.loads(card_path.read_text())
    model_out = out / "model"
    if model_out.exists():
        shutil.rmtree(model_out)
    shutil.copytree(world_dir / "model", model_out)
    manifest = {
        "config_hash": card["config_hash"],
        "recipe_version": card["recipe_version"],
        "data_sha256": {name: file_sha256(world_dir / name) for name in DATA_FILES},
        "model_sha256": {p.name: file_sha256(p) for p in sorted(model_out.iterdir())},
        "card": {key: card[key] for key in CARD_KEYS if key in card},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_warm_start(src: str | Path, world_dir: str | Path, config_hash: str) -> dict[str, Any]:
    """The manifest of the warm start shipped in ``src`` if it was built for the world config ``config_hash`` on the
    very data now in ``world_dir``; ValueError naming what differs otherwise."""
    manifest = read_manifest(src)
    if manifest["config_hash"] != config_hash:
        raise ValueError(f"the warm start in {src} was built for the world config {manifest['config_hash']}, this one "
                         f"is {config_hash}: build without --warm-start-from to train its policy")
    for name, digest in manifest["data_sha256"].items():
        if file_sha256(Path(world_dir) / name) != digest:
            raise ValueError(f"{name} differs from the file the warm start in {src} was trained on (same config "
                             "hash, so the world generator changed without a RECIPE_VERSION bump): build the policy "
                             "anew, or restore the generator")
    return manifest


def install_warm_start(src: str | Path, world_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Copy the warm start shipped in ``src`` into ``world_dir/model`` and ``world_dir/tokenizer`` and check every
    copied file's SHA-256 against ``manifest`` (the one :func:`check_warm_start` returned for this world)."""
    src, world_dir = Path(src), Path(world_dir)
    model_dir, tok_dir = world_dir / "model", world_dir / "tokenizer"
    for d in (model_dir, tok_dir):
        if d.exists():
            shutil.rmtree(d)
    shutil.copytree(src / "model", model_dir)
    tok_dir.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy2(model_dir / name, tok_dir / name)
    copied = {p.name: file_sha256(p) for p in sorted(model_dir.iterdir())}
    if copied != manifest["model_sha256"]:
        bad = sorted({name for name, _ in set(copied.items()) ^ set(manifest["model_sha256"].items())})
        raise ValueError(f"the warm start in {src} does not match its manifest: {bad}")


def shipped_for(config_hash: str, src: str | Path | None = None) -> Path | None:
    """``src`` (default :data:`SHIPPED_WARM_START`) when it ships a warm start for the world config ``config_hash``,
    else None."""
    src = Path(src) if src is not None else SHIPPED_WARM_START
    try:
        return src if read_manifest(src)["config_hash"] == config_hash else None
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1_lld.world export",
                                     description="Export a built world's warm-started policy and its manifest (what "
                                                 "`python -m searchr1_lld.world build --warm-start-from` takes).")
    parser.add_argument("--world", required=True, help="a finished world directory (python -m searchr1_lld.world build)")
    parser.add_argument("--out", default=str(SHIPPED_WARM_START), help="where to write model/ and manifest.json")
    args = parser.parse_args(argv)
    try:
        manifest = export_warm_start(args.world, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    accepted = (manifest["card"].get("acceptance") or {}).get("passed")
    print(f"exported the warm start of world {manifest['config_hash']} to {args.out} "
          f"({len(manifest['model_sha256'])} files; acceptance on validation: "
          f"{'passed' if accepted else 'not passed' if accepted is False else 'not measured'})")
    return 0
