"""Build the synthetic search world on disk (the embedded default everyone trains on).

    python -m data.build_world --out .cache/world [--config configs/world/default.yaml] [key=value overrides, e.g.
        num_people=80 seed=1]

Layout (docs/architecture.md, "The synthetic world on disk")::

    DIR/corpus.jsonl   DIR/index/   DIR/qa/train.jsonl   DIR/qa/test.jsonl   DIR/tokenizer/   DIR/model/   DIR/world.json

Steps: generate world (corpus + QA) -> retriever index (``retriever.build.build_index``) -> tokenizer + warm-started
tiny Qwen2 (``data.tiny_policy``) -> warm-start measurement through the real rollout (greedy test EM, format-valid
rate) -> ``world.json`` written last, atomically. A dir whose ``world.json`` carries the same config hash is reused
as is; a file lock makes concurrent builders (parallel test sessions) wait for one build instead of racing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from searchr1_lld.config import ConfigError, WorldConfig, load_world_config

BUILD_VERSION = 1  # bump when the generator or the policy recipe changes: old cached worlds are rebuilt
CARD = "world.json"


# their source is part of the cache key: edit them -> rebuild (prompts.py: the prompt, observation and invalid-action
# texts the warm start is trained on)
RECIPE_FILES = ("world.py", "tiny_policy.py", "../searchr1_lld/prompts.py")


def recipe_digest() -> str:
    """sha256 of the generator and policy-recipe source files."""
    h = hashlib.sha256()
    for name in RECIPE_FILES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()


def world_config_hash(cfg: WorldConfig) -> str:
    """Stable short hash of the config, the build version and the recipe source (``recipe_digest``)."""
    payload = json.dumps({"build_version": BUILD_VERSION, "recipe": recipe_digest(), **dataclasses.asdict(cfg)},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def read_card(out_dir: str | Path) -> dict[str, Any] | None:
    path = Path(out_dir) / CARD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def is_built(out_dir: str | Path, cfg: WorldConfig) -> bool:
    card = read_card(out_dir)
    return card is not None and card.get("config_hash") == world_config_hash(cfg)


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _clear_build(out_dir: Path) -> None:
    """Remove the artefacts of a previous (different or unfinished) build; only the names this builder writes."""
    (out_dir / CARD).unlink(missing_ok=True)
    for name in ("corpus.jsonl", "qa", "index", "tokenizer", "model"):
        p = out_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def ensure_world(out_dir: str | Path, world_cfg: WorldConfig | None = None, *, progress: bool = True,
                 measure: bool | None = None) -> Path:
    """Return ``out_dir`` holding a finished world for ``world_cfg``, building it first if needed.

    ``measure`` (default ``world_cfg.warmstart_measure``): roll the warm-started policy out on the test split and
    record greedy EM and the format-valid rate in ``world.json``.
    """
    from filelock import FileLock

    cfg = world_cfg or WorldConfig()
    out_dir = Path(out_dir)
    if is_built(out_dir, cfg):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if is_built(out_dir, cfg):  # another process finished it while we waited
            return out_dir
        build_world(out_dir, cfg, progress=progress, measure=cfg.warmstart_measure if measure is None else measure)
    return out_dir


def build_world(out_dir: Path, cfg: WorldConfig, *, progress: bool = True, measure: bool = True) -> dict[str, Any]:
    """Build every artefact into ``out_dir`` (unconditionally); return the card written to ``world.json``."""
    from tqdm.auto import tqdm

    from data.tiny_policy import build_tiny_policy, measure_warm_start
    from data.world import generate_world, write_world_files
    from retriever.build import build_index
    from retriever.inprocess import InProcessRetriever

    from searchr1_lld.tracking import ticking

    t_start = time.time()
    _clear_build(out_dir)
    timings: dict[str, float] = {}
    stages = ["world", "index", "policy"] + (["measure"] if measure else [])
    # One bar for the whole build (a stage per step, the clock ticking within a stage); the stages' own bars are off.
    bar = tqdm(total=len(stages), desc="build world", unit="stage", disable=not progress,
               bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar}| {elapsed}{postfix}")
    with ticking(bar):
        t0 = time.time()
        bar.set_postfix(stage="world: corpus and questions")
        world = generate_world(cfg)
        paths = write_world_files(world, out_dir)
        timings["world_s"] = time.time() - t0
        bar.update(1)

        t0 = time.time()
        bar.set_postfix(stage="index: encoding the corpus")
        build_index(paths["corpus"], out_dir / "index", encoder=cfg.encoder, retriever=cfg.retriever,
                    show_progress=False)
        retriever = InProcessRetriever(out_dir / "index")
        timings["index_s"] = time.time() - t0
        bar.update(1)

        t0 = time.time()
        bar.set_postfix(stage="policy: tokenizer and warm start")
        policy_stats = build_tiny_policy(out_dir, world.passages, world.train_rows, retriever.search, cfg,
                                         progress=False)
        timings["policy_s"] = time.time() - t0
        bar.update(1)

        warm_start: dict[str, Any] = {}
        if measure:
            t0 = time.time()
            bar.set_postfix(stage="measure: warm-start rollouts")
            warm_start = measure_warm_start(out_dir, retriever=retriever, seed=cfg.seed, progress=False)
            timings["measure_s"] = time.time() - t0
            bar.update(1)
        bar.set_postfix(stage="done")
    bar.close()

    timings["total_s"] = time.time() - t_start
    card = {
        "config_hash": world_config_hash(cfg),
        "build_version": BUILD_VERSION,
        "config": dataclasses.asdict(cfg),
        "counts": world.counts(),
        "files": {"corpus": "corpus.jsonl", "index": "index", "train": "qa/train.jsonl", "test": "qa/test.jsonl",
                  "tokenizer": "tokenizer", "model": "model"},
        "policy": policy_stats,
        "warm_start": warm_start,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "created_unix": int(time.time()),
    }
    _write_json_atomic(out_dir / CARD, card)
    return card


# Issue 14's targets for the warm start (greedy rollouts on the test split): below them RL has little to start from.
WARM_START_TARGETS = {"format_valid_rate": 0.95, "first_query_subject_rate": 0.8, "answer_copied_rate": 0.5}


def warm_start_shortfalls(card: dict[str, Any]) -> list[str]:
    """What a finished world's ``world.json`` says went short in its warm start, one sentence each (empty = none):
    a drill stage that used its whole budget without meeting its copy targets (the copy circuit forms in a phase
    change whose step depends on the machine's floating point, docs/lab/warm_start.md), and greedy warm-start
    figures below ``WARM_START_TARGETS``."""
    out: list[str] = []
    policy = card.get("policy") or {}
    checks = policy.get("drill_checks") or []
    for stage, stop in (policy.get("drill_stop") or {}).items():
        if stop != "budget used":
            continue
        last = [c for c in checks if c.get("stage") == stage][-1:]
        acc = ", ".join(f"{k} {v:.2f}" for k, v in last[0].items() if isinstance(v, float)) if last else "not measured"
        out.append(f"drill stage {stage!r} used its whole budget without meeting its copy targets (last check: {acc})")
    greedy = (card.get("warm_start") or {}).get("greedy") or {}
    for key, target in WARM_START_TARGETS.items():
        value = greedy.get(key)
        if isinstance(value, (int, float)) and value < target:  # NaN (no gold passage retrieved) compares False
            out.append(f"warm start {key} {value:.3f} < {target} (greedy, test split)")
    return out


def parse_world_overrides(items: list[str], config: str | Path | None = None) -> WorldConfig:
    """``["num_people=80", "seed=1"]`` (over the world YAML ``config``, if given) -> WorldConfig (types checked like
    the main config; unknown keys rejected)."""
    return load_world_config(config, items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.build_world", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="world directory")
    parser.add_argument("--config", default="configs/world/default.yaml",
                        help="world YAML (WorldConfig keys; relative: to the repository root)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a finished build is there")
    parser.add_argument("--no-measure", action="store_true", help="skip the warm-start rollout measurement")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", help="WorldConfig key=value overrides")
    args = parser.parse_args(argv)
    from searchr1_lld.tracking import quiet_library_output

    quiet_library_output()
    try:
        cfg = parse_world_overrides(args.overrides, args.config)
    except ConfigError as e:
        parser.error(str(e))
    out = Path(args.out)
    if args.force:
        (out / CARD).unlink(missing_ok=True)
    reused = is_built(out, cfg)
    ensure_world(out, cfg, progress=not args.quiet, measure=False if args.no_measure else None)
    card = read_card(out)
    assert card is not None
    print(f"world {'reused' if reused else 'built'}: {out} (config hash {card['config_hash']})")
    print(json.dumps({"counts": card["counts"], "warm_start": card["warm_start"], "timings_s": card["timings_s"]},
                     indent=2))
    for line in warm_start_shortfalls(card):
        print(f"WARNING: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
