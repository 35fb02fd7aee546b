"""The death-spiral lab: GRPO vs LLDS (response gate, action gate, LLDS-MA) on the synthetic world, on a CPU.

    python -m searchr1_lld.lab                       # full comparison (configs/lab/lab.yaml, seeds 0,1) -> docs/lab
    python -m searchr1_lld.lab --quick --out /tmp/lab   # a few minutes: configs/lab/quick.yaml, one seed
    python -m searchr1_lld.lab --seeds 0,1 --methods grpo,llds_action trainer.lr=1e-3 rollout.n=8   # exploration
    python -m searchr1_lld.lab --report-only --runs-dir runs/lab    # rebuild the report from finished runs

What one lab does
    1. one synthetic world (``data.build_world.ensure_world``; ``--world-dir`` or ``.cache/lab-world-<config hash>``)
       and one in-process retriever shared by every run;
    2. the warm-started policy evaluated once (greedy, test split): the "warm start" row of the EM table;
    3. for every seed, for every method: ``searchr1_lld.trainer.Trainer(cfg).run()`` (metrics.jsonl, the monitor's
       phase per step) then the evaluator (``searchr1_lld.evaluation.evaluate``: greedy, test split, results.json with
       single-hop / multi-hop EM and searches per question) on the trained policy, in memory;
    4. one markdown report (``OUT/README.md``) + ``OUT/summary.json`` + side-by-side curves (``OUT/*.png``).

Methods (:data:`METHODS`) differ ONLY in ``algorithm.llds.{enabled, gate, ma}``; every other setting, the LLDS
coefficients included, comes from the same config and overrides. :func:`check_only_llds_differs` enforces this before
anything trains ("never tune the two methods differently").

Numbers in the report
    EM table: per method, mean ± sample std over seeds of the per-run test EM (all questions; single-hop; multi-hop)
    and of the mean number of valid searches per test question. "All" is the micro-average over every test question
    (what ``results.json`` calls ``em``), not the mean of the two columns.
    Phases: the trainer's phase detector (``phase/name`` per step in metrics.jsonl): first step and number of steps in
    each phase; early-warning steps are recomputed with the same detector (:class:`searchr1_lld.monitor.PhaseDetector`).
    Trends: means over the first / last ``TREND_WINDOW`` steps of reward, correct / incorrect log-likelihood per token,
    the probe set's log-likelihood (the same correct responses re-measured), entropy, and the largest grad norm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.config import Config, ConfigError, load_config
from searchr1_lld.monitor import PHASES, PhaseDetector

REPO_ROOT = Path(__file__).resolve().parent.parent
FULL_CONFIG = REPO_ROOT / "configs" / "lab" / "lab.yaml"
QUICK_CONFIG = REPO_ROOT / "configs" / "lab" / "quick.yaml"
DEFAULT_NOTES = REPO_ROOT / "docs" / "lab_notes.md"
RUN_RECORD = "lab_run.json"
TREND_WINDOW = 3
LLD_MARGIN = 0.05  # nats/token: a likelihood drop smaller than this is not called LLD
REWARD_MARGIN = 0.02  # EM: a reward gain smaller than this is not called a rise


@dataclass(frozen=True)
class Method:
    """One arm of the comparison: a label and the ``algorithm.llds.*`` overrides that define it."""

    key: str
    label: str
    overrides: tuple[str, ...]


METHODS: dict[str, Method] = {
    m.key: m
    for m in (
        Method("grpo", "GRPO", ("algorithm.llds.enabled=false",)),
        Method("llds_response", "LLDS (response gate)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=response", "algorithm.llds.ma='off'")),
        Method("llds_action", "LLDS (action gate)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=action", "algorithm.llds.ma='off'")),
        Method("llds_ma", "LLDS-MA (action gate, adaptive MA)",
               ("algorithm.llds.enabled=true", "algorithm.llds.gate=action", "algorithm.llds.ma=adaptive")),
    )
}
# Config keys a method may change; run bookkeeping keys that differ between runs by construction.
METHOD_KEYS = ("algorithm.llds.enabled", "algorithm.llds.gate", "algorithm.llds.ma")
RUN_KEYS = ("trainer.seed", "trainer.run_name", "trainer.output_dir")
RUN_PLAN = "lab_plan.json"  # the config a run directory is being trained with (resume only into the same config)

# Curves of the report: file stem -> (title, metric name, y label).
CURVES: dict[str, tuple[str, str, str]] = {
    "reward": ("training reward (EM of sampled responses)", "reward/em_mean", "EM"),
    "correct_logp": ("log-likelihood of correct responses", "lld/correct_logp_old_per_token", "nats / token"),
    "incorrect_logp": ("log-likelihood of incorrect responses", "lld/incorrect_logp_old_per_token", "nats / token"),
    "probe_logp": ("probe set: same correct responses re-measured", "probe/logp_per_token", "nats / token"),
    "delta_correct": ("Delta of correct responses (logp_new - logp_old)", "lld/correct_delta_per_token",
                      "nats / token"),
    "entropy": ("policy entropy (generated tokens)", "actor/entropy", "nats"),
    "grad_norm": ("gradient norm before clipping (max over updates)", "actor/grad_norm", "L2 norm"),
    "llds_active": ("LLDS activity: share of tokens penalised", "llds/active_token_frac", "fraction"),
    "valid_searches": ("valid searches per training response", "rollout/valid_searches_mean", "searches"),
}
METHOD_COLORS = {"grpo": "#d62728", "llds_response": "#1f77b4", "llds_action": "#2ca02c", "llds_ma": "#9467bd"}


# --------------------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]`` (distinct non-negative integers)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds must list distinct non-negative integers, got {text!r}")
    return seeds


def parse_methods(text: str) -> list[Method]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in METHODS]
    if not keys or unknown or len(set(keys)) != len(keys):
        raise ConfigError(f"--methods must be distinct names from {list(METHODS)}, got {text!r}")
    return [METHODS[k] for k in keys]


def run_name(method: Method, seed: int) -> str:
    return f"{method.key}-seed{seed}"


def method_config(config_path: str | Path, overrides: Sequence[str], method: Method, seed: int, *,
                  world_dir: str | Path, runs_dir: str | Path) -> Config:
    """The full config of one run: lab config + user overrides + the method's LLDS switches + seed and bookkeeping."""
    return load_config(config_path, [
        *overrides, *method.overrides, f"trainer.seed={seed}", f"data.world_dir={world_dir}",
        f"trainer.output_dir={runs_dir}", f"trainer.run_name={run_name(method, seed)}",
        # resumable: an interrupted run continues from its last checkpoint (trainer.save_every of the lab config);
        # the trained policy is evaluated in memory
        "trainer.resume=auto", "trainer.eval_every=0", "logging.wandb=false",
    ])


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_differences(a: Config, b: Config) -> list[str]:
    """Dotted keys whose values differ between two configs."""
    fa, fb = flatten(a.to_dict()), flatten(b.to_dict())
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


def check_only_llds_differs(configs: Sequence[Config]) -> None:
    """Raise ConfigError if two runs differ in anything but the method switches and the run bookkeeping."""
    allowed = set(METHOD_KEYS) | set(RUN_KEYS)
    for cfg in configs[1:]:
        extra = [k for k in config_differences(configs[0], cfg) if k not in allowed]
        if extra:
            raise ConfigError(f"runs {configs[0].trainer.run_name} and {cfg.trainer.run_name} differ in {extra}: "
                              "the methods must share every setting except algorithm.llds.{enabled,gate,ma}")


def shared_settings(cfg: Config) -> list[tuple[str, Any]]:
    """The settings that shape the dynamics (shown in the report)."""
    keys = ["trainer.total_steps", "trainer.train_batch_size", "trainer.ppo_mini_batch_size", "trainer.ppo_epochs",
            "trainer.lr", "trainer.warmup_ratio", "trainer.grad_clip", "rollout.n", "rollout.temperature",
            "rollout.max_turns", "rollout.max_tokens_per_turn", "algorithm.kl_coef", "algorithm.entropy_coef",
            "algorithm.clip_eps", "algorithm.llds.lam", "algorithm.llds.tau", "algorithm.llds.lam_answer",
            "eval.max_turns", "eval.topk", "eval.limit"]
    flat = flatten(cfg.to_dict())
    return [(k, flat[k]) for k in keys]


def resolve_world_dir(cfg: Config, world_dir: str | None) -> Path:
    """``--world-dir`` as given; else ``data.world_dir`` when it already holds a finished world built from exactly
    ``data.world`` (no second build of the same world); else ``.cache/lab-world-<hash of data.world>``. The lab never
    builds into the shared default dir, which other tools rebuild when their world config differs."""
    if world_dir:
        return Path(world_dir)
    from data.build_world import is_built, world_config_hash

    shared = Path(cfg.data.world_dir)
    shared = shared if shared.is_absolute() else REPO_ROOT / shared
    if is_built(shared, cfg.data.world):
        return shared
    return REPO_ROOT / ".cache" / f"lab-world-{world_config_hash(cfg.data.world)}"


def prepare_world(cfg: Config, world_dir: Path, explicit: bool) -> dict[str, Any]:
    """Build the world if needed and return its card. An explicit ``--world-dir`` that holds a world is used as is."""
    from data.build_world import ensure_world, read_card

    card = read_card(world_dir)
    if card is None or not explicit:
        ensure_world(world_dir, cfg.data.world, progress=True)
        card = read_card(world_dir)
    if card is None:
        raise RuntimeError(f"no world card in {world_dir} after building")
    return card


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------


def evaluate_policy(model: Any, tokenizer: Any, retriever: Any, cfg: Config, world_dir: Path, out_dir: Path,
                    name: str) -> dict[str, Any]:
    """Greedy test-split evaluation of an in-memory policy with the evaluator library; returns results.json."""
    import torch

    from searchr1_lld import evaluation as ev
    from searchr1_lld.rollout.backends.hf import HFBackend

    rows = ev.load_eval_rows([ev.SYNTHETIC], world_dir=world_dir, limit=cfg.eval.limit, split=cfg.data.test_split)
    rollout_cfg = ev.eval_rollout_config(cfg.rollout, max_turns=cfg.eval.max_turns, topk=cfg.eval.topk)
    if out_dir.exists():
        shutil.rmtree(out_dir)  # results always belong to this policy (the evaluator would resume otherwise)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            res = ev.evaluate(rows, backend=HFBackend(model, tokenizer, batch_size=cfg.eval.batch_size),
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
    want, got = flatten(cfg.to_dict()), flatten(rec["config"])
    # data.world.* is not compared: the report describes the world actually used from its card (world.json)
    diff = sorted(k for k in want.keys() | got.keys()
                  if k not in ignore and not k.startswith("data.world.") and want.get(k) != got.get(k))
    if diff:
        raise ConfigError(f"--report-only: {path} was trained with different settings: {diff}")
    rec["run_dir"] = str(run_dir)
    return rec


# --------------------------------------------------------------------------------------------------------------------
# Analysis (pure: records in, numbers out)
# --------------------------------------------------------------------------------------------------------------------


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof = 1; 0 for a single value) of the finite values; (nan, nan, 0) if
    none."""
    vals = [float(v) for v in values if finite(v)]
    if not vals:
        return float("nan"), float("nan"), 0
    mu = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mu, sd, len(vals)


def phase_summary(records: Sequence[dict[str, Any]], run_steps: int | None = None) -> dict[str, Any]:
    """Phases of one run, recomputed from its metrics.jsonl records with evidence proportional to the run.

    The detector (:class:`PhaseDetector`) is re-run on the logged history up to each step with
    ``PhaseThresholds(run_steps=run_steps or len(records))``: a phase (and the early warning) counts only once it held
    for ``persistence()`` consecutive steps, which grows with the run. (The trainer's online ``phase/name`` uses the
    minimum persistence, since it does not know how long the run will be.)

    Returns ``{"first_step": {phase: step or None}, "steps_in": {phase: count}, "final": phase,
    "warning_steps": [steps where the early warning fired], "collapse_step": first accelerated_collapse step or None,
    "persistence": steps, "warning": monitor.warning_accounting(...)}`` (alarm = early warning, or steady_decay /
    accelerated_collapse reported).
    """
    from searchr1_lld.monitor import PhaseThresholds, alarm_steps, warning_accounting

    thresholds = PhaseThresholds(run_steps=run_steps or len(records))
    detector = PhaseDetector(thresholds)
    first: dict[str, int | None] = {p: None for p in PHASES}
    count: dict[str, int] = {p: 0 for p in PHASES}
    warnings_at: list[int] = []
    reported: list[str] = []
    for i, r in enumerate(records):
        report = detector.detect(records[: i + 1])
        step = int(r["step"])
        count[report.phase] += 1
        if first[report.phase] is None:
            first[report.phase] = step
        if report.warning:
            warnings_at.append(step)
        reported.append(report.phase)
    steps = [int(r["step"]) for r in records]
    accounting = warning_accounting(steps, [r.get("reward/em_mean") for r in records],
                                    alarm_steps(steps, reported, warnings_at), thresholds)
    final = reported[-1] if reported else None
    return {"first_step": first, "steps_in": count, "final": final, "warning_steps": warnings_at,
            "collapse_step": first["accelerated_collapse"], "persistence": thresholds.persistence(),
            "warning": accounting}


def window_mean(records: Sequence[dict[str, Any]], key: str, which: str, k: int = TREND_WINDOW) -> float:
    vals = [r[key] for r in records if finite(r.get(key))]
    if not vals:
        return float("nan")
    part = vals[:k] if which == "first" else vals[-k:]
    return sum(part) / len(part)


def trend_summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Start / end means (first and last ``TREND_WINDOW`` finite values) of the LLD signals of one run."""
    out: dict[str, float] = {}
    for name, key in (("reward", "reward/em_mean"), ("correct_logp", "lld/correct_logp_old_per_token"),
                      ("incorrect_logp", "lld/incorrect_logp_old_per_token"), ("probe_logp", "probe/logp_per_token"),
                      ("entropy", "actor/entropy")):
        out[f"{name}_start"] = window_mean(records, key, "first")
        out[f"{name}_end"] = window_mean(records, key, "last")
    vals = [r["lld/correct_logp_old_per_token"] for r in records if finite(r.get("lld/correct_logp_old_per_token"))]
    out["correct_logp_peak"] = max(vals) if vals else float("nan")
    gn = [r["actor/grad_norm"] for r in records if finite(r.get("actor/grad_norm"))]
    out["grad_norm_max"] = max(gn) if gn else float("nan")
    out["grad_norm_first"] = window_mean(records, "actor/grad_norm", "first")
    rate = [r["lld/rate"] for r in records if finite(r.get("lld/rate"))]
    out["lld_rate_mean"] = sum(rate) / len(rate) if rate else float("nan")
    return out


def lld_verdict(trend: dict[str, float], phases: dict[str, Any]) -> str:
    """The run's verdict, computed (never written by hand): one of ``collapse``, ``LLD``, ``none``.

    ``collapse``: the detector reported accelerated_collapse, held for the run-proportional persistence;
    ``LLD``: reward ended higher than it started (by more than ``REWARD_MARGIN``) while the likelihood of correct
    responses ended lower (by more than ``LLD_MARGIN`` nats/token): the sampled correct responses' per-token
    log-likelihood, or the probe set's (the same correct responses re-measured, which sampling noise cannot fake);
    ``none``: otherwise (a steady_decay report without that end-to-end pattern is not called LLD).
    """
    if phases["collapse_step"] is not None:
        return "collapse"
    r0, r1 = trend["reward_start"], trend["reward_end"]
    reward_up = finite(r0) and finite(r1) and r1 > r0 + REWARD_MARGIN
    likelihood_down = any(
        finite(trend[f"{k}_start"]) and finite(trend[f"{k}_end"])
        and trend[f"{k}_end"] < trend[f"{k}_start"] - LLD_MARGIN
        for k in ("correct_logp", "probe_logp")
    )
    if reward_up and likelihood_down:
        return "LLD"
    return "none"


def aggregate(runs: Sequence[dict[str, Any]], methods: Sequence[Method]) -> list[dict[str, Any]]:
    """Per method: mean ± std over its runs of EM (all / single-hop / multi-hop) and searches per question."""
    rows = []
    for m in methods:
        mine = [r for r in runs if r["method"] == m.key]
        row: dict[str, Any] = {"method": m.key, "label": m.label, "seeds": [r["seed"] for r in mine]}
        for key in ("em", "em_single_hop", "em_multi_hop", "mean_valid_searches"):
            mu, sd, n = mean_std([r["eval"][key] for r in mine])
            row[key] = {"mean": mu, "std": sd, "n": n}
        rows.append(row)
    return rows


def load_records(run_dir: str | Path) -> list[dict[str, Any]]:
    from searchr1_lld.tracking import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: did the run finish?")
    return read_metrics(path)


# --------------------------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------------------------


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        if finite(r.get(key)):
            xs.append(int(r["step"]))
            ys.append(float(r[key]))
    return xs, ys


def _seed_mean(curves: Sequence[tuple[list[int], list[float]]]) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for xs, ys in curves:
        for x, y in zip(xs, ys):
            by_step.setdefault(x, []).append(y)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def _draw(ax: Any, records_by_run: dict[tuple[str, int], list[dict]], methods: Sequence[Method], key: str) -> None:
    for m in methods:
        curves = [_series(recs, key) for (mk, _), recs in records_by_run.items() if mk == m.key]
        color = METHOD_COLORS.get(m.key)
        for xs, ys in curves:
            if len(curves) > 1:
                ax.plot(xs, ys, color=color, alpha=0.25, lw=0.8)
        xs, ys = _seed_mean(curves)
        if xs:
            ax.plot(xs, ys, color=color, lw=1.8, marker="o", ms=2.5, label=m.label)


def plot_curves(records_by_run: dict[tuple[str, int], list[dict]], methods: Sequence[Method],
                out_dir: Path) -> list[Path]:
    """One PNG per curve of :data:`CURVES` (methods overlaid: thin = one seed, bold = mean over seeds) and
    ``overview.png`` with every curve side by side. Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (title, key, ylabel) in CURVES.items():
        fig, ax = plt.subplots(figsize=(6, 3.4))
        _draw(ax, records_by_run, methods, key)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel, fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    cols = 3
    rows = math.ceil(len(CURVES) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3 * rows), squeeze=False)
    for ax, (stem, (title, key, ylabel)) in zip(axes.flat, CURVES.items()):
        _draw(ax, records_by_run, methods, key)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in list(axes.flat)[len(CURVES):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = out_dir / "overview.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written


# --------------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------------


def fmt(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if finite(x) else "-"


def fmt_ms(cell: dict[str, Any], nd: int = 3) -> str:
    """``mean ± std`` as the EM table prints it (the test parses this back)."""
    if not finite(cell["mean"]):
        return "-"
    return f"{cell['mean']:.{nd}f} ± {cell['std']:.{nd}f}"


def em_table(agg: Sequence[dict[str, Any]], warm: dict[str, Any] | None) -> str:
    lines = ["| Method | seeds | Single-hop EM | Multi-hop EM | All (avg.) EM | searches / question |",
             "|---|---|---:|---:|---:|---:|"]
    if warm is not None:
        e = warm["eval"]
        lines.append(f"| warm start (untrained) | - | {fmt(e['em_single_hop'])} | {fmt(e['em_multi_hop'])} | "
                     f"{fmt(e['em'])} | {fmt(e['mean_valid_searches'], 2)} |")
    for row in agg:
        lines.append(f"| {row['label']} | {','.join(map(str, row['seeds']))} | {fmt_ms(row['em_single_hop'])} | "
                     f"{fmt_ms(row['em_multi_hop'])} | {fmt_ms(row['em'])} | {fmt_ms(row['mean_valid_searches'], 2)} |")
    return "\n".join(lines) + "\n"


def per_run_table(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["| run | single-hop EM | multi-hop EM | all EM | searches / q | answered | train s | eval s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        e = r["eval"]
        lines.append(f"| {run_name(METHODS[r['method']], r['seed'])} | {fmt(e['em_single_hop'])} | "
                     f"{fmt(e['em_multi_hop'])} | {fmt(e['em'])} | {fmt(e['mean_valid_searches'], 2)} | "
                     f"{fmt(e['answer_rate'], 2)} | {r['train_s']:.0f} | {r['eval_s']:.0f} |")
    return "\n".join(lines) + "\n"


def phase_table(runs: Sequence[dict[str, Any]]) -> str:
    head = " | ".join(f"{p} (first step / steps)" for p in PHASES)
    lines = [f"| run | {head} | final phase | early-warning steps | reward collapsed at | warning lead | verdict |",
             "|---|" + "---|" * len(PHASES) + "---|---|---|---|---|"]
    for r in runs:
        ph = r["phases"]
        cells = [f"{'-' if ph['first_step'][p] is None else ph['first_step'][p]} / {ph['steps_in'][p]}" for p in PHASES]
        warn = ph["warning_steps"]
        warn_txt = "none" if not warn else f"{len(warn)} (first {warn[0]})"
        acc = ph["warning"]
        collapsed = "-" if acc["collapse_step"] is None else str(acc["collapse_step"])
        lead = {"warned": f"{acc['lead_steps']} steps", "late": "late", "missed": "missed",
                "false_alarm": "false alarm", "quiet": "-"}[acc["outcome"]]
        lines.append(f"| {run_name(METHODS[r['method']], r['seed'])} | " + " | ".join(cells) +
                     f" | {ph['final']} | {warn_txt} | {collapsed} | {lead} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def warning_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Alarm accounting over runs: collapsed runs warned / late / missed (+ lead times), non-collapsed runs with a
    false alarm / quiet."""
    outcomes = [r["phases"]["warning"]["outcome"] for r in runs]
    leads = [r["phases"]["warning"]["lead_steps"] for r in runs if r["phases"]["warning"]["outcome"] == "warned"]
    return {"collapsed_runs": sum(o in ("warned", "late", "missed") for o in outcomes),
            "warned": outcomes.count("warned"), "late": outcomes.count("late"), "missed": outcomes.count("missed"),
            "lead_steps": leads, "non_collapsed_runs": sum(o in ("false_alarm", "quiet") for o in outcomes),
            "false_alarms": outcomes.count("false_alarm"), "quiet": outcomes.count("quiet")}


def warning_text(w: dict[str, Any]) -> str:
    lead = (f"lead times {', '.join(map(str, w['lead_steps']))} steps" if w["lead_steps"] else "no lead time measured")
    return (f"Runs whose reward collapsed: {w['collapsed_runs']} (warned before the collapse: {w['warned']}, {lead}; "
            f"warned only at/after it: {w['late']}; never warned: {w['missed']}). Runs that did not collapse: "
            f"{w['non_collapsed_runs']} (false alarms: {w['false_alarms']}; quiet: {w['quiet']}).")


def trend_table(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["| run | reward start→end | correct logp/tok start→peak→end | incorrect logp/tok start→end | "
             "probe logp/tok start→end | entropy start→end | grad norm first→max | LLD rate (mean) |",
             "|---|---|---|---|---|---|---|---:|"]
    for r in runs:
        t = r["trend"]
        lines.append(
            f"| {run_name(METHODS[r['method']], r['seed'])} | {fmt(t['reward_start'])}→{fmt(t['reward_end'])} | "
            f"{fmt(t['correct_logp_start'])}→{fmt(t['correct_logp_peak'])}→{fmt(t['correct_logp_end'])} | "
            f"{fmt(t['incorrect_logp_start'])}→{fmt(t['incorrect_logp_end'])} | "
            f"{fmt(t['probe_logp_start'])}→{fmt(t['probe_logp_end'])} | "
            f"{fmt(t['entropy_start'])}→{fmt(t['entropy_end'])} | {fmt(t['grad_norm_first'], 2)}→"
            f"{fmt(t['grad_norm_max'], 2)} | {fmt(t['lld_rate_mean'], 2)} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, summary: dict[str, Any], pngs: Sequence[Path], notes: str | None) -> Path:
    """``OUT/README.md`` from the summary (everything in it is also in summary.json)."""
    s = summary
    lines = [f"# Death-spiral lab: GRPO vs LLDS on the synthetic world{' (quick mode)' if s['quick'] else ''}", ""]
    lines += [
        f"Command: `{s['command']}`  ",
        f"Config: `{s['config_path']}` + overrides `{' '.join(s['overrides']) or '(none)'}`  ",
        f"Seeds: {', '.join(map(str, s['seeds']))}; methods: {', '.join(m['label'] for m in s['methods'])}  ",
        f"World: `{s['world']['dir']}` ({s['world']['counts'].get('train_questions')} train / "
        f"{s['world']['counts'].get('test_questions')} test questions, "
        f"{s['world']['counts'].get('test_multi_hop')} test multi-hop; multi-hop share "
        f"{s['world']['config'].get('multi_hop_fraction')}, model hidden {s['world']['config'].get('model_hidden_size')}"
        f" x {s['world']['config'].get('model_layers')} layers)  ",
        (f"Time: {s['wall_s'] / 60:.1f} min = sum of the runs' training + evaluation times ({s['machine']}); this "
         "report was rebuilt with --report-only from finished runs." if s.get("report_only") else
         f"Wall time: {s['wall_s'] / 60:.1f} min on this machine ({s['machine']})."),
        "",
        "The methods share every setting; they differ only in `algorithm.llds.{enabled,gate,ma}` (checked by "
        "`check_only_llds_differs` before training). LLDS-MA here is the **adaptive** variant: answer-span "
        "coefficient `min(lam, lam_answer * max(mean valid searches - 1, 0))`.",
        "",
        "| shared setting | value |", "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in s["shared_settings"]],
        "",
        "## Test exact match (greedy, world test split)",
        "",
        "Mean ± sample std over seeds. *All* = EM over every test question (micro-average), not the mean of the two "
        "columns. *searches / question* = mean valid searches per test question.",
        "",
        em_table(s["aggregate"], s.get("warm_start")),
        "Per run:",
        "",
        per_run_table(s["runs"]),
        "## Curves",
        "",
        "Thin lines: one seed; bold: mean over seeds. `overview.png` has every curve side by side.",
        "",
        *[f"![{p.stem}]({p.name})" for p in pngs if p.name == "overview.png"],
        "",
        *[f"- [{p.stem}]({p.name})" for p in pngs if p.name != "overview.png"],
        "",
        "## Phases detected by the monitor",
        "",
        "The monitor's `PhaseDetector` re-run on each run's metrics.jsonl with evidence proportional to the run: a "
        "phase (and the early warning) counts only after its condition held on "
        f"{s['runs'][0]['phases']['persistence'] if s['runs'] else '-'} consecutive steps "
        "(`max(2, ceil(0.1 x steps))`). First step each phase was reported and how many steps it lasted. "
        "Early-warning steps: 'correct likelihood falls while reward rises'. *Reward collapsed at*: judged from the "
        "reward alone (two-step mean at or below 0.3 x its peak from that step to the end of the run, peak >= 0.05); "
        "*warning lead*: steps from the first alarm (early warning, or steady_decay / accelerated_collapse reported) "
        "to that collapse (`late` / `missed` when the alarm came at or after it / never; `false alarm` when a run "
        "that did not collapse raised one). Verdict (computed): `collapse` "
        "(accelerated_collapse reported), `LLD` (mean of the last "
        f"{TREND_WINDOW} values vs the first {TREND_WINDOW}: reward up by more than {REWARD_MARGIN} while the "
        f"correct-response or probe-set log-likelihood per token is down by more than {LLD_MARGIN} nats), `none`.",
        "",
        phase_table(s["runs"]),
        "Early warning: " + warning_text(s["warning_summary"]),
        "",
        "## Trends (first / last " + str(TREND_WINDOW) + " logged values)",
        "",
        trend_table(s["runs"]),
    ]
    lines += ["## Experiments tried", ""]
    lines += [notes.strip(), ""] if notes else ["(no notes file given)", ""]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


# --------------------------------------------------------------------------------------------------------------------
# The lab
# --------------------------------------------------------------------------------------------------------------------


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
        from retriever.inprocess import InProcessRetriever

        retriever = InProcessRetriever(str(wdir / "index"))
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
        "quick": quick, "report_only": report_only, "command": command, "config_path": str(config_path), "overrides": list(overrides),
        "seeds": list(seeds), "methods": [dataclasses.asdict(m) for m in methods],
        "world": {"dir": str(wdir), "counts": card.get("counts", {}), "config": card.get("config", {}),
                  "warm_start_card": card.get("warm_start", {})},
        "shared_settings": shared_settings(base), "warm_start": warm, "runs": runs,
        "aggregate": aggregate(runs, methods), "warning_summary": warning_summary(runs),
        "pngs": [p.name for p in pngs],
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
        "wall_s": round(time.time() - t_start, 1) if not report_only else
        round(sum(r["train_s"] + r["eval_s"] for r in runs) + (warm.get("eval_s") or 0.0), 1),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    report = write_report(out_dir, summary, pngs, notes_text)
    print(f"[lab] report: {report} ({summary['wall_s'] / 60:.1f} min)", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m searchr1_lld.lab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the few-minute mode (configs/lab/quick.yaml, seed 0)")
    p.add_argument("--config", help="lab config (default: configs/lab/lab.yaml, or quick.yaml with --quick)")
    p.add_argument("--seeds", help="comma-separated seeds (default: 0,1, about an hour on 2 cores; 0 with --quick)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    p.add_argument("--out", help="report dir (default: docs/lab; runs/lab-quick/report with --quick)")
    p.add_argument("--runs-dir", help="where the runs go (default: runs/lab or runs/lab-quick)")
    p.add_argument("--world-dir", help="an existing world dir to use as is (default: .cache/lab-world-<hash>)")
    p.add_argument("--notes", default=str(DEFAULT_NOTES), help="markdown put under 'Experiments tried'")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs in --runs-dir")
    p.add_argument("--fresh", action="store_true", help="retrain runs that already finished with the same config")
    p.add_argument("overrides", nargs="*", help="key=value config overrides applied to every method")
    args = p.parse_args(argv)
    config = args.config or str(QUICK_CONFIG if args.quick else FULL_CONFIG)
    try:
        seeds = parse_seeds(args.seeds or ("0" if args.quick else "0,1"))
        methods = parse_methods(args.methods)
        run_lab(
            config_path=config, overrides=args.overrides, seeds=seeds, methods=methods,
            out_dir=args.out or ("runs/lab-quick/report" if args.quick else "docs/lab"),
            runs_dir=args.runs_dir or ("runs/lab-quick" if args.quick else "runs/lab"), world_dir=args.world_dir,
            notes=args.notes, quick=args.quick, report_only=args.report_only, fresh=args.fresh,
            command="python -m searchr1_lld.lab " + " ".join(argv if argv is not None else sys.argv[1:]),
        )
    except ConfigError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
