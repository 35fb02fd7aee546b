"""Build the synthetic search world on disk (the embedded default everyone trains on).

    python -m searchr1_lld.world build --out .cache/world [--config configs/world/default.yaml] [key=value overrides,
        e.g. num_people=80 seed=1]

Layout (docs/architecture.md, "The synthetic world on disk")::

    DIR/corpus.jsonl   DIR/index/   DIR/qa/{train,val,test}.jsonl   DIR/tokenizer/   DIR/model/   DIR/world.json

Steps: generate world (corpus + QA) -> retriever index (``retriever.build.build_index``) -> tokenizer + warm-started
tiny Qwen2 (:mod:`.tokenizer`, :mod:`.warm_start`) -> warm-start measurement through the real rollout on the
validation split (:mod:`.measure`; the build never reads the test split) and its acceptance
(:data:`WARM_START_ACCEPTANCE`) -> ``world.json`` written last, atomically. A dir whose ``world.json`` carries
the same config hash is reused as is (a killed build has none: the next one starts over; Ctrl-C removes what it had
built); a file lock makes concurrent builders (parallel test sessions) wait for one build instead of racing.

A trainer knows nothing of worlds: :func:`trainer_overrides` names the world's files in the run config's own keys
(``model.path``, ``retriever.index_dir``, ``data.train_files``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock
from tqdm.auto import tqdm

from retriever.build import build_index
from retriever.inprocess import InProcessRetriever
from searchr1_lld.bookkeeping.files import write_json_atomic
from searchr1_lld.bookkeeping.tracking import quiet_library_output, ticking
from searchr1_lld.cli import raise_if_interrupted
from searchr1_lld.config import ConfigError
from searchr1_lld.world.config import HASH_OMITTED_WHEN_OFF, RECIPE_VERSION, WorldConfig, load_world_config
from searchr1_lld.world.generate import generate_world, write_world_files
from searchr1_lld.world.shipped import check_warm_start, install_warm_start, shipped_for

CARD = "world.json"


def world_config_hash(cfg: WorldConfig) -> str:
    """Stable short hash of the config and :data:`~searchr1_lld.world.config.RECIPE_VERSION`; the fields of an
    option that is off (:data:`~searchr1_lld.world.config.HASH_OMITTED_WHEN_OFF`) are left out, so a world built
    before the option existed keeps its hash."""
    values = dataclasses.asdict(cfg)
    for switch, (off, fields) in HASH_OMITTED_WHEN_OFF.items():
        if values[switch] == off:
            for key in fields:
                del values[key]
    payload = json.dumps({"recipe_version": RECIPE_VERSION, **values}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def trainer_overrides(world_dir: str | Path) -> list[str]:
    """The run-config overrides that train on the world in ``world_dir``: its policy and tokenizer, its index
    (in-process), its train split, its validation split (``data.val_files``: the curves during training,
    ``eval/val_em``) and its test split (``data.test_files``: scored before and after training)."""
    d = Path(world_dir)
    return [f"model.path={d / 'model'}", f"model.tokenizer_path={d / 'tokenizer'}", "retriever.mode=inprocess",
            f"retriever.index_dir={d / 'index'}", "data.source=files", f"data.train_files=[{d / 'qa' / 'train.jsonl'}]",
            f"data.val_files=[{d / 'qa' / 'val.jsonl'}]", f"data.test_files=[{d / 'qa' / 'test.jsonl'}]"]


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


def refuse_other_world(out_dir: Path, cfg: WorldConfig) -> None:
    """A ValueError when ``out_dir`` holds a finished world (its ``world.json``) built from another config than
    ``cfg``; an unfinished build (no card) may be built over."""
    card = read_card(out_dir)
    if card is not None and card.get("config_hash") != world_config_hash(cfg):
        raise ValueError(f"{out_dir} holds the world of another config (config hash {card.get('config_hash')}; this "
                         f"one's is {world_config_hash(cfg)}): building here would delete it. Name another "
                         f"directory, or replace it on purpose: python -m searchr1_lld.world build --force --out "
                         f"{out_dir} --config ...")


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
                 measure: bool | None = None, warm_start_from: str | Path | None = None,
                 use_shipped: bool = True) -> Path:
    """Return ``out_dir`` holding a finished world for ``world_cfg``, building it first if needed.

    ``measure`` (default ``world_cfg.warmstart_measure``): roll the warm-started policy out on the validation split
    and record its figures and their acceptance (:func:`acceptance`) in ``world.json``. ``warm_start_from``: the
    policy shipped there (:mod:`.shipped`) instead of a new one (ValueError when it was not built for this world);
    without it, and with ``use_shipped``, the repository's (``assets/warm-start``) when it was built for this world.
    A directory that holds a finished world of another config is never built over (its files are someone's data: a
    study's world, a benchmark's): a ValueError names both configs' hashes (:func:`refuse_other_world`).
    """
    cfg = world_cfg or WorldConfig()
    out_dir = Path(out_dir)
    if is_built(out_dir, cfg):
        return out_dir
    refuse_other_world(out_dir, cfg)
    if warm_start_from is None and use_shipped:
        warm_start_from = shipped_for(world_config_hash(cfg))
    out_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if is_built(out_dir, cfg):  # another process finished it while we waited
            return out_dir
        refuse_other_world(out_dir, cfg)
        build_world(out_dir, cfg, progress=progress, measure=cfg.warmstart_measure if measure is None else measure,
                    warm_start_from=warm_start_from)
    return out_dir


class _Stages:
    """The build's stages on one progress bar (a stage per step), each timed into ``timings`` as ``<key>_s``."""

    def __init__(self, bar: Any):
        self.bar = bar
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, key: str, label: str) -> Iterator[None]:
        """One stage; a Ctrl-C whose KeyboardInterrupt Python dropped stops the build at the stage's start or end."""
        raise_if_interrupted()
        t0 = time.time()
        self.bar.set_postfix(stage=label)
        yield
        self.timings[f"{key}_s"] = time.time() - t0
        self.bar.update(1)
        raise_if_interrupted()


def _build_artefacts(out_dir: Path, cfg: WorldConfig, stages: _Stages, measure: bool,
                     warm_start_from: Path | None = None) -> tuple[Any, dict, dict, dict]:
    """The world (corpus and QA files), its index, the tokenizer and warm-started policy (trained, or shipped in
    ``warm_start_from``: :mod:`.shipped`) and, with ``measure``, the warm start's rollouts; returns (the generated
    world, the policy's statistics, the measurement or {}, the shipped warm start's manifest or {})."""
    from searchr1_lld.world.measure import measure_warm_start  # deferred: transformers
    from searchr1_lld.world.warm_start import build_tiny_policy  # deferred: torch

    with stages.stage("world", "world: corpus and questions"):
        world = generate_world(cfg)
        paths = write_world_files(world, out_dir)
        # a shipped warm start for another world (or other data) is refused before the index is built
        manifest = check_warm_start(warm_start_from, out_dir, world_config_hash(cfg)) if warm_start_from else {}
    with stages.stage("index", "index: encoding the corpus"):
        build_index(paths["corpus"], out_dir / "index", encoder=cfg.encoder, retriever=cfg.retriever,
                    show_progress=False)
        retriever = InProcessRetriever(out_dir / "index")
    if manifest:
        with stages.stage("policy", "policy: the shipped warm start"):
            install_warm_start(warm_start_from, out_dir, manifest)
        # the shipped build's measurement: the same weights (checked) on the same validation file (checked)
        return world, manifest["card"]["policy"], manifest["card"].get("warm_start") or {}, manifest
    progress = not stages.bar.disable  # the long stages show their own bar under the build's
    with stages.stage("policy", "policy: tokenizer and warm start"):
        policy_stats = build_tiny_policy(out_dir, world.passages, world.train_rows, retriever.search, cfg,
                                         progress=progress)
    warm_start: dict[str, Any] = {}
    if measure:
        with stages.stage("measure", "measure: warm-start rollouts"):
            warm_start = measure_warm_start(out_dir, retriever=retriever, seed=cfg.seed,
                                            pass_k=cfg.warmstart_measure_pass_k, progress=progress)
    return world, policy_stats, warm_start, manifest


def build_world(out_dir: Path, cfg: WorldConfig, *, progress: bool = True, measure: bool = True,
                warm_start_from: str | Path | None = None) -> dict[str, Any]:
    """Build every artefact into ``out_dir`` (unconditionally); return the card written to ``world.json``.
    ``warm_start_from``: a shipped warm start (:mod:`.shipped`) instead of training the policy; its build's
    measurement is recorded (``measure`` is then moot) and the card names it under ``warm_start_from``."""
    t_start = time.time()
    _clear_build(out_dir)
    shipped = Path(warm_start_from) if warm_start_from is not None else None
    names = ["world", "index", "policy"] + (["measure"] if measure and shipped is None else [])
    # One bar for the whole build (a stage per step, the clock ticking within a stage); the warm start's training and
    # its measurement, minutes each, show their own bar beneath it.
    bar = tqdm(total=len(names), desc="build world", unit="stage", disable=not progress,
               bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar}| {elapsed}{postfix}")
    stages = _Stages(bar)
    try:
        with ticking(bar):
            world, policy_stats, warm_start, manifest = _build_artefacts(out_dir, cfg, stages, measure, shipped)
            bar.set_postfix(stage="done")
    except KeyboardInterrupt:  # Ctrl-C: nothing half-built stays (without world.json no rerun would trust it)
        bar.close()
        _clear_build(out_dir)
        with contextlib.suppress(OSError):
            out_dir.rmdir()  # when nothing else is in it
        raise
    bar.close()

    timings = {**stages.timings, "total_s": time.time() - t_start}
    card = {
        "config_hash": world_config_hash(cfg),
        "recipe_version": RECIPE_VERSION,
        "config": dataclasses.asdict(cfg),
        "test_seed": cfg.test_seed,
        "counts": world.counts(),
        "files": {"corpus": "corpus.jsonl", "index": "index", "train": "qa/train.jsonl", "val": "qa/val.jsonl",
                  "test": "qa/test.jsonl",
                  "tokenizer": "tokenizer", "model": "model"},
        "policy": policy_stats,
        "warm_start": warm_start,
        "acceptance": acceptance(warm_start) if warm_start else {},
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "created_unix": int(time.time()),
    }
    if manifest:
        card["warm_start_from"] = {"dir": str(shipped), "created_unix": manifest["card"].get("created_unix"),
                                   "timings_s": manifest["card"].get("timings_s")}
    write_json_atomic(out_dir / CARD, card)
    return card


# Targets for the warm start (greedy rollouts on the validation split): below them RL has little to start from.
WARM_START_TARGETS = {"format_valid_rate": 0.95, "first_query_subject_rate": 0.8, "answer_copied_rate": 0.5}


# The warm start's acceptance, on the validation split (measure.measure_warm_start): it has the format, single
# searches and copying (greedy single-hop EM), not the habit of the second hop (greedy two-hop EM), yet samples it
# often enough that a GRPO group holds a reward (two-hop pass@k), and two-hop answers are not guessable from the
# training answers (majority-training-answer baseline). name -> (measured key, "min" / "max", bound).
WARM_START_ACCEPTANCE: dict[str, tuple[str, str, float]] = {
    "greedy_one_hop_em": ("greedy_em_by_hops.1", "min", 0.8),
    "greedy_two_hop_em": ("greedy_em_by_hops.2", "max", 0.15),
    "two_hop_pass_at_k": ("two_hop_pass_at_k", "min", 0.4),
    "two_hop_majority_train_answer_em": ("majority_train_answer_em_by_hops.2", "max", 0.05),
}


def _measured(warm_start: dict[str, Any], key: str) -> float:
    """The figure at dotted ``key`` of a measurement (NaN when absent)."""
    value: Any = warm_start
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) else float("nan")


def acceptance(warm_start: dict[str, Any]) -> dict[str, Any]:
    """The warm start's acceptance (:data:`WARM_START_ACCEPTANCE`) from its measurement on the validation split:
    ``{"split", "figures": {name: {value, bound, kind, met}}, "passed", "missed": [one sentence per figure
    missed]}``; a figure that could not be measured (NaN) is missed."""
    figures, missed = {}, []
    for name, (key, kind, bound) in WARM_START_ACCEPTANCE.items():
        value = _measured(warm_start, key)
        met = value >= bound if kind == "min" else value <= bound  # NaN: False either way
        figures[name] = {"value": value, "bound": bound, "kind": kind, "met": met}
        if not met:
            sign = ">=" if kind == "min" else "<="
            missed.append(f"acceptance missed: {name} {value:.3f}, needs {sign} {bound} "
                          f"({warm_start.get('split', '?')} split)")
    return {"split": warm_start.get("split"), "figures": figures, "passed": not missed, "missed": missed}


def warm_start_shortfalls(card: dict[str, Any]) -> list[str]:
    """What a finished world's ``world.json`` says went short in its warm start, one sentence each (empty = none):
    a drill stage that used its whole budget without meeting its copy targets (the copy circuit forms in a phase
    change whose step depends on the machine's floating point, docs/lab.md) unless the warm start then passed its
    acceptance (what the drills train for, measured on validation), greedy warm-start figures below
    ``WARM_START_TARGETS`` and every acceptance figure (:data:`WARM_START_ACCEPTANCE`) it missed."""
    out: list[str] = []
    policy = card.get("policy") or {}
    checks = policy.get("drill_checks") or []
    passed = bool((card.get("acceptance") or {}).get("passed"))
    for stage, stop in (policy.get("drill_stop") or {}).items():
        if stop != "budget used" or passed:
            continue
        last = [c for c in checks if c.get("stage") == stage][-1:]
        acc = ", ".join(f"{k} {v:.2f}" for k, v in last[0].items() if isinstance(v, float)) if last else "not measured"
        out.append(f"drill stage {stage!r} used its whole budget without meeting its copy targets (last check: {acc})")
    one_token = policy.get("name_words_one_token")
    if isinstance(one_token, float) and one_token < 1.0:
        out.append(f"only {one_token:.2f} of the corpus' name words are one token after a space: raise "
                   "tokenizer_vocab_size")
    greedy = (card.get("warm_start") or {}).get("greedy") or {}
    for key, target in WARM_START_TARGETS.items():
        value = greedy.get(key)
        if isinstance(value, (int, float)) and value < target:  # NaN (no gold passage retrieved) compares False
            out.append(f"warm start {key} {value:.3f} < {target} (greedy, validation split)")
    out += (card.get("acceptance") or {}).get("missed", [])
    return out


def parse_world_overrides(items: list[str], config: str | Path | None = None) -> WorldConfig:
    """``["num_people=80", "seed=1"]`` (over the world YAML ``config``, if given) -> WorldConfig (types checked like
    the main config; unknown keys rejected)."""
    return load_world_config(config, items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchr1_lld.world build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="world directory")
    parser.add_argument("--config", default="configs/world/default.yaml",
                        help="world YAML (WorldConfig keys; relative: to the repository root)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a finished build is there (of this "
                        "config or, replacing it, of another: without --force a directory holding another config's "
                        "world is refused)")
    parser.add_argument("--no-measure", action="store_true", help="skip the warm-start rollout measurement")
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument("--warm-start-from", metavar="DIR",
                        help="take the policy shipped in DIR (python -m searchr1_lld.world export) instead of "
                             "training it; refused unless it was built for this config on the same data; its build's "
                             "measurement is recorded. Without it the repository's assets/warm-start is taken when it "
                             "was built for this config (the default world's: ~20 min of 2 cores saved)")
    policy.add_argument("--train-warm-start", action="store_true",
                        help="train the policy even when assets/warm-start holds one for this config")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", help="WorldConfig key=value overrides")
    args = parser.parse_args(argv)
    quiet_library_output()
    try:
        cfg = parse_world_overrides(args.overrides, args.config)
    except ConfigError as e:
        parser.error(str(e))
    out = Path(args.out)
    if args.force:
        (out / CARD).unlink(missing_ok=True)
    reused = is_built(out, cfg)
    try:
        ensure_world(out, cfg, progress=not args.quiet, measure=False if args.no_measure else None,
                     warm_start_from=args.warm_start_from, use_shipped=not args.train_warm_start)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    card = read_card(out)
    assert card is not None
    shipped = (card.get("warm_start_from") or {}).get("dir")
    print(f"world {'reused' if reused else 'built'}: {out} (config hash {card['config_hash']}"
          f"{f'; policy shipped in {shipped}' if shipped else ''})")
    if not reused:  # what the build found, once; a reused world's card is in its world.json
        _print_build_summary(out, card)
    return 0


def _print_build_summary(out: Path, card: dict[str, Any]) -> None:
    """A new build's counts, timings, acceptance and shortfalls (the full measurement: ``out/world.json``)."""
    print(f"counts: {json.dumps(card['counts'])}")
    print(f"timings (s): {json.dumps(card['timings_s'])}")
    if card.get("warm_start"):
        print(f"warm-start measurement ({card['warm_start'].get('split', '?')} split): {out / CARD}")
    accepted = card.get("acceptance") or {}
    for name, fig in (accepted.get("figures") or {}).items():
        sign = ">=" if fig["kind"] == "min" else "<="
        print(f"acceptance ({accepted['split']}): {name} {fig['value']:.3f} {sign} {fig['bound']}: "
              f"{'met' if fig['met'] else 'MISSED'}")
    for line in warm_start_shortfalls(card):
        print(f"WARNING: {line}", file=sys.stderr)


def ensure_world_on_ranks(out_dir: str | Path, world_cfg: WorldConfig, *, progress: bool = True,
                          timeout_s: float = 7200.0, poll_s: float = 1.0) -> Path:
    """:func:`ensure_world` for a multi-process start (``torchrun`` / ``accelerate launch`` set ``LOCAL_RANK``),
    before any process group exists: the first process of each machine builds (or reuses) the world, the others
    wait until its ``world.json`` carries this config's hash, then all load the same files. A build that fails
    raises on the building process (the launcher then stops the others); a waiting process gives up after
    ``timeout_s`` with an error naming the directory."""
    out_dir = Path(out_dir)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        return ensure_world(out_dir, world_cfg, progress=progress)
    deadline = time.monotonic() + timeout_s
    while not is_built(out_dir, world_cfg):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for local rank 0 to build the world in {out_dir}")
        time.sleep(poll_s)
    return out_dir
