"""The one alarm registry (searchr1_lld/instruments/alarms.py): every kind by hand on small records, alarms made from
specs, firing without look-ahead, and its three users reading it."""

from __future__ import annotations

import math

import pytest

from searchr1_lld.instruments import alarms
from searchr1_lld.instruments.alarms import (ALARM_KINDS, Alarm, ScoreWindow, make_alarm, register_alarm,
                                             score_series)
from searchr1_lld.instruments.phases import PhaseDetector, PhaseThresholds


def recs(key: str, vals, **other):
    return [{"step": i + 1, key: v, **{k: w[i] for k, w in other.items()}} for i, v in enumerate(vals)]


def test_every_kind_by_hand():
    window = ScoreWindow(early_first=1, early_last=3, trailing=2)
    reward = recs("reward/em_mean", [0.2, 0.4, 0.3, 0.1, 0.0])
    # early median of steps 1-3 = 0.3; trailing mean of the last 2 = 0.05
    assert alarms.reward_drop(reward, window) == pytest.approx(0.25)
    assert math.isnan(alarms.reward_drop(reward[:2], window))  # the early window is not complete before step 3
    kl = recs("lld/step_kl", [0.1, 0.2, 0.3, 0.8, 1.2])
    assert alarms.step_kl_rise(kl, window) == pytest.approx(1.0 / 0.2)
    assert math.isnan(alarms.step_kl_rise(recs("lld/step_kl", [0.0, 0.0, 0.0, 1.0]), window))  # base 0
    correct = recs("lld/correct_logp_old_per_token", [-1.0, -1.2, -1.1, -2.0, -3.0])
    assert alarms.correct_logp_drop(correct, window) == pytest.approx(-1.1 - (-2.5))
    probe = recs("probe/logp_per_token", [-1.0, -1.5, -2.5], **{"probe/initial_logp_per_token": [-0.9, None, None]})
    assert alarms.probe_drop(probe) == pytest.approx(-0.9 - (-2.5))
    assert alarms.drop_below_start(probe, "probe/logp_per_token") == pytest.approx(1.5)
    assert alarms.drop_below_start(probe, "probe/logp_per_token", start_points=2) == pytest.approx(-1.25 + 2.5)
    assert alarms.drop_below_start(probe, "probe/logp_per_token", reference_key="probe/initial_logp_per_token") == (
        pytest.approx(1.6))
    assert math.isnan(alarms.drop_below_start(probe[:1], "probe/logp_per_token"))  # no later value yet
    grad = recs("actor/grad_norm", [1.0, 3.0, 2.0, 10.0])
    assert alarms.ratio_over_early(grad, "actor/grad_norm", early_steps=3) == pytest.approx(10.0 / 2.0)
    assert math.isnan(alarms.ratio_over_early(grad[:3], "actor/grad_norm", early_steps=3))
    assert alarms.drop_from_best(recs("probe/logp_per_token", [-1.0, -0.5, -1.25]), "probe/logp_per_token") == 0.75


def test_an_alarm_fires_where_its_score_reaches_the_threshold_reading_only_the_past():
    drop = Alarm("d", "drop_from_best", 0.5, {"key": "x"})
    rows = recs("x", [-1.0, -0.8, -1.3, -0.2, math.nan, -1.0])
    assert drop.first_step(rows) == 3  # 0.5 below its best of -0.8: reaches the threshold (>=)
    assert drop.first_step(rows[:2]) is None
    assert not drop.fires(recs("x", [math.nan]))  # a NaN score never fires
    assert drop.reads == frozenset({"x"})
    # score_series: step >= 1 in step order, each from the records up to it only
    shuffled = [rows[2], rows[0], rows[1], {"step": 0, "x": 1.0}]  # step 0 is read (the best so far), not scored
    scores = score_series(shuffled, "drop_from_best", key="x")
    assert [t for t, _ in scores] == [1, 2, 3] and [s for _, s in scores] == pytest.approx([2.0, 1.8, 2.3])


def test_make_alarm_reads_a_spec_with_its_kinds_threshold_name():
    a = make_alarm({"name": "probe", "kind": "drop_below_start", "key": "probe/logp_per_token", "drop": 0.5,
                    "reference_key": "probe/initial_logp_per_token", "description": "probe fell"})
    assert (a.kind, a.threshold, a.description) == ("drop_below_start", 0.5, "probe fell")
    assert a.settings == {"key": "probe/logp_per_token", "reference_key": "probe/initial_logp_per_token"}
    assert a.reads == frozenset({"probe/logp_per_token", "probe/initial_logp_per_token"})
    r = make_alarm({"name": "gn", "kind": "ratio_over_early", "key": "actor/grad_norm", "ratio": 5, "early_steps": 2})
    assert r.threshold == 5.0 and r.settings == {"key": "actor/grad_norm", "early_steps": 2}
    with pytest.raises(ValueError, match="unknown kind 'guess'.*drop_below_start"):
        make_alarm({"name": "x", "kind": "guess", "key": "k"})
    with pytest.raises(ValueError, match="needs 'ratio'"):
        make_alarm({"name": "x", "kind": "ratio_over_early", "key": "k", "early_steps": 2})
    with pytest.raises(ValueError, match="unknown kind"):
        Alarm("x", "guess", 1.0)


def test_a_kind_registered_elsewhere_works_everywhere_with_nothing_else_edited():
    @register_alarm("test_latest_above", lambda key, **_: frozenset({key}))
    def latest(records, key):
        vals = alarms.values(records, key)
        return vals[-1] if vals else math.nan

    try:
        a = make_alarm({"name": "hot", "kind": "test_latest_above", "key": "t", "threshold": 2.0})
        assert a.first_step(recs("t", [1.0, 2.5, 1.0])) == 2
        assert score_series(recs("t", [1.0, 3.0]), "test_latest_above", key="t") == [(1, 1.0), (2, 3.0)]
        with pytest.raises(ValueError, match="registered twice"):
            register_alarm("test_latest_above", lambda **_: frozenset())(latest)
    finally:
        del ALARM_KINDS["test_latest_above"]


def test_the_phase_detectors_drawdown_alarm_is_a_registered_kind():
    det = PhaseDetector(PhaseThresholds(drawdown_alarm_logp=0.4))
    assert det.drawdown.kind in ALARM_KINDS and det.drawdown.threshold == 0.4
    rows = [{"step": i + 1, "reward/em_mean": 0.2, "probe/logp_per_token": p} for i, p in enumerate([-1.0, -0.9, -1.4])]
    report = det.raw(rows)
    assert report.evidence["probe_drop_from_peak"] == pytest.approx(alarms.drop_from_best(rows, "probe/logp_per_token"))
    assert report.drawdown_alarm is not None and "0.500 nats/token below its best" in report.drawdown_alarm
    assert det.raw(rows[:2]).drawdown_alarm is None


def test_the_studies_use_the_registry():
    from searchr1_lab.prereg.registration import make_alarm as prereg_alarm
    from searchr1_lab.stepsize.alarms import STUDY_ALARMS
    from searchr1_lab.stepsize.alarms import score_series as study_scores

    assert set(STUDY_ALARMS) <= set(ALARM_KINDS)
    rows = recs("reward/em_mean", [0.2, 0.4, 0.3, 0.1, 0.0, 0.0])
    def readable(scores):
        return [(t, None if math.isnan(v) else v) for t, v in scores]

    assert readable(study_scores(rows, "reward_drop")) == readable(score_series(rows, "reward_drop",
                                                                                window=ScoreWindow()))
    assert readable(study_scores(rows, "reward_drop"))[-1] == (6, pytest.approx(0.2 - 0.1 / 3))  # steps 1-5; last 3
    assert isinstance(prereg_alarm({"name": "p", "kind": "drop_from_best", "key": "probe/logp_per_token",
                                    "threshold": 1.0}), Alarm)
