"""Running the lab: the world, one (method, seed) run after another (evaluated by :mod:`.evaluating`), the summary."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from filelock import FileLock
from retriever import make_retriever
from searchr1_lld.bookkeeping.files import write_json_atomic
from searchr1_lld.bookkeeping.tracking import describe_machine
from searchr1_lld.config import Config, ConfigError, flatten_dict
from searchr1_lld.evaluation import EvalError
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lab.analysis import (aggregate, aggregate_curves, curve_summary, lld_verdict,
                                   load_records, phase_summary, val_em_curve, trend_summary, warning_summary)
from searchr1_lab.evaluating import (TRAIN_EVAL_DIR, eval_summary, evaluate_policy, evaluate_sampled,
                                     evaluate_train, evaluate_warm_start, final_policy, load_policy,
                                     load_warm_start, provenance, sampled_of_run, train_eval_done,
                                     warm_start_sampled)
from searchr1_lab.methods import (REPO_ROOT, RUN_KEYS, RUN_PLAN, RUN_RECORD, Method, check_only_llds_differs,
                                  lab_config, method_config, read_lab_config, run_name, shared_settings)
from searchr1_lab.plots import plot_curves
from searchr1_lab.report import fmt, write_report
from searchr1_lld.learner.trainer import Trainer
from searchr1_lld.protocols import Retriever
from searchr1_lld.world import (ensure_world, is_built, load_world_config, read_card, trainer_overrides,
                                world_config_hash)


# the run-config keys the world's trainer_overrides set (paths into the world dir)
WORLD_KEYS = tuple(item.partition("=")[0] for item in trainer_overrides("."))
SHARED_WORLD_DIR = REPO_ROOT / ".cache" / "world"  # the demo's world dir


def read_run_record(run_dir: str | Path) -> dict[str, Any]:
    """A finished run's record, RUN_DIR/lab_run.json; a ConfigError naming the file when it is missing or is not
    JSON (a run cut off while writing it)."""
    path = Path(run_dir) / RUN_RECORD
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} missing (the run never finished)") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not JSON ({err}); delete it to train the run again") from None


def write_run_record(run_dir: str | Path, record: dict[str, Any]) -> None:
    """Write RUN_DIR/lab_run.json atomically (a run cut off while writing leaves the earlier record or none)."""
    write_json_atomic(Path(run_dir) / RUN_RECORD, record)


def resolve_world_dir(world_config: str, world_dir: str | None) -> Path:
    """``--world-dir`` as given; else the demo's ``.cache/world`` when it already holds a finished world built from
    exactly ``world_config`` (no second build of the same world); else ``.cache/lab-world-<hash of that world>``. The
    lab never builds into the shared default dir, which other tools rebuild when their world config differs."""
    if world_dir:
        return Path(world_dir)
    world = load_world_config(world_config or None)
    if is_built(SHARED_WORLD_DIR, world):
        return SHARED_WORLD_DIR
    return REPO_ROOT / ".cache" / f"lab-world-{world_config_hash(world)}"


def trained_world_dir(runs_dir: Path) -> Path | None:
    """The one world dir the finished runs in ``runs_dir`` record (the parent of their lab_run.json's
    ``model.path``) when it still holds a world (world.json); None when the runs name none, several, or one that is
    gone."""
    recorded = {str(Path(read_run_record(p.parent)["config"]["model"]["path"]).parent)
                for p in runs_dir.glob(f"*/{RUN_RECORD}")}
    if len(recorded) != 1:
        return None
    path = Path(recorded.pop())
    return path if read_card(path) is not None else None


def prepare_world(world_config: str, world_dir: Path, explicit: bool) -> dict[str, Any]:
    """Build the world if needed and return its card. An explicit ``--world-dir`` that holds a world is used as is."""
    card = read_card(world_dir)
    if card is None or not explicit:
        ensure_world(world_dir, load_world_config(world_config or None), progress=True)
        card = read_card(world_dir)
    if card is None:
        raise RuntimeError(f"no world card in {world_dir} after building")
    return card


@contextlib.contextmanager
def exclusive(lock_path: Path):
    """Hold an exclusive lock on ``lock_path`` (created if missing) for the block: two lab jobs sharing a runs dir
    (split by --methods or --seeds) would otherwise both write the warm start's evaluation logs, one after the other
    into the same files (duplicate rows, and a score read from the other's half-written log)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path)):
        yield


def settings_diff(cfg: Config, trained: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between ``cfg`` and the config dict a run was ``trained`` with, bookkeeping
    keys (:data:`RUN_KEYS`) aside. The world's paths are not compared (:data:`WORLD_KEYS`): the report describes the
    world actually used from its card (world.json), and resuming onto other inputs is refused by the trainer."""
    want, got = flatten_dict(cfg.to_dict()), flatten_dict(trained)
    return sorted(k for k in want.keys() | got.keys()
                  if k not in RUN_KEYS and k not in WORLD_KEYS and want.get(k) != got.get(k))


def shorter_run(run_dir: Path, cfg: Config) -> dict[str, Any] | None:
    """The lab_run.json of a finished run in ``run_dir`` that ``cfg`` extends: trained with the same settings except
    fewer ``trainer.total_steps`` (bookkeeping keys aside); None when there is no such run."""
    if not (run_dir / RUN_RECORD).is_file():
        return None
    rec = read_run_record(run_dir)
    if settings_diff(cfg, rec["config"]) != ["trainer.total_steps"]:
        return None
    return rec if rec["config"]["trainer"]["total_steps"] < cfg.trainer.total_steps else None


def copy_run_to_extend(src: Path, dst: Path, cfg: Config) -> None:
    """Copy a finished run (``src``: its lab_run.json, metrics and checkpoints) that ``cfg`` lengthens to ``dst``, to
    be trained on there; a ``dst`` that exists already (a copy made earlier, or a run of its own) is left alone."""
    if dst.exists():
        return
    if not (src / RUN_RECORD).is_file():
        raise ConfigError(f"--extend-from: {src / RUN_RECORD} missing (no finished run to extend)")
    if shorter_run(src, cfg) is None:
        raise ConfigError(f"--extend-from: {src} was not trained with these settings and fewer trainer.total_steps "
                          f"(only trainer.total_steps may differ, and it must grow)")
    tmp = dst.with_name(dst.name + ".copying")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("eval", TRAIN_EVAL_DIR, "plots"))
    tmp.rename(dst)


def run_one(cfg: Config, method: Method, seed: int, world_dir: Path, retriever: Retriever,
            sampled: int = 0, extend: bool = False, train_eval: int = 0) -> dict[str, Any]:
    """Train one (method, seed), evaluate it (greedy; and sampled, ``sampled`` rollouts per question, when > 0; and
    greedy on the first ``train_eval`` training questions into RUN/eval_train, when > 0), write RUN/lab_run.json;
    return that record. From scratch, or from the last checkpoint of an interrupted run with
    this config; with ``extend``, also from the last checkpoint of a finished run in the same directory that
    ``cfg`` only lengthens (:func:`shorter_run`). ``train_s``: the training's seconds over every pass, an
    interrupted or shorter one's included (:attr:`Trainer.train_s`)."""
    run_dir = Path(cfg.trainer.output_dir) / cfg.trainer.run_name
    plan = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    allow: tuple[str, ...] = ()
    if run_dir.exists() and not ((run_dir / RUN_PLAN).is_file() and (run_dir / RUN_PLAN).read_text() == plan):
        shorter = shorter_run(run_dir, cfg) if extend else None
        if shorter is None:
            shutil.rmtree(run_dir)  # another config's (or a pre-resume) run: start over
        else:  # the same run, trained to fewer steps: go on from its last checkpoint
            allow = ("trainer.total_steps",)
            print(f"[lab] {run_name(method, seed)}: extending {shorter['steps']} -> {cfg.trainer.total_steps} steps",
                  flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / TRAIN_EVAL_DIR, ignore_errors=True)  # an earlier policy's; this one's is written below
    (run_dir / RUN_PLAN).write_text(plan)
    trainer = Trainer(cfg, run_dir=run_dir, retriever=retriever)
    result = trainer.run(evaluate=False, allow_changes=allow)
    t1 = time.time()
    unwrapped = trainer.learner.module
    results = evaluate_policy(unwrapped, trainer.learner.tokenizer, retriever, cfg, world_dir, run_dir / "eval",
                              name=run_name(method, seed))
    record = {
        "method": method.key, "label": method.label, "seed": seed, "run_dir": str(run_dir), "steps": result.steps,
        "skipped_updates": result.skipped_updates, "train_s": round(result.train_s, 1),
        "eval_s": round(time.time() - t1, 1), "eval": eval_summary(results), "config": cfg.to_dict(),
    }
    if sampled:
        record["eval_sampled"] = evaluate_sampled(unwrapped, trainer.learner.tokenizer, retriever, cfg, world_dir,
                                                  sampled)
    if train_eval:
        evaluate_train(unwrapped, trainer.learner.tokenizer, retriever, cfg, world_dir, run_dir / TRAIN_EVAL_DIR,
                       train_eval, name=run_name(method, seed))
    write_run_record(run_dir, record)
    return record


def finished(cfg: Config, runs_dir: Path) -> bool:
    """True when ``runs_dir`` holds this run's lab_run.json, trained with exactly this config."""
    try:
        load_run(cfg, runs_dir)
    except ConfigError:
        return False
    return True


def load_run(cfg: Config, runs_dir: Path) -> dict[str, Any]:
    """A finished run's lab_run.json, checked against the config it should have been trained with."""
    run_dir = runs_dir / cfg.trainer.run_name
    path = run_dir / RUN_RECORD
    if not path.is_file():
        raise ConfigError(f"--report-only: {path} missing (run {cfg.trainer.run_name} never finished)")
    rec = read_run_record(run_dir)
    diff = settings_diff(cfg, rec["config"])
    if diff:
        raise ConfigError(f"--report-only: {path} was trained with different settings: {diff}")
    rec["run_dir"] = str(run_dir)
    return rec


def repo_relative(path: str | Path) -> str:
    """``path`` as a reader can use it: relative to the repository root when it lies inside it (the report must not
    name the machine that wrote it), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


class LabWorld:
    """The world every run of one lab call shares: its directory and the lab's base config; made on first use, one
    retriever (the config's: in-process by default, on the world's index) and the world's passages (doc id ->
    contents: what the provenance tables check against)."""

    def __init__(self, world_dir: Path, base: Config):
        self.dir = world_dir
        self.base = base

    @functools.cached_property
    def retriever(self) -> Retriever:
        return make_retriever(self.base.retriever)

    @functools.cached_property
    def corpus(self) -> dict[str, str]:
        return {str(d["id"]): d["contents"] for d in read_jsonl(self.dir / "corpus.jsonl")}

    def provenance(self, policy_dir: Path, train_eval: int) -> dict[str, Any]:
        """Where the answers of a run's (or the warm start's) evaluations came from: test split, and the train split
        when ``train_eval`` > 0."""
        return {"test": provenance(policy_dir / "eval", self.corpus),
                "train": provenance(policy_dir / TRAIN_EVAL_DIR, self.corpus) if train_eval else None}


@dataclasses.dataclass(frozen=True)
class LabPass:
    """What one call of :func:`run_lab` does besides training the missing runs (see its docstring)."""

    report_only: bool = False
    fresh: bool = False
    sampled: int = 0
    train_eval: int = 0
    extend_from: Path | None = None


def lab_world_dir(world_config: str, world_dir: str | None, runs_dir: Path, report_only: bool) -> Path:
    """:func:`resolve_world_dir`; for a report of finished runs when that holds no world, the world the runs trained
    on (e.g. one built with --world-dir)."""
    wdir = resolve_world_dir(world_config, world_dir)
    if report_only and world_dir is None and read_card(wdir) is None:
        trained = trained_world_dir(runs_dir)
        if trained is not None:
            print(f"[lab] --report-only: {wdir} holds no world; reading the one the runs trained on, {trained}",
                  flush=True)
            return trained
    return wdir


def warm_start_record(world: LabWorld, runs_dir: Path, opts: LabPass) -> dict[str, Any]:
    """The warm start's evaluations (greedy; sampled and on the training questions when asked), evaluated once per
    runs dir: one job evaluates, the others wait and read it (--report-only writes nothing there)."""
    warm_dir = runs_dir / "warm_start"
    with exclusive(runs_dir / "warm_start.lock") if not opts.report_only else contextlib.nullcontext():
        if opts.report_only:
            warm = load_warm_start(warm_dir / "eval")
        else:
            try:
                warm = load_warm_start(warm_dir / "eval") if not opts.fresh else None
            except EvalError:  # no finished warm-start evaluation there yet
                warm = None
            warm = warm or evaluate_warm_start(world.base, world.dir, world.retriever, warm_dir / "eval")
        if opts.sampled:
            warm["eval_sampled"] = warm_start_sampled(world.base, world.dir, world.retriever,
                                                      warm_dir / "sampled.json", opts.sampled, opts.fresh)
        train_dir = warm_dir / TRAIN_EVAL_DIR
        if opts.train_eval and (opts.fresh or not train_eval_done(train_dir, opts.train_eval, world.dir)):
            model, tokenizer = load_policy(world.dir / "model", world.dir)
            evaluate_train(model, tokenizer, world.retriever, world.base, world.dir, train_dir, opts.train_eval,
                           "warm start")
        warm["provenance"] = world.provenance(warm_dir, opts.train_eval)
    print(f"[lab] warm start: test EM {warm['eval']['em']:.3f}"
          + (f", sampled {warm['eval_sampled']['em']:.3f}" if opts.sampled else ""), flush=True)
    return warm


def obtain_run(cfg: Config, m: Method, s: int, world: LabWorld, runs_dir: Path, opts: LabPass) -> dict[str, Any]:
    """The lab_run.json of one (method, seed): read when finished (always with ``report_only``), else trained."""
    if opts.report_only:
        return load_run(cfg, runs_dir)
    if not opts.fresh and finished(cfg, runs_dir):
        rec = load_run(cfg, runs_dir)
        print(f"[lab] {run_name(m, s)}: finished earlier, reused ({runs_dir / cfg.trainer.run_name})", flush=True)
        return rec
    if opts.extend_from is not None:
        copy_run_to_extend(opts.extend_from / cfg.trainer.run_name, runs_dir / cfg.trainer.run_name, cfg)
    return run_one(cfg, m, s, world.dir, world.retriever, sampled=opts.sampled, extend=opts.extend_from is not None,
                   train_eval=opts.train_eval)


def complete_run(cfg: Config, m: Method, s: int, rec: dict[str, Any], world: LabWorld, opts: LabPass) -> None:
    """The evaluations a finished run lacks, from its last checkpoint: sampled EM at this sample count (also stored
    in its lab_run.json) and the training questions."""
    if opts.sampled and (rec.get("eval_sampled") or {}).get("samples") != opts.sampled:
        rec["eval_sampled"] = sampled_of_run(cfg, rec, world.dir, world.retriever, opts.sampled)
        stored = read_run_record(rec["run_dir"])
        stored["eval_sampled"] = rec["eval_sampled"]
        write_run_record(rec["run_dir"], stored)
    train_dir = Path(rec["run_dir"]) / TRAIN_EVAL_DIR
    if opts.train_eval and not train_eval_done(train_dir, opts.train_eval, world.dir):
        model, tokenizer = final_policy(rec, world.dir)
        evaluate_train(model, tokenizer, world.retriever, cfg, world.dir, train_dir, opts.train_eval, run_name(m, s))


def analyse_run(cfg: Config, m: Method, s: int, rec: dict[str, Any], world: LabWorld, opts: LabPass) -> None:
    """Add to ``rec`` what the report reads of one run (provenance, phases, trends, verdict, validation curve), drop
    its config, and print its line."""
    rec["provenance"] = world.provenance(Path(rec["run_dir"]), opts.train_eval)
    records = load_records(rec["run_dir"])
    rec["phases"] = phase_summary(records, run_steps=cfg.trainer.total_steps)
    rec["trend"] = trend_summary(records)
    rec["verdict"] = lld_verdict(rec["trend"], rec["phases"])
    rec["test_em"] = rec["eval"]["em"]
    rec["val_em_curve"] = val_em_curve(records)
    rec["val_em_curve_summary"] = curve_summary(rec["val_em_curve"], None)
    rec.pop("config")
    sampled_txt = f", sampled {rec['eval_sampled']['em']:.3f}" if opts.sampled else ""
    print(f"[lab] {run_name(m, s)}: test EM {rec['eval']['em']:.3f} (single {fmt(rec['eval']['em_single_hop'])},"
          f" multi {fmt(rec['eval']['em_multi_hop'])}){sampled_txt}, final phase {rec['phases']['final']}, "
          f"verdict {rec['verdict']}, train {rec['train_s']:.0f}s eval {rec['eval_s']:.0f}s", flush=True)


def lab_run(cfg: Config, m: Method, s: int, world: LabWorld, runs_dir: Path, opts: LabPass) -> dict[str, Any]:
    """One (method, seed) of the grid, as the report reads it: obtained, completed, analysed."""
    rec = obtain_run(cfg, m, s, world, runs_dir, opts)
    complete_run(cfg, m, s, rec, world, opts)
    analyse_run(cfg, m, s, rec, world, opts)
    return rec


def lab_summary(runs: list[dict[str, Any]], warm: dict[str, Any], card: dict[str, Any], world: LabWorld,
                methods: Sequence[Method], pngs: Sequence[Path], opts: LabPass, **call: Any) -> dict[str, Any]:
    """summary.json of one lab call; ``call``: how it was called (``quick``, ``command``, ``config_path``,
    ``overrides``, ``seeds``) and when it started (``t_start``)."""
    return {
        "quick": call["quick"], "report_only": opts.report_only, "command": call["command"],
        "config_path": repo_relative(call["config_path"]), "overrides": list(call["overrides"]),
        "seeds": list(call["seeds"]), "methods": [dataclasses.asdict(m) for m in methods],
        "world": {"dir": repo_relative(world.dir), "counts": card.get("counts", {}), "config": card.get("config", {}),
                  "warm_start_card": card.get("warm_start", {})},
        "shared_settings": shared_settings(world.base), "warm_start": warm, "runs": runs,
        "aggregate": aggregate(runs, methods), "val_em_curves": aggregate_curves(runs, methods),
        "warning_summary": warning_summary(runs),
        "drawdown_summary": warning_summary(runs, "drawdown"), "sampled": opts.sampled, "train_eval": opts.train_eval,
        "pngs": [p.name for p in pngs],
        "machine": describe_machine(),
        # runs_s: every run's training + evaluation, whichever pass (resumed or not) did it; wall_s: this pass
        "runs_s": round(sum(r["train_s"] + r["eval_s"] for r in runs) + (warm.get("eval_s") or 0.0), 1),
        "wall_s": round(time.time() - call["t_start"], 1),
    }


def run_lab(*, config_path: str | Path, overrides: Sequence[str], seeds: Sequence[int], methods: Sequence[Method],
            out_dir: str | Path, runs_dir: str | Path, world_dir: str | None = None, quick: bool = False,
            command: str = "", report_only: bool = False, fresh: bool = False, sampled: int = 0,
            extend_from: str | Path | None = None, train_eval: int = 0) -> dict[str, Any]:
    """Train and evaluate every (seed, method), then write the report. Returns the summary (also summary.json).

    Resumable and splittable: a run whose ``lab_run.json`` holds this exact config is reused (``fresh`` retrains
    it); an interrupted run resumes from its last checkpoint. Several calls with different ``--seeds`` /
    ``--methods`` on the same ``runs_dir`` (one after the other, or from separate background jobs) fill the grid;
    a last ``--report-only`` call over the whole grid writes the full report.

    ``report_only``: train nothing; rebuild the report from the finished runs in ``runs_dir`` (their lab_run.json must
    hold the config this call would have trained with, bookkeeping keys aside).

    ``sampled`` > 0: also score every policy sampled (``sampled`` rollouts per test question at the rollout
    temperature, :func:`evaluate_sampled`); a finished run without that score gets it from its last checkpoint,
    even with ``report_only`` (it evaluates, it does not train).

    ``train_eval`` > 0: also evaluate every policy greedily on the first ``train_eval`` training questions
    (RUN/eval_train; finished runs from their last checkpoint, like ``sampled``), and report for both splits where
    the answers came from (:func:`provenance`: copied from a retrieved passage, or right without one).

    ``extend_from``: a runs dir of the same lab trained to fewer ``trainer.total_steps``. A run missing in
    ``runs_dir`` is copied from there first and then trained on from its last checkpoint to the new length
    (:func:`run_one` with ``extend``); ``extend_from`` itself is left as it was, so its report still rebuilds."""
    if sampled < 0 or train_eval < 0:
        raise ConfigError(f"--sampled and --train-eval must be >= 0 (got {sampled}, {train_eval})")
    t_start = time.time()
    out_dir, runs_dir = Path(out_dir), Path(runs_dir)
    opts = LabPass(report_only=report_only, fresh=fresh, sampled=sampled, train_eval=train_eval,
                   extend_from=Path(extend_from) if extend_from is not None else None)
    _, world_config, _ = read_lab_config(config_path, overrides)
    wdir = lab_world_dir(world_config, world_dir, runs_dir, report_only)
    configs = {(m.key, s): method_config(config_path, overrides, m, s, world_dir=wdir, runs_dir=runs_dir)
               for s in seeds for m in methods}
    world = LabWorld(wdir, lab_config(config_path, overrides, wdir))
    check_only_llds_differs(list(configs.values()))
    if not report_only:
        card = prepare_world(world_config, wdir, explicit=world_dir is not None)
        print(f"[lab] world {wdir}; {len(configs)} runs; runs in {runs_dir}", flush=True)
    else:
        card = read_card(wdir) or {}
    warm = warm_start_record(world, runs_dir, opts)
    runs = [lab_run(configs[(m.key, s)], m, s, world, runs_dir, opts) for s in seeds for m in methods]
    out_dir.mkdir(parents=True, exist_ok=True)
    records_by_run = {(r["method"], r["seed"]): load_records(r["run_dir"]) for r in runs}
    pngs = plot_curves(records_by_run, methods, out_dir)
    summary = lab_summary(runs, warm, card, world, methods, pngs, opts, quick=quick, command=command,
                          config_path=config_path, overrides=overrides, seeds=seeds, t_start=t_start)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    report = write_report(out_dir, summary, pngs)
    print(f"[lab] report: {report} (runs {summary['runs_s'] / 60:.1f} min, this pass {summary['wall_s'] / 60:.1f} min)",
          flush=True)
    return summary
