"""The step-size study's analysis on hand-made runs: the collapse label, the cells' survival, the registered
hypotheses, their sensitivity to the label, and the alarms at a matched false-alarm rate, each against values worked
out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from searchr1_lab.stepsize.alarms import (LabelledRun, alarm_study, healthy_end, matched_threshold,
                                          not_estimable, score_series)
from searchr1_lab.stepsize.analysis import (cell_survival, collapse_time, compare_arms, control_lr, hypotheses,
                                            run_points, sensitivity_table, step_size, supported)

SHORT = {"step_kl": "lld/step_kl", "reward": "reward/em_mean", "probe": "probe/logp_per_token",
         "correct": "lld/correct_logp_old_per_token", "val_em": "eval/val_em"}


def make_records(val_sub=None, **series):
    """Per-step records: ``val_sub`` maps a step (0 included) to eval/val_sub_em; every other keyword (a short name of
    :data:`SHORT` or a full key) maps a step to its value, or is a list read as the values of steps 1, 2, ..."""
    by_step: dict[int, dict] = {}
    for key, values in {"eval/val_sub_em": val_sub or {}, **series}.items():
        key = SHORT.get(key, key)
        items = values.items() if isinstance(values, dict) else enumerate(values, start=1)
        for step, v in items:
            by_step.setdefault(step, {"step": step})[key] = v
    return [by_step[s] for s in sorted(by_step)]


def make_run(method, lr, seed, val_sub, test_em=0.5, **series):
    return {"method": method, "lr": lr, "seed": seed, "records": make_records(val_sub, **series),
            "test": {"em": test_em}}


# ---------------------------------------------------------------- the collapse label

# Reference v_0 = 0.5. With ratio 0.3 the bound is 0.15: the points at or below it are steps 4, 8, 10 and 14
# (2, 6 and 12 are above). With ratio 0.5 the bound is 0.25: every point from step 4 on is at or below it.
CURVE = {0: 0.5, 2: 0.4, 4: 0.14, 6: 0.2, 8: 0.1, 10: 0.12, 12: 0.24, 14: 0.05}


@pytest.mark.parametrize("ratio, persist, expected", [
    (0.3, 1, (4, 1)),     # step 4 alone is below 0.15
    (0.3, 2, (8, 1)),     # 4 is followed by 6 (0.2 > 0.15); 8 and 10 are the first two in a row
    (0.3, 3, (16, 0)),    # 8, 10, 12: 12 is above; 14 has no two points after it: censored at the horizon
    (0.5, 1, (4, 1)),
    (0.5, 3, (4, 1)),     # 4, 6, 8 are all at or below 0.25
])
def test_collapse_time_on_a_curve_reasoned_by_hand(ratio, persist, expected):
    assert collapse_time(make_records(CURVE), ratio=ratio, persist=persist, horizon=16) == expected


def test_collapse_time_censors_a_drop_too_near_the_end_and_ignores_steps_past_the_horizon():
    curve = {0: 0.5, 2: 0.4, 4: 0.4, 6: 0.1}
    assert collapse_time(make_records(curve), ratio=0.3, persist=1, horizon=8) == (6, 1)
    assert collapse_time(make_records(curve), ratio=0.3, persist=2, horizon=8) == (8, 0)  # one point only
    assert collapse_time(make_records(curve), ratio=0.3, persist=1, horizon=4) == (4, 0)  # step 6 is past it


def test_collapse_time_counts_a_value_equal_to_the_bound_and_reads_the_key_it_is_given():
    recs = make_records({0: 1.0, 2: 0.5, 4: 0.6}, val_em={0: 1.0, 4: 0.2})
    assert collapse_time(recs, ratio=0.5, persist=1, horizon=4) == (2, 1)
    assert collapse_time(recs, ratio=0.5, persist=1, horizon=4, key="eval/val_em") == (4, 1)


def test_collapse_time_needs_the_step_0_value():
    with pytest.raises(ValueError, match=r"grpo-lr0.002-seed3.*eval/val_sub_em"):
        collapse_time(make_records({2: 0.4, 4: 0.1}), ratio=0.3, persist=1, horizon=4, name="grpo-lr0.002-seed3")


def test_step_size_is_the_mean_step_kl_over_its_window():
    recs = make_records({0: 0.5}, step_kl=[0.1 * k for k in range(1, 26)])  # step s logs 0.1 s
    assert step_size(recs, first=1, last=2) == pytest.approx(0.15)
    assert step_size(recs) == pytest.approx(0.1 * 10.5)  # steps 1..20: mean of 1..20 is 10.5
    assert math.isnan(step_size(recs, first=30, last=40))


# ---------------------------------------------------------------- survival statistics by hand

# ---------------------------------------------------------------- cells and hypotheses

LR, LR_MATCHED, HORIZON = 0.002, 0.0012, 12


def curve(collapse_at=None, dip_at=None):
    """val_sub_em every 2 steps from 0.5: 0 from ``collapse_at`` on (a collapse at that step under persist 1 or 2),
    or 0 at ``dip_at`` only (a collapse under persist 1, none under persist 2)."""
    out = {}
    for s in range(0, HORIZON + 1, 2):
        low = (collapse_at is not None and s >= collapse_at) or s == dip_at
        out[s] = 0.0 if low else 0.5
    return out


def cell(method, lr, collapses):
    """One run per entry of ``collapses`` (seeds 0, 1, ...): a collapse step, or None for a run that holds."""
    return [make_run(method, lr, seed, curve(c), step_kl=[0.01 * (seed + 1)] * HORIZON)
            for seed, c in enumerate(collapses)]


EARLY, NONE = [4, 4, 6, 8], [None] * 4
REGISTRATION = {
    "label": {"ratio": 0.3, "persist": 2, "horizon": HORIZON},
    "alpha": 0.05,
    "lrs": {"collapse": LR, "below": 0.001},
    "arms": {"grpo": {"lrs": [0.001, LR]}, "llds_action": {"lrs": [0.001, LR]},
             "grpo_lr_matched": {"lrs": [LR_MATCHED]}, "grpo_kl_matched": {"lrs": [LR]}},
    "hypotheses": {"H1": {"treatment": "llds_action", "control": "grpo", "lr": "collapse"},
                   "H2": {"treatment": "llds_action", "baseline": "grpo", "lr": "collapse",
                          "controls": ["grpo_lr_matched", "grpo_kl_matched"]}},
    "sensitivity": {"ratio": [0.3, 0.5], "persist": [1, 2]},
}


def test_cell_survival_and_compare_arms():
    runs = cell("grpo", LR, EARLY) + cell("llds_action", LR, NONE) + cell("grpo", 0.001, NONE)
    grpo = cell_survival(runs, "grpo", LR, REGISTRATION["label"])
    assert (grpo["times"], grpo["events"], grpo["count"]) == ([4, 4, 6, 8], [1, 1, 1, 1], "4/4")
    assert grpo["rmst"] == pytest.approx(4 + 0.5 * 2 + 0.25 * 2)  # S = 1 to 4, 1/2 to 6, 1/4 to 8, then 0
    comp = compare_arms(runs, "llds_action", "grpo", LR, REGISTRATION["label"], n_boot=500)
    assert (comp["a"]["count"], comp["b"]["count"]) == ("0/4", "4/4")
    # t=4: 4 v 4 at risk, 2 die -> E_a = 1; t=6: 4 v 2, 1 dies -> 2/3; t=8: 4 v 1, 1 dies -> 4/5
    assert comp["logrank"]["expected_a"] == pytest.approx(1 + 2 / 3 + 4 / 5)
    assert comp["logrank"]["p_one_sided"] < 0.01
    assert comp["rmst_difference"]["estimate"] == pytest.approx(12 - 5.5)
    assert comp["rmst_difference"]["low"] > 0


def test_a_control_run_at_one_rate_is_found_without_naming_it():
    runs = cell("grpo_lr_matched", LR_MATCHED, NONE) + cell("nll_anchor", 0.003, NONE)
    assert control_lr(REGISTRATION, runs, "grpo_lr_matched", LR) == LR_MATCHED  # from the arms table
    assert control_lr(REGISTRATION, runs, "grpo", LR) == LR  # ran at the treatment's rate too
    assert control_lr(REGISTRATION, runs, "nll_anchor", LR) == 0.003  # not in the table: from its runs
    with pytest.raises(ValueError, match="name the rate"):
        control_lr({"arms": {"x": {"lrs": [0.001, 0.003]}}}, runs, "x", LR)


def h2_runs(lr_matched, kl_matched, llds=NONE):
    return (cell("grpo", LR, EARLY) + cell("llds_action", LR, llds) + cell("grpo_lr_matched", LR_MATCHED, lr_matched)
            + cell("grpo_kl_matched", LR, kl_matched))


def test_llds_beats_grpo_but_not_the_lr_matched_control_smaller_steps_suffice():
    out = hypotheses(h2_runs(lr_matched=NONE, kl_matched=EARLY), REGISTRATION)
    assert out["H1"]["supported"] is True
    h2 = out["H2"]
    assert h2["baseline"]["supported"] is True
    assert h2["controls"]["grpo_lr_matched"]["control_lr"] == LR_MATCHED
    assert h2["controls"]["grpo_lr_matched"]["comparison"]["b"]["count"] == "0/4"
    assert h2["controls"]["grpo_lr_matched"]["supported"] is False  # neither collapses: p = 1
    assert h2["controls"]["grpo_kl_matched"]["supported"] is True
    assert h2["verdict"] == "smaller steps suffice"


def test_llds_beats_every_matched_control_mechanism():
    out = hypotheses(h2_runs(lr_matched=[4, 6, 6, 8], kl_matched=EARLY), REGISTRATION)
    assert all(c["supported"] for c in out["H2"]["controls"].values())
    assert out["H2"]["verdict"] == "mechanism"


def test_llds_that_does_not_beat_grpo_is_inconclusive():
    out = hypotheses(h2_runs(lr_matched=EARLY, kl_matched=EARLY, llds=EARLY), REGISTRATION)
    assert out["H1"]["supported"] is False
    assert out["H2"]["verdict"] == "inconclusive"


def test_a_comparison_needs_both_the_logrank_and_the_rmst_interval():
    assert supported({"logrank": {"p_one_sided": 0.01}, "rmst_difference": {"low": 0.5}}, 0.05)
    assert not supported({"logrank": {"p_one_sided": 0.01}, "rmst_difference": {"low": 0.0}}, 0.05)
    assert not supported({"logrank": {"p_one_sided": 0.06}, "rmst_difference": {"low": 0.5}}, 0.05)
    assert not supported({"logrank": {"p_one_sided": 0.01}, "rmst_difference": {"low": None}}, 0.05)
    # every GRPO run collapses, but at the horizon's last step (persist 1): the log-rank test sees 4 collapses
    # against none (t=12: 4 v 4 at risk, d=4 -> E_a = 2, V = 4/7, z = 2.65), yet the RMSTs are equal (12 and 12)
    runs = cell("grpo", LR, [12] * 4) + cell("llds_action", LR, NONE)
    label = {**REGISTRATION["label"], "persist": 1}
    out = hypotheses(runs, {**REGISTRATION, "hypotheses": {"H1": REGISTRATION["hypotheses"]["H1"]}}, label)["H1"]
    assert out["comparison"]["logrank"]["p_one_sided"] < 0.01
    assert out["comparison"]["rmst_difference"]["estimate"] == 0.0
    assert out["supported"] is False


def test_sensitivity_table_verdict_flips_with_persist():
    # GRPO's runs dip to 0 at one evaluation and recover: a collapse under persist 1, none under persist 2
    runs = [make_run("grpo", LR, seed, curve(dip_at=d)) for seed, d in enumerate([4, 4, 6, 8])]
    runs += cell("llds_action", LR, NONE) + cell("grpo_lr_matched", LR_MATCHED, NONE)
    runs += cell("grpo_kl_matched", LR, EARLY)
    rows = sensitivity_table(runs, REGISTRATION)
    assert [(r["ratio"], r["persist"]) for r in rows] == [(0.3, 1), (0.3, 2), (0.5, 1), (0.5, 2)]
    assert [r["primary"] for r in rows] == [False, True, False, False]
    counts = {(r["persist"], c["arm"]): c["count"] for r in rows if r["ratio"] == 0.3 for c in r["cells"]}
    assert counts[(1, "grpo")] == "4/4" and counts[(2, "grpo")] == "0/4"
    assert counts[(2, "grpo_kl_matched")] == "4/4"
    one, two = rows[0]["verdicts"], rows[1]["verdicts"]
    assert one == {"H1": True, "H2": "smaller steps suffice"}
    assert two == {"H1": False, "H2": "inconclusive"}
    # which matched controls LLDS outlived, per label: never the lr-matched one (neither collapses), the KL-held
    # one under both labels (it collapses early at persist 1 and 2 alike)
    assert rows[0]["controls"] == rows[1]["controls"] == {"H2": {"grpo_lr_matched": False, "grpo_kl_matched": True}}


def test_run_points():
    run = make_run("llds_action", LR, 3, curve(collapse_at=6), test_em=0.42, step_kl=[0.02, 0.04] + [9.0] * 20,
                   val_em={0: 0.5, 6: 0.3, 12: 0.1})  # the last is final
    (point,) = run_points([run], REGISTRATION["label"])
    assert point == {"arm": "llds_action", "lr": LR, "seed": 3, "step_size": pytest.approx((0.06 + 9.0 * 18) / 20),
                     "collapse_time": 6, "event": 1, "final_val_em": 0.1, "test_em": 0.42}


# ---------------------------------------------------------------- alarms

def test_alarm_scores_by_hand_and_without_look_ahead():
    recs = make_records({0: 0.5}, reward=[0.5, 0.6, 0.4, 0.5, 0.7, 0.3, 0.2, 0.1],
                        step_kl=[1, 2, 3, 2, 2, 4, 6, 8],
                        correct={1: -1.0, 2: -1.2, 4: -1.0, 5: -0.8, 6: -1.5, 7: -2.0},
                        probe=[-1.0, -1.1, -1.5], **{"probe/initial_logp_per_token": {1: -1.0}})
    reward = dict(score_series(recs, "reward_drop"))
    # early median of steps 1..5 = 0.5; trailing means: t=5 (.4,.5,.7) t=6 (.5,.7,.3) t=7 (.7,.3,.2) t=8 (.3,.2,.1)
    assert math.isnan(reward[4])  # the early window is not complete before step 5
    assert [reward[t] for t in (5, 6, 7, 8)] == pytest.approx([0.5 - 1.6 / 3, 0.0, 0.1, 0.3])
    kl = dict(score_series(recs, "step_kl_rise"))
    assert [kl[t] for t in (5, 6, 8)] == pytest.approx([(7 / 3) / 2, (8 / 3) / 2, 6 / 2])  # early median 2
    correct = dict(score_series(recs, "correct_logp_drop"))
    assert correct[7] == pytest.approx(-1.0 - (-0.8 - 1.5 - 2.0) / 3)  # early median of -1, -1.2, -1, -0.8 is -1
    probe = dict(score_series(recs, "probe_drop"))
    assert [probe[t] for t in (1, 2, 3)] == pytest.approx([0.0, 0.1, 0.5])
    changed = make_records({0: 0.5}, reward=[0.5, 0.6, 0.4, 0.5, 0.7, 0.3, -5.0, 9.0])
    assert dict(score_series(changed, "reward_drop"))[6] == reward[6]  # later steps do not move step 6's score


def test_matched_threshold_is_the_smallest_with_at_most_the_rate_of_false_alarms():
    peaks = [0.1, 0.5, 0.3, 0.9, 0.2]
    for rate, expected in [(0.2, 0.5), (0.4, 0.3), (0.1, 0.9), (0.0, 0.9), (1.0, -math.inf)]:
        threshold = matched_threshold(peaks, rate)
        assert threshold == expected
        assert sum(p > threshold for p in peaks) / len(peaks) <= rate
        if math.isfinite(threshold):  # any lower threshold lets more calm runs fire than the rate allows
            assert sum(p > np.nextafter(threshold, -np.inf) for p in peaks) / len(peaks) > rate
    assert matched_threshold([-math.inf, -math.inf, 0.4], 0.34) == -math.inf  # only the run with a score can fire


STEPS = range(1, 13)


def alarm_run(name, drops, reward_falls_at=None, collapse=None, val_sub=None):
    """A run of 12 steps: probe set's likelihood -1 - drop(t) (``drops``: step -> drop from that step on), reward 0.5
    then 0.2 from ``reward_falls_at``, step KL 1 throughout, held-out EM ``val_sub`` (default 0.5 at step 0 only);
    labelled collapsed at ``collapse`` (else censored)."""
    def drop(t):
        return max((d for s, d in drops.items() if s <= t), default=0.0)
    reward = [0.2 if reward_falls_at and t >= reward_falls_at else 0.5 for t in STEPS]
    recs = make_records(val_sub or {0: 0.5}, reward=reward, step_kl=[1.0] * 12, probe=[-1.0 - drop(t) for t in STEPS],
                        **{"probe/initial_logp_per_token": {1: -1.0}})
    return LabelledRun(name, recs, collapse or HORIZON, int(collapse is not None))


# calm runs' probe-drop peaks 0.1, 0.3, 0.6: at a false-alarm rate of 1/3 the threshold is the second largest, 0.3,
# and only the 0.6 run fires. Collapsed runs (all at step 10) first exceed 0.3 at steps 4, 7 and 8 (leads 6, 3, 2;
# run c sits AT 0.3 from step 2, which does not exceed it). Their reward falls at 8, 8 and 10: against a threshold of
# 0 (the calm runs' score) the reward drop fires at 8, 8 and 10, leads 2, 2 and missed (an alarm at the collapse step
# warns of nothing). Paired gains, a miss counted as lead 0: probe 6-2, 3-2, 2-0 = 4, 1, 2.
ALARM_RUNS = [alarm_run("calm0", {6: 0.1}), alarm_run("calm1", {3: 0.3}), alarm_run("calm2", {9: 0.6}),
              alarm_run("a", {4: 0.5}, reward_falls_at=8, collapse=10),
              alarm_run("b", {7: 0.5}, reward_falls_at=8, collapse=10),
              alarm_run("c", {2: 0.3, 8: 0.5}, reward_falls_at=10, collapse=10)]


def test_alarm_study_at_a_matched_false_alarm_rate():
    out = alarm_study(ALARM_RUNS, ["probe_drop", "step_kl_rise"], false_alarm_rate=1 / 3, n_boot=500)
    assert out["estimable"] is True and (out["runs"], out["collapsed"]) == (6, 3)
    ref = out["alarms"]["reward_drop"]
    assert (ref["threshold"], ref["leads"], ref["false_alarms"]) == (0.0, [2, 2, None], "0/3")
    assert (ref["detections"], ref["median_lead"]) == ("2/3", 2)
    probe = out["alarms"]["probe_drop"]
    assert probe["threshold"] == pytest.approx(0.3)
    assert (probe["false_alarms"], probe["false_alarm_share"]) == ("1/3", pytest.approx(1 / 3))
    assert (probe["leads"], probe["detections"], probe["median_lead"]) == ([6, 3, 2], "3/3", 3)
    gain = probe["versus_reference"]
    assert gain["estimate"] == pytest.approx(7 / 3)  # mean of 4, 1, 2
    assert 1.0 <= gain["low"] and gain["high"] <= 4.0 and probe["supported"] is True
    # step KL is flat: the calm runs' peak ratio 1 is the threshold and no collapsed run exceeds it
    kl = out["alarms"]["step_kl_rise"]
    assert (kl["leads"], kl["detections"], kl["median_lead"]) == ([None, None, None], "0/3", None)
    assert kl["versus_reference"]["estimate"] == pytest.approx(-4 / 3) and kl["supported"] is False  # -2, -2, 0


def test_alarms_are_not_estimable_without_two_runs_of_each_outcome():
    few = ALARM_RUNS[:4]  # three calm runs, one collapsed
    out = alarm_study(few, ["probe_drop"], false_alarm_rate=0.2)
    assert out["estimable"] is False and "1 collapsed and 3 non-collapsed" in out["reason"]
    assert "alarms" not in out
    assert not_estimable(ALARM_RUNS) is None


def test_h3_pools_the_runs_of_its_rate_and_labels_them_itself():
    def as_run(r, method, lr, seed):
        collapsed = r.event == 1
        recs = [{**rec, "eval/val_sub_em": 0.0 if collapsed and rec["step"] >= 10 else 0.5}
                for rec in r.records if rec["step"] % 2 == 0]
        odd = [rec for rec in r.records if rec["step"] % 2]
        return {"method": method, "lr": lr, "seed": seed, "records": sorted(recs + odd, key=lambda x: x["step"])}
    runs = [as_run(r, "grpo" if i % 2 else "llds_action", LR, i) for i, r in enumerate(ALARM_RUNS)]
    runs.append(as_run(ALARM_RUNS[3], "grpo", 0.001, 9))  # another rate: left out
    spec = {"lr": "collapse", "false_alarm_rate": 1 / 3, "alarms": ["probe_drop"]}
    out = hypotheses(runs, {**REGISTRATION, "hypotheses": {"H3": spec}})["H3"]
    assert (out["lr"], out["runs"], out["collapsed"]) == (LR, 6, 3)
    assert out["alarms"]["probe_drop"]["leads"] == [6, 3, 2]
    assert out["alarms"]["probe_drop"]["supported"] is True


def test_healthy_end_is_the_first_evaluation_below_the_step_0_value():
    assert healthy_end(make_records({0: 0.5, 2: 0.5, 4: 0.6, 6: 0.4, 8: 0.6})) == 6  # equal to v_0 is still healthy
    assert healthy_end(make_records({0: 0.5, 2: 0.7})) == math.inf
    assert math.isnan(healthy_end(make_records({2: 0.1})))


# Healthy stretches end at 6, 8 and 2 (the first held-out EM below 0.5) and never for the calm run. Probe-drop peaks
# over them: 0.2 (steps 3-5), 0.4 (from 4), 0.0 (step 1 only), 0.1 (from 9): at a rate of 1/4 the threshold is the
# second largest, 0.2, and run b fires in its stretch (1/4). From the stretches' ends the probe first exceeds 0.2 at
# 6, 8 and 5: leads 8-6, 10-8, 10-5 = 2, 2, 5. The reward drop (NaN before step 5, then 0 until the reward falls)
# peaks at 0, 0, -inf (no complete early window before step 2) and 0: threshold 0, no false alarm; it fires the step
# the reward falls (7, 9, 9): leads 1, 1, 1. Paired gains 1, 1, 4.
STRETCH_RUNS = [
    alarm_run("a", {3: 0.2, 6: 0.5}, reward_falls_at=7, collapse=8, val_sub={0: 0.5, 2: 0.6, 4: 0.6, 6: 0.4, 8: 0.1}),
    alarm_run("b", {4: 0.4}, reward_falls_at=9, collapse=10, val_sub={0: 0.5, 2: 0.5, 4: 0.55, 6: 0.5, 8: 0.45}),
    alarm_run("c", {5: 0.3}, reward_falls_at=9, collapse=10, val_sub={0: 0.5, 2: 0.4, 4: 0.3, 10: 0.1}),
    alarm_run("calm", {9: 0.1}, val_sub={0: 0.5, 2: 0.6, 12: 0.5})]


def test_alarms_against_the_healthy_stretch_need_no_calm_run():
    assert alarm_study(STRETCH_RUNS, ["probe_drop"], 0.25)["estimable"] is False  # one calm run: registered rule
    out = alarm_study(STRETCH_RUNS, ["probe_drop"], 0.25, n_boot=500, rule="healthy_stretch")
    assert (out["estimable"], out["rule"], out["collapsed"]) == (True, "healthy_stretch", 3)
    probe, ref = out["alarms"]["probe_drop"], out["alarms"]["reward_drop"]
    assert (probe["threshold"], probe["false_alarms"], probe["leads"]) == (pytest.approx(0.2), "1/4", [2, 2, 5])
    assert (ref["threshold"], ref["false_alarms"], ref["leads"]) == (0.0, "0/4", [1, 1, 1])
    assert probe["versus_reference"]["estimate"] == pytest.approx(2.0) and probe["supported"] is True
    few = alarm_study(STRETCH_RUNS[:1] + STRETCH_RUNS[3:], ["probe_drop"], 0.25, rule="healthy_stretch")
    assert few["estimable"] is False and "1 collapsed runs and 2 with a healthy stretch" in few["reason"]
