"""The pre-registered comparison's ground truth and its alarms, scored (pure: per-step records in, numbers out).

Ground truth comes from held-out data: :func:`held_out_collapse_step` reads a run's validation-EM curve (the trainer's
greedy EM on the validation split, on a fixed schedule) against the warm start's validation EM. The training-reward
rule (:func:`searchr1_lld.instruments.phases.reward_collapse_step`) stays a secondary signal.

An alarm (:class:`searchr1_lld.instruments.alarms.Alarm`, one of the registered kinds with its registered threshold)
fires at the first step its score, computed from the records up to that step, reaches its threshold. An alarm
whose definition reads a collapse signal (:data:`COLLAPSE_SIGNALS`: the validation EM the label is computed from, and
the training reward the secondary label is) is refused when it is made: it would contain the thing it predicts.
:func:`score_alarm` scores one alarm against the label over a set of runs, overall and within each learning rate
(the rate alone predicts collapse on a grid that spans the edge of stability, so an alarm earns its place only where
it separates runs at one rate): sensitivity (collapsed runs alarmed strictly before the collapse step), specificity
(runs that did not collapse and never alarmed), each with a Wilson score interval, and the lead times.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchr1_lld.instruments.alarms import Alarm, median
from searchr1_lab.analysis import VAL_EM_KEY, finite
from searchr1_lab.stats.proportions import wilson

REWARD = "reward/em_mean"
# the series a collapse label is computed from: no alarm may read them
COLLAPSE_SIGNALS = frozenset({VAL_EM_KEY, REWARD})


def held_out_collapse_step(val_curve: Sequence[Sequence[float]], warm_em: float, *, ratio: float = 0.3,
                           persist: int = 2) -> int | None:
    """The step at which a run's held-out EM collapsed for good, or None.

    ``val_curve``: ``[[step, validation EM], ...]`` in step order (the schedule the run evaluated on); ``warm_em``: the
    warm start's validation EM (step 0). The run collapsed at the first evaluation from which every evaluation to the
    end scores at most ``ratio * warm_em``, provided that stretch holds at least ``persist`` evaluations; the label's
    step is that evaluation's step. A warm start at EM 0 has nothing to collapse from (ValueError).
    """
    if not finite(warm_em) or warm_em <= 0:
        raise ValueError(f"the warm start's validation EM must be > 0 to define a collapse, got {warm_em!r}")
    bound = ratio * warm_em
    start = None
    for i in range(len(val_curve) - 1, -1, -1):
        em = val_curve[i][1]
        if not (finite(em) and em <= bound):
            break
        start = i
    if start is None or len(val_curve) - start < persist:
        return None
    return int(val_curve[start][0])


def refuse_collapse_signals(alarm: Alarm) -> Alarm:
    """``alarm`` when it reads no collapse signal (:data:`COLLAPSE_SIGNALS`); ValueError otherwise: an alarm defined
    on the series a collapse label is computed from would contain the thing it predicts."""
    leaked = sorted(alarm.reads & COLLAPSE_SIGNALS)
    if leaked:
        raise ValueError(f"alarm {alarm.name!r} reads {leaked}, which a collapse label is computed from: an alarm "
                         "defined on the collapse signal cannot warn of it")
    return alarm


def alarm_outcome(first_alarm: int | None, collapse: int | None) -> str:
    """``warned`` (collapse, alarm strictly before it), ``late`` (alarm at or after it), ``missed``, ``false_alarm``
    (no collapse, an alarm), ``quiet``."""
    if collapse is None:
        return "quiet" if first_alarm is None else "false_alarm"
    if first_alarm is None:
        return "missed"
    return "warned" if first_alarm < collapse else "late"


def _score(outcomes: Sequence[tuple[str, int | None]]) -> dict[str, Any]:
    """Sensitivity, specificity (Wilson) and lead times of ``(outcome, lead)`` pairs."""
    count = {o: sum(1 for x, _ in outcomes if x == o) for o in ("warned", "late", "missed", "false_alarm", "quiet")}
    collapsed = count["warned"] + count["late"] + count["missed"]
    calm = count["false_alarm"] + count["quiet"]
    leads = sorted(lead for o, lead in outcomes if o == "warned")
    return {"runs": len(outcomes), "collapsed": collapsed, "not_collapsed": calm, **count,
            "sensitivity": wilson(count["warned"], collapsed), "specificity": wilson(count["quiet"], calm),
            "lead_steps": leads, "lead_median": median(leads) if leads else None}


def score_alarm(runs: Sequence[Mapping[str, Any]], alarm: Alarm) -> dict[str, Any]:
    """``alarm`` against the held-out label over ``runs`` (each ``{"lr", "records", "collapse_step"}``: its per-step
    records and its label's step or None): per run its first alarm step, outcome and lead; the score over every run
    (``overall``) and within each learning rate (``by_lr``, keyed by the rate's ``%g``)."""
    per_run = []
    for run in runs:
        first = alarm.first_step(run["records"])
        outcome = alarm_outcome(first, run["collapse_step"])
        per_run.append({"lr": run["lr"], "first_alarm": first, "outcome": outcome,
                        "lead": run["collapse_step"] - first if outcome == "warned" else None})
    by_lr = {}
    for lr in sorted({r["lr"] for r in per_run}):
        by_lr[f"{lr:g}"] = _score([(r["outcome"], r["lead"]) for r in per_run if r["lr"] == lr])
    return {"alarm": alarm.name, "reads": sorted(alarm.reads), "description": alarm.description,
            "overall": _score([(r["outcome"], r["lead"]) for r in per_run]), "by_lr": by_lr, "per_run": per_run}
