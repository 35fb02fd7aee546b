"""Early-warning alarms scored at a matched false-alarm rate (pure: per-step records and collapse labels in, numbers
out).

An alarm is a per-step SCORE computed at step ``t`` from the run's records up to ``t`` only (no look-ahead), one of
the registered kinds of :mod:`searchr1_lld.instruments.alarms` (the study's: :data:`STUDY_ALARMS`, each with a
:class:`ScoreWindow`); the larger the score, the nearer the run is taken to be to a collapse. Its threshold is not
chosen by hand: within one learning rate, it is the smallest value above which at most a given share of the runs that
did NOT collapse ever score (:func:`matched_threshold`), so every alarm is held to the same false-alarm rate and they
are compared by how early they warn of the collapses (:func:`alarm_study`): the lead of a collapsed run is its
collapse step minus the first step whose score exceeds the threshold, when that is before the collapse. Each alarm's
leads are compared with the reference alarm's (the drop in training reward, what a user would watch anyway), paired
over the collapsed runs, with a bootstrap interval.

Two rules say which firings are false alarms (:data:`FALSE_ALARM_RULES`, the ``rule`` of :func:`alarm_study`):
``calm_runs`` (the registered one: any firing of a run that did not collapse; the leads of the collapsed runs count
from step 1) and ``healthy_stretch`` (exploratory, for grids where every run collapses: a firing during a run's
healthy stretch, the steps before its held-out EM (``eval/val_sub_em``) first falls below its own step-0 value; every
run sets the threshold, and a collapsed run's lead counts from the end of its stretch, so it measures how early in
the decline an alarm noticed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from searchr1_lld.instruments.alarms import Records, ScoreWindow, finite, median, series
from searchr1_lld.instruments.alarms import score_series as alarm_scores
from searchr1_lab.stats.bootstrap import BOOT_SEED, N_BOOT, bootstrap_mean

NAN = float("nan")
REFERENCE_ALARM = "reward_drop"
HELD_OUT = "eval/val_sub_em"
# the study's alarms: kinds of the one registry (searchr1_lld.instruments.alarms), each scored with a ScoreWindow
STUDY_ALARMS = ("reward_drop", "probe_drop", "correct_logp_drop", "step_kl_rise")


def score_series(records: Records, alarm: str, window: ScoreWindow = ScoreWindow()) -> list[tuple[int, float]]:
    """``[(t, score_t)]`` of the registered alarm kind ``alarm`` for every step ``t >= 1`` of the run, ``score_t``
    computed from the records of steps ``<= t`` only."""
    return alarm_scores(records, alarm, window=window)


def peak(scores: Sequence[tuple[int, float]]) -> float:
    """The largest finite score of a run (``-inf`` when it never had one: it can never fire)."""
    return max((s for _, s in scores if finite(s)), default=-math.inf)


def matched_threshold(calm_peaks: Sequence[float], false_alarm_rate: float) -> float:
    """The smallest threshold at which at most ``false_alarm_rate`` of the runs that did not collapse ever fire.

    An alarm fires at the first step whose score EXCEEDS the threshold (``score > threshold``). With ``m`` the
    ``n`` calm runs' peak scores (:func:`peak`) and ``k = floor(rate * n)`` false alarms allowed, the runs that fire
    are those with ``m_i > threshold``, and the smallest threshold that lets at most ``k`` of them fire is the
    ``(k + 1)``-th largest peak (``-inf`` when ``k >= n``: every run may fire).
    """
    n = len(calm_peaks)
    k = math.floor(false_alarm_rate * n + 1e-9)
    if k >= n:
        return -math.inf
    return sorted(calm_peaks, reverse=True)[k]


def first_firing(scores: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first step whose score exceeds ``threshold``, or None."""
    return next((t for t, s in scores if finite(s) and s > threshold), None)


def lead(collapse_step: int, fired: int | None) -> int | None:
    """``collapse_step - fired`` when the alarm fired strictly before the collapse; None (missed) otherwise."""
    return collapse_step - fired if fired is not None and fired < collapse_step else None


@dataclass(frozen=True)
class LabelledRun:
    """One run's per-step records and its collapse label (``time``: collapse step or horizon; ``event``: 1/0)."""

    name: str
    records: Records
    time: int
    event: int


def _leads(runs: Sequence[LabelledRun], alarm: str, threshold: float, window: ScoreWindow) -> list[int | None]:
    """Per collapsed run (in order), the alarm's lead or None (missed)."""
    return [lead(r.time, first_firing(score_series(r.records, alarm, window), threshold)) for r in runs if r.event]


def alarm_at_matched_rate(runs: Sequence[LabelledRun], alarm: str, false_alarm_rate: float,
                          window: ScoreWindow = ScoreWindow()) -> dict[str, Any]:
    """One alarm over the runs of one learning rate: its matched threshold (:func:`matched_threshold` over the runs
    with ``event = 0``), the share of those runs that fire at it (``false_alarm_share``, <= the rate), the collapsed
    runs it warned of (``detections``, ``k/n``), each collapsed run's lead (None: missed) and the median lead of the
    warned runs (None when none was)."""
    calm = [peak(score_series(r.records, alarm, window)) for r in runs if not r.event]
    threshold = matched_threshold(calm, false_alarm_rate)
    return alarm_result(alarm, threshold, calm, _leads(runs, alarm, threshold, window))


def alarm_result(alarm: str, threshold: float, calm_peaks: Sequence[float], leads: list[int | None]) -> dict[str, Any]:
    """One alarm at its threshold: how many of the peaks it was matched on exceed it (``false_alarms``, ``k/n``, and
    ``false_alarm_share``), the collapsed runs it warned of (``detections``), their ``leads`` (None: missed) and the
    median lead of the warned runs (None when none was)."""
    fired = sum(p > threshold for p in calm_peaks)
    warned = [x for x in leads if x is not None]
    return {"alarm": alarm, "threshold": threshold,
            "false_alarm_share": fired / len(calm_peaks) if calm_peaks else None,
            "false_alarms": f"{fired}/{len(calm_peaks)}", "detections": f"{len(warned)}/{len(leads)}", "leads": leads,
            "median_lead": median(warned) if warned else None}


def not_estimable(runs: Sequence[LabelledRun]) -> str | None:
    """Why a matched false-alarm rate cannot be set or tested on ``runs`` (fewer than 2 collapsed or fewer than 2
    calm runs), or None."""
    collapsed = sum(1 for r in runs if r.event)
    calm = len(runs) - collapsed
    if collapsed < 2 or calm < 2:
        return (f"not estimable: {collapsed} collapsed and {calm} non-collapsed runs (at least 2 of each are needed "
                "to set a threshold on the calm runs and compare leads over the collapsed ones)")
    return None


def healthy_end(records: Records, key: str = HELD_OUT) -> float:
    """The first step after 0 at which the held-out ``key`` is below the run's own step-0 value (the run's healthy
    stretch is the steps before it); ``inf`` when it never falls below, NaN without a step-0 value."""
    ref = [v for s, v in series(records, key) if s == 0]
    if not ref:
        return NAN
    return float(min((s for s, v in series(records, key) if s > 0 and v < ref[0]), default=math.inf))


def alarm_on_healthy_stretch(runs: Sequence[LabelledRun], alarm: str, false_alarm_rate: float,
                             window: ScoreWindow = ScoreWindow()) -> dict[str, Any]:
    """One alarm over the runs of one rate under the ``healthy_stretch`` rule: the threshold is matched
    (:func:`matched_threshold`) on every run's peak score over its healthy stretch (:func:`healthy_end`; runs
    without a step-0 held-out value are left out), ``false_alarms`` counts the runs that fire there, and a collapsed
    run's lead is its collapse step minus the first firing at or after the end of its stretch (None: missed).
    Same fields as :func:`alarm_at_matched_rate`."""
    usable = [(r, healthy_end(r.records)) for r in runs]
    usable = [(r, end, score_series(r.records, alarm, window)) for r, end in usable if not math.isnan(end)]
    healthy = [peak([(t, v) for t, v in scores if t < end]) for _, end, scores in usable]
    threshold = matched_threshold(healthy, false_alarm_rate)
    leads = [lead(r.time, first_firing([(t, v) for t, v in scores if t >= end], threshold))
             for r, end, scores in usable if r.event]
    return alarm_result(alarm, threshold, healthy, leads)


def not_estimable_on_healthy_stretch(runs: Sequence[LabelledRun]) -> str | None:
    """Why the ``healthy_stretch`` rule cannot be applied to ``runs`` (fewer than 2 collapsed runs, or fewer than 2
    runs with a healthy stretch to set the threshold on), or None."""
    collapsed = sum(1 for r in runs if r.event)
    stretches = sum(1 for r in runs if healthy_end(r.records) > 1)
    if collapsed < 2 or stretches < 2:
        return (f"not estimable: {collapsed} collapsed runs and {stretches} with a healthy stretch (at least 2 of "
                "each are needed)")
    return None


# a false-alarm rule: (one alarm at the matched rate, why the runs cannot be tested under it or None)
FALSE_ALARM_RULES: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[Sequence[LabelledRun]], str | None]]] = {
    "calm_runs": (alarm_at_matched_rate, not_estimable),
    "healthy_stretch": (alarm_on_healthy_stretch, not_estimable_on_healthy_stretch)}


def alarm_study(runs: Sequence[LabelledRun], alarms: Sequence[str], false_alarm_rate: float,
                reference: str = REFERENCE_ALARM, window: ScoreWindow = ScoreWindow(), n_boot: int = N_BOOT,
                seed: int = BOOT_SEED, rule: str = "calm_runs") -> dict[str, Any]:
    """Every alarm of ``alarms`` and the ``reference`` alarm at the matched false-alarm rate over ``runs`` (one
    learning rate), and for each alarm the paired difference of leads against the reference over the collapsed runs,
    ``mean_i (lead_alarm,i - lead_reference,i)`` with a missed warning counted as lead 0, with its bootstrap interval
    (:func:`searchr1_lab.stats.bootstrap.bootstrap_mean`, runs resampled). ``supported`` for an alarm when that interval lies above 0.

    ``rule`` names which firings are false alarms (:data:`FALSE_ALARM_RULES`). ``{"estimable": False,
    "reason"}`` instead when the rule's check (:func:`not_estimable` for ``calm_runs``) says so.
    """
    at_rate, why_not = FALSE_ALARM_RULES[rule]
    reason = why_not(runs)
    base = {"rule": rule, "false_alarm_rate": false_alarm_rate, "reference": reference, "runs": len(runs),
            "collapsed": sum(1 for r in runs if r.event)}
    if reason:
        return {**base, "estimable": False, "reason": reason}
    ref = at_rate(runs, reference, false_alarm_rate, window)
    out = {reference: ref}
    for alarm in alarms:
        res = at_rate(runs, alarm, false_alarm_rate, window)
        gains = [(a or 0) - (r or 0) for a, r in zip(res["leads"], ref["leads"])]
        diff = bootstrap_mean(gains, n_boot, seed)
        out[alarm] = {**res, "versus_reference": diff, "supported": diff["low"] is not None and diff["low"] > 0}
    return {**base, "estimable": True, "reason": None, "alarms": out}
