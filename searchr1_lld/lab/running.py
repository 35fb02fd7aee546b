"""Running the lab: the world, the warm-start evaluation, one (method, seed) run after another, the summary."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import Config, ConfigError, flatten_dict, load_config, load_world_config
from searchr1_lld.lab.analysis import aggregate, lld_verdict, load_records, phase_summary, trend_summary, warning_summary
from searchr1_lld.lab.methods import (REPO_ROOT, RUN_KEYS, RUN_PLAN, RUN_RECORD, Method, check_only_llds_differs,
                                      method_config, run_name, shared_settings)
from searchr1_lld.lab.plots import plot_curves
from searchr1_lld.lab.report import fmt, write_report


def resolve_world_dir(cfg: Config, world_dir: str | None) -> Path:
    """``--world-dir`` as given; else ``data.world_dir`` when it already holds a finished world built from exactly
    ``data.world_config`` (no second build of the same world); else ``.cache/lab-world-<hash of that world>``. The lab never
    builds into the shared default dir, which other tools rebuild when their world config differs."""
    if world_dir:
        return Path(world_dir)
    from data.build_world import is_built, world_config_hash

    shared = Path(cfg.data.world_dir)
    shared = shared if shared.is_absolute() else REPO_ROOT / shared
    world = load_world_config(cfg.data.world_config or None)
    if is_built(shared, world):
        return shared
    return REPO_ROOT / ".cache" / f"lab-world-{world_config_hash(world)}"


def prepare_world(cfg: Config, world_dir: Path, explicit: bool) -> dict[str, Any]:
    """Build the world if needed and return its card. An explicit ``--world-dir`` that holds a world is used as is."""
    from data.build_world import ensure_world, read_card

    card = read_card(world_dir)
    if card is None or not explicit:
        ensure_world(world_dir, load_world_config(cfg.data.world_config or None), progress=True)
        card = read_card(world_dir)
    if card is None:
        raise RuntimeError(f"no world card in {world_dir} after building")
    return card


def evaluate_policy(model: Any, tokenizer: Any, retriever: Any, cfg: Config, world_dir: Path, out_dir: Path,
                    name: str) -> dict[str, Any]:
    """Greedy test-split evaluation of an in-memory policy with the evaluator library; returns results.json."""
    import torch

    from searchr1_lld import evaluation as ev
    from searchr1_lld.rollout.backends import make_backend

    rows = ev.load_eval_rows([ev.SYNTHETIC], world_dir=world_dir, limit=cfg.eval.limit, split=cfg.data.test_split)
    rollout_cfg = ev.eval_rollout_config(cfg.rollout, max_turns=cfg.eval.max_turns, topk=cfg.eval.topk)
    if out_dir.exists():
        shutil.rmtree(out_dir)  # results always belong to this policy (the evaluator would resume otherwise)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            engine_cfg = dataclasses.replace(cfg.rollout, backend="hf", generation_batch_size=cfg.eval.batch_size)
            res = ev.evaluate(rows, backend=make_backend(engine_cfg, model=model, tokenizer=tokenizer),
                              tokenizer=tokenizer, retriever=retriever, rollout_cfg=rollout_cfg, out_dir=out_dir,
                              batch_size=cfg.eval.batch_size, template=cfg.data.prompt_template,
                              chat_template=cfg.data.chat_template, name=name,
                              progress=False)
    finally:
        model.train(was_training)
    assert res is not None
    return res


def eval_summary(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the EM table from one results.json (the synthetic dataset)."""
    m = results["datasets"]["synthetic"]
    return {"em": m["em"], "em_single_hop": m.get("em_single_hop"), "em_multi_hop": m.get("em_multi_hop"),
            "n": m["n"], "n_single_hop": m.get("n_single_hop"), "n_multi_hop": m.get("n_multi_hop"),
            "mean_valid_searches": m["mean_valid_searches"], "invalid_action_rate": m["invalid_action_rate"],
            "answer_rate": m["answer_rate"]}


def run_one(cfg: Config, method: Method, seed: int, world_dir: Path, retriever: Any) -> dict[str, Any]:
    """Train one (method, seed) from scratch, evaluate it, write RUN/lab_run.json; return that record."""
    from searchr1_lld.trainer import Trainer

    run_dir = Path(cfg.trainer.output_dir) / cfg.trainer.run_name
    plan = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    if run_dir.exists() and not ((run_dir / RUN_PLAN).is_file() and (run_dir / RUN_PLAN).read_text() == plan):
        shutil.rmtree(run_dir)  # another config's (or a pre-resume) run: start over
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_PLAN).write_text(plan)
    t0 = time.time()
    trainer = Trainer(cfg, run_dir=run_dir, retriever=retriever, world_dir=world_dir)
    result = trainer.run(evaluate=False)
    t_train = time.time() - t0
    t1 = time.time()
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    results = evaluate_policy(unwrapped, trainer.tokenizer, retriever, cfg, world_dir, run_dir / "eval",
                              name=run_name(method, seed))
    record = {
        "method": method.key, "label": method.label, "seed": seed, "run_dir": str(run_dir), "steps": result.steps,
        "skipped_updates": result.skipped_steps, "train_s": round(t_train, 1), "eval_s": round(time.time() - t1, 1),
        "eval": eval_summary(results), "config": cfg.to_dict(),
    }
    (run_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def evaluate_warm_start(cfg: Config, world_dir: Path, retriever: Any, out_dir: Path) -> dict[str, Any]:
    """The untrained (warm-started) policy's test EM: the common starting point of every run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    tokenizer = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(world_dir / "model"), dtype=torch.float32)
    t0 = time.time()
    results = evaluate_policy(model, tokenizer, retriever, cfg, world_dir, out_dir, name="warm start")
    return {"eval": eval_summary(results), "eval_s": round(time.time() - t0, 1), "run_dir": str(out_dir)}


def load_warm_start(eval_dir: Path) -> dict[str, Any]:
    from searchr1_lld import evaluation as ev

    return {"eval": eval_summary(ev.load_results(eval_dir)), "eval_s": 0.0, "run_dir": str(eval_dir)}


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
    rec = json.loads(path.read_text())
    ignore = set(RUN_KEYS) | {"data.world_dir"}
    want, got = flatten_dict(cfg.to_dict()), flatten_dict(rec["config"])
    # the world is not compared: the report describes the world actually used from its card (world.json)
    diff = sorted(k for k in want.keys() | got.keys()
                  if k not in ignore and not k.startswith("data.world") and want.get(k) != got.get(k))
    if diff:
        raise ConfigError(f"--report-only: {path} was trained with different settings: {diff}")
    rec["run_dir"] = str(run_dir)
    return rec


def repo_relative(path: str | Path) -> str:
    """``path`` as a reader can use it: relative to the repository root when it lies inside it (the report must not
    name the machine that wrote it), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def run_lab(*, config_path: str | Path, overrides: Sequence[str], seeds: Sequence[int], methods: Sequence[Method],
            out_dir: str | Path, runs_dir: str | Path, world_dir: str | None = None, notes: str | Path | None = None,
            quick: bool = False, command: str = "", report_only: bool = False, fresh: bool = False) -> dict[str, Any]:
    """Train and evaluate every (seed, method), then write the report. Returns the summary (also summary.json).

    Resumable and splittable: a run whose ``lab_run.json`` holds this exact config is reused (``fresh`` retrains
    it); an interrupted run resumes from its last checkpoint. Several calls with different ``--seeds`` /
    ``--methods`` on the same ``runs_dir`` (one after the other, or from separate background jobs) fill the grid;
    a last ``--report-only`` call over the whole grid writes the full report.

    ``report_only``: train nothing; rebuild the report from the finished runs in ``runs_dir`` (their lab_run.json must
    hold the config this call would have trained with, bookkeeping keys aside)."""
    import os
    import platform

    t_start = time.time()
    out_dir, runs_dir = Path(out_dir), Path(runs_dir)
    base = load_config(config_path, list(overrides))
    wdir = resolve_world_dir(base, world_dir)
    configs = {(m.key, s): method_config(config_path, overrides, m, s, world_dir=wdir, runs_dir=runs_dir)
               for s in seeds for m in methods}
    check_only_llds_differs(list(configs.values()))
    if report_only:
        from data.build_world import read_card

        card = read_card(wdir) or {}
        retriever = None
        warm = load_warm_start(runs_dir / "warm_start" / "eval")
    else:
        card = prepare_world(base, wdir, explicit=world_dir is not None)
        from retriever import make_retriever

        # one retriever shared by every run: the config's (in-process by default: the world's index)
        retriever = make_retriever(base.retriever, default_index_dir=wdir / "index")
        print(f"[lab] world {wdir}; {len(configs)} runs; runs in {runs_dir}", flush=True)
        warm_dir = runs_dir / "warm_start" / "eval"
        from searchr1_lld.evaluation import EvalError

        try:
            warm = load_warm_start(warm_dir) if not fresh else None
        except EvalError:  # no finished warm-start evaluation there yet
            warm = None
        warm = warm or evaluate_warm_start(base, wdir, retriever, warm_dir)
    print(f"[lab] warm start: test EM {warm['eval']['em']:.3f}", flush=True)
    runs = []
    for s in seeds:
        for m in methods:
            cfg = configs[(m.key, s)]
            if report_only:
                rec = load_run(cfg, runs_dir)
            elif not fresh and finished(cfg, runs_dir):
                rec = load_run(cfg, runs_dir)
                print(f"[lab] {run_name(m, s)}: finished earlier, reused ({runs_dir / cfg.trainer.run_name})", flush=True)
            else:
                rec = run_one(cfg, m, s, wdir, retriever)
            records = load_records(rec["run_dir"])
            rec["phases"] = phase_summary(records, run_steps=cfg.trainer.total_steps)
            rec["trend"] = trend_summary(records)
            rec["verdict"] = lld_verdict(rec["trend"], rec["phases"])
            rec["test_em"] = rec["eval"]["em"]
            rec.pop("config")
            runs.append(rec)
            print(f"[lab] {run_name(m, s)}: test EM {rec['eval']['em']:.3f} (single {fmt(rec['eval']['em_single_hop'])},"
                  f" multi {fmt(rec['eval']['em_multi_hop'])}), final phase {rec['phases']['final']}, "
                  f"verdict {rec['verdict']}, train {rec['train_s']:.0f}s eval {rec['eval_s']:.0f}s", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    records_by_run = {(r["method"], r["seed"]): load_records(r["run_dir"]) for r in runs}
    pngs = plot_curves(records_by_run, methods, out_dir)
    notes_text = Path(notes).read_text() if notes and Path(notes).is_file() else None
    summary = {
        "quick": quick, "report_only": report_only, "command": command, "config_path": repo_relative(config_path), "overrides": list(overrides),
        "seeds": list(seeds), "methods": [dataclasses.asdict(m) for m in methods],
        "world": {"dir": str(wdir), "counts": card.get("counts", {}), "config": card.get("config", {}),
                  "warm_start_card": card.get("warm_start", {})},
        "shared_settings": shared_settings(base), "warm_start": warm, "runs": runs,
        "aggregate": aggregate(runs, methods), "warning_summary": warning_summary(runs),
        "drawdown_summary": warning_summary(runs, "drawdown"),
        "pngs": [p.name for p in pngs],
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
        # runs_s: every run's training + evaluation, whichever pass (resumed or not) did it; wall_s: this pass
        "runs_s": round(sum(r["train_s"] + r["eval_s"] for r in runs) + (warm.get("eval_s") or 0.0), 1),
        "wall_s": round(time.time() - t_start, 1),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    report = write_report(out_dir, summary, pngs, notes_text)
    print(f"[lab] report: {report} (runs {summary['runs_s'] / 60:.1f} min, this pass {summary['wall_s'] / 60:.1f} min)",
          flush=True)
    return summary
