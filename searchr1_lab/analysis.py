"""Analysis of finished lab runs (pure: metrics records in, numbers out): phases, trends, the LLD verdict, means."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.bookkeeping.tracking import read_metrics
from searchr1_lld.instruments.alarms import finite
from searchr1_lld.instruments.monitor import (PHASES, PhaseDetector, PhaseThresholds, alarm_steps,
                                              warning_accounting)
from searchr1_lab.methods import LLD_MARGIN, REWARD_MARGIN, TREND_WINDOW, Method


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
    "persistence": steps, "warning": monitor.warning_accounting(...), "drawdown_steps": [steps where the collapse
    alarm fired], "drawdown": monitor.warning_accounting(...)}``. ``warning`` accounts the LLD alarm (early warning, or
    steady_decay / accelerated_collapse reported), ``drawdown`` the collapse alarm (probe set far below its best).
    """
    thresholds = PhaseThresholds(run_steps=run_steps or len(records))
    detector = PhaseDetector(thresholds)
    first: dict[str, int | None] = {p: None for p in PHASES}
    count: dict[str, int] = {p: 0 for p in PHASES}
    warnings_at: list[int] = []
    drawdown_at: list[int] = []
    reported: list[str] = []
    for i, r in enumerate(records):
        report = detector.detect(records[: i + 1])
        step = int(r["step"])
        count[report.phase] += 1
        if first[report.phase] is None:
            first[report.phase] = step
        if report.warning:
            warnings_at.append(step)
        if report.drawdown_alarm:
            drawdown_at.append(step)
        reported.append(report.phase)
    steps = [int(r["step"]) for r in records]
    rewards = [r.get("reward/em_mean") for r in records]
    accounting = warning_accounting(steps, rewards, alarm_steps(steps, reported, warnings_at), thresholds)
    final = reported[-1] if reported else None
    return {"first_step": first, "steps_in": count, "final": final, "warning_steps": warnings_at,
            "collapse_step": first["accelerated_collapse"], "persistence": thresholds.persistence(),
            "warning": accounting, "drawdown_steps": drawdown_at,
            "drawdown": warning_accounting(steps, rewards, drawdown_at, thresholds)}


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

    ``collapse``: the detector reported accelerated_collapse, held for the run-proportional persistence, or the
    training reward collapsed (``phases["warning"]["collapse_step"]``: judged from the reward alone; a run whose
    reward falls to nothing while the likelihood of its few correct responses holds, as an LLDS action-gate run at
    lr 1e-3 on the large-quoted world did, has collapsed all the same);
    ``LLD``: reward ended higher than it started (by more than ``REWARD_MARGIN``) while the likelihood of correct
    responses ended lower (by more than ``LLD_MARGIN`` nats/token): the sampled correct responses' per-token
    log-likelihood, or the probe set's (the same correct responses re-measured, which sampling noise cannot fake);
    ``none``: otherwise (a steady_decay report without that end-to-end pattern is not called LLD).
    """
    if phases["collapse_step"] is not None or phases["warning"]["collapse_step"] is not None:
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


PROVENANCE_SPLITS = ("test", "train")
# where the answers came from (running.provenance; world.scoring.provenance_rates), in the report's column order
PROVENANCE_KEYS = ("em", "gold_retrieved_rate", "answer_copied_rate", "right_without_gold_rate", "answer_in_passages_rate")


def aggregate(runs: Sequence[dict[str, Any]], methods: Sequence[Method]) -> list[dict[str, Any]]:
    """Per method: mean ± std over its runs of EM (all / single-hop / multi-hop) and searches per question, of
    the sampled EM (``sampled_em``) when every run of the method has one (``eval_sampled``), and of the provenance
    rates per split (``provenance``: split -> key -> cell) when every run has them."""
    rows = []
    for m in methods:
        mine = [r for r in runs if r["method"] == m.key]
        row: dict[str, Any] = {"method": m.key, "label": m.label, "seeds": [r["seed"] for r in mine]}
        for key in ("em", "em_single_hop", "em_multi_hop", "mean_valid_searches"):
            mu, sd, n = mean_std([r["eval"][key] for r in mine])
            row[key] = {"mean": mu, "std": sd, "n": n}
        if mine and all(r.get("eval_sampled") for r in mine):
            mu, sd, n = mean_std([r["eval_sampled"]["em"] for r in mine])
            row["sampled_em"] = {"mean": mu, "std": sd, "n": n}
        for split in PROVENANCE_SPLITS:
            cells = [(r.get("provenance") or {}).get(split) for r in mine]
            if mine and all(cells):
                row.setdefault("provenance", {})[split] = {
                    key: dict(zip(("mean", "std", "n"), mean_std([c[key] for c in cells]))) for key in PROVENANCE_KEYS}
        rows.append(row)
    return rows


VAL_EM_KEY = "eval/val_em"  # the trainer's greedy validation EM every trainer.eval_every steps


def val_em_curve(records: Sequence[dict[str, Any]]) -> list[list[float]]:
    """``[[step, validation EM], ...]``: the greedy validation EM the trainer measured during the run (``eval/val_em``, every
    ``trainer.eval_every`` steps and at the last one); empty when the run did not evaluate while training."""
    return [[int(r["step"]), float(r[VAL_EM_KEY])] for r in records if finite(r.get(VAL_EM_KEY))]


def curve_summary(curve: Sequence[Sequence[float]], warm_em: float | None) -> dict[str, Any]:
    """One run's held-out EM curve in three numbers: its peak (first step reaching it), its last value, and how many
    of its evaluations scored at least the warm start's ``warm_em`` (None when unknown)."""
    if not curve:
        return {"evaluations": 0}
    peak_step, peak = max(curve, key=lambda c: (c[1], -c[0]))
    at_least_warm = sum(em >= warm_em for _, em in curve) if finite(warm_em) else None
    return {"evaluations": len(curve), "peak_em": peak, "peak_step": int(peak_step), "last_em": curve[-1][1],
            "last_step": int(curve[-1][0]), "at_least_warm": at_least_warm}


def aggregate_curves(runs: Sequence[dict[str, Any]], methods: Sequence[Method]) -> list[dict[str, Any]]:
    """Per method: ``cells``, one ``{step, mean, std, n}`` per step that all its runs evaluated (mean ± std over them
    of ``val_em_curve``); methods whose runs have no curve are left out."""
    rows = []
    for m in methods:
        curves = [dict((int(s), em) for s, em in r.get("val_em_curve") or []) for r in runs if r["method"] == m.key]
        if not curves or not all(curves):
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        cells = [{"step": step, **dict(zip(("mean", "std", "n"), mean_std([c[step] for c in curves])))}
                 for step in steps]
        rows.append({"method": m.key, "label": m.label, "cells": cells})
    return rows


def load_records(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: did the run finish?")
    return read_metrics(path)


def warning_summary(runs: Sequence[dict[str, Any]], alarm: str = "warning") -> dict[str, Any]:
    """Alarm accounting over runs: collapsed runs warned / late / missed (+ lead times), non-collapsed runs with a
    false alarm / quiet. ``alarm``: which accounting of :func:`phase_summary` (``warning`` = the LLD alarm,
    ``drawdown`` = the collapse alarm)."""
    outcomes = [r["phases"][alarm]["outcome"] for r in runs]
    leads = [r["phases"][alarm]["lead_steps"] for r in runs if r["phases"][alarm]["outcome"] == "warned"]
    return {"collapsed_runs": sum(o in ("warned", "late", "missed") for o in outcomes),
            "warned": outcomes.count("warned"), "late": outcomes.count("late"), "missed": outcomes.count("missed"),
            "lead_steps": leads, "non_collapsed_runs": sum(o in ("false_alarm", "quiet") for o in outcomes),
            "false_alarms": outcomes.count("false_alarm"), "quiet": outcomes.count("quiet")}
