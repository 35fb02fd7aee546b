"""Registered endpoint hypotheses on hand-made runs: a run's gain over its warm start after a named step, Welch's
difference Holm-adjusted within a family of learning-rate treatments, the 90 % interval against an equivalence margin,
the step-KL match over the stretch up to the endpoint, each of the verdicts, the report's line; and a draft study
(tests/registrations/endpoint_study.json and its config) that needs nothing but its registration and config.

The Welch numbers below are worked out by hand: with gains ``a = [.10, .12, .14, .16]`` and ``b = [0, .02, .04,
.06]`` each sample variance is ``(.03^2 + .01^2 + .01^2 + .03^2) / 3 = .002 / 3``, so
``se = sqrt(2 (.002 / 3) / 4) = sqrt(1 / 3000) = 0.0182574`` and (equal variances and sizes) ``df = 2 (4 - 1) = 6``;
Student's quantiles at 6 df: ``t_.95 = 1.943180``, ``t_.975 = 2.446912``, ``t_.9875 = 2.968687``.
"""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from searchr1_lab.cli import main as lab_main
from searchr1_lab.compact import compact_name, write_gz_json
from searchr1_lab.registered.registration import cells, load_registration
from searchr1_lab.stats.smallsample import mean_interval
from searchr1_lab.stepsize.account import endpoint_text
from searchr1_lab.stepsize.analysis import hypotheses
from searchr1_lab.stepsize.endpoint_comparison import endpoint_gain, endpoint_verdict, holm_level

from conftest import REPO_ROOT

LR, STEPS, START = 0.001, 8, 0.4
SE, T95_6, T975_6, T9875_6 = math.sqrt(1 / 3000), 1.943180, 2.446912, 2.968687
HIGH, LOW, HIGHER = [.10, .12, .14, .16], [0.0, .02, .04, .06], [.05, .07, .09, .11]


def run(arm, seed, end, mid=0.0, kl=0.2, kl_late=None, steps=STEPS, mid_step=STEPS // 2, every=2, lr=LR):
    """A run of ``steps`` steps that never collapses (held-out EM 0.4 every ``every`` steps): whole-validation EM
    ``START`` at step 0, ``START + mid`` after ``mid_step``, ``START + end`` after the last; per-step KL ``kl``, or
    ``kl_late`` after ``mid_step`` when given."""
    records = [{"step": 0, "eval/val_sub_em": START, "eval/val_em": START}]
    for s in range(1, steps + 1):
        r = {"step": s, "lld/step_kl": kl if kl_late is None or s <= mid_step else kl_late, "reward/em_mean": 0.5}
        if s % every == 0:
            r["eval/val_sub_em"] = START
        if s in (mid_step, steps):
            r["eval/val_em"] = START + (end if s == steps else mid)
        records.append(r)
    return {"method": arm, "lr": lr, "seed": seed, "records": records, "test": {"em": 0.3}}


def cell(arm, gains, **kw):
    return [run(arm, seed, g, **kw) for seed, g in enumerate(gains)]


def hyp(endpoint, treatment, control, family=None):
    return {"endpoint": endpoint, "treatment": treatment, "control": control, "lr": "constant",
            **({"family": family} if family else {}), "equivalence_margin": 0.05, "match_tolerance": 0.25}


def registration(**hyps):
    return {"label": {"ratio": 0.3, "persist": 2, "horizon": STEPS}, "alpha": 0.05, "multiplicity": "holm",
            "lrs": {"constant": LR}, "step_size": {"first": 1, "last": STEPS},
            "arms": {a: {"lrs": [LR]} for a in ("grpo", "llds_action", "grpo_trust_region", "llds_trust_region")},
            "endpoints": {"em_mid": {"key": "eval/val_em", "step": STEPS // 2},
                          "em_end": {"key": "eval/val_em", "step": STEPS}},
            "hypotheses": hyps, "sensitivity": {"ratio": [0.3], "persist": [2]}}


BOTH = registration(E_constant=hyp("em_end", "llds_action", "grpo", "em_end"),
                    E_trust_region=hyp("em_end", "llds_trust_region", "grpo_trust_region", "em_end"))
CONSTANT = registration(E=hyp("em_end", "llds_action", "grpo"))


def p_two_sided(t, df):
    return 2 * stats.t.sf(t, df)


def test_students_interval_of_a_mean_by_hand():
    # [.10, .12, .14, .16]: mean .13, s^2 = .002 / 3, se = sqrt(.002 / 12) = 0.0129099; t_.975 at 3 df = 3.182446
    m = mean_interval(HIGH)
    assert m["estimate"] == pytest.approx(0.13) and m["n"] == 4
    assert (m["low"], m["high"]) == pytest.approx((0.13 - 3.182446 * 0.0129099, 0.13 + 3.182446 * 0.0129099),
                                                  abs=1e-6)
    assert mean_interval([0.2, 0.2])["low"] == 0.2 and mean_interval([0.2])["low"] is None


def test_the_gain_is_read_at_the_named_step_against_step_0():
    records = run("grpo", 0, end=0.15, mid=-0.1)["records"]
    assert endpoint_gain(records, "eval/val_em", 8) == pytest.approx(0.15)
    assert endpoint_gain(records, "eval/val_em", 4) == pytest.approx(-0.1)
    assert endpoint_gain(records, "eval/val_em", 6) is None  # not scored there
    # a run that has not reached the end counts in no cell
    unfinished = run("grpo", 4, end=0.9)
    unfinished["records"] = unfinished["records"][:6]
    res = hypotheses(cell("llds_action", HIGH) + cell("grpo", LOW) + [unfinished], CONSTANT)["E"]
    assert (res["a"]["n"], res["b"]["n"]) == (4, 4) and res["welch"]["estimate"] == pytest.approx(0.1)


def test_holm_level_by_hand():
    assert holm_level(0.01, 0.02, 2, 0.05) == pytest.approx(0.975)  # the smaller of two: Bonferroni's level
    assert holm_level(0.04, 0.04, 1, 0.05) == pytest.approx(0.95)  # the last one, its own p sets p_holm
    assert holm_level(0.03, 0.06, 1, 0.05) == pytest.approx(0.975)  # the first one was not rejected: wider
    assert holm_level(0.0, 0.0, 2, 0.05) == pytest.approx(0.975)


def test_endpoint_verdict_rule():
    assert endpoint_verdict(True, True, False) == "adds something"
    assert endpoint_verdict(True, True, True) == "adds something"  # a small sure gain inside the margin
    assert endpoint_verdict(False, True, True) == "no added value"
    assert endpoint_verdict(True, False, True) == "no added value"  # not shown to add; shown inside the margin
    assert endpoint_verdict(True, False, False) == "inconclusive"
    assert endpoint_verdict(False, False, False) == "inconclusive"


def test_adds_something_holm_adjusted_over_the_learning_rate_treatments():
    runs = (cell("llds_action", HIGH) + cell("grpo", LOW) + cell("llds_trust_region", HIGHER)
            + cell("grpo_trust_region", LOW))
    out = hypotheses(runs, BOTH)
    const, tr = out["E_constant"], out["E_trust_region"]
    # constant: difference .10, t = .1 / se = 5.4772; trust region: .05, t = 2.7386; both 6 df
    p_const, p_tr = p_two_sided(0.1 / SE, 6), p_two_sided(0.05 / SE, 6)
    assert p_const == pytest.approx(0.001547, abs=1e-6) and p_tr == pytest.approx(0.03380, abs=1e-5)
    assert const["welch"]["p_two_sided"] == pytest.approx(p_const, rel=1e-6)
    # Holm over 2: the smaller p doubled (tested at .025, interval at 97.5 %); the larger as it is (at .05, 95 %)
    assert const["p_holm"] == pytest.approx(2 * p_const, rel=1e-6) and tr["p_holm"] == pytest.approx(p_tr, rel=1e-6)
    assert (const["holm_level"], tr["holm_level"]) == pytest.approx((0.975, 0.95))
    assert (const["welch_holm"]["low"], const["welch_holm"]["high"]) == pytest.approx(
        (0.1 - T9875_6 * SE, 0.1 + T9875_6 * SE), abs=1e-6)  # [+0.0458, +0.1542]
    assert (tr["welch_holm"]["low"], tr["welch_holm"]["high"]) == pytest.approx(
        (0.05 - T975_6 * SE, 0.05 + T975_6 * SE), abs=1e-6)  # [+0.0053, +0.0947]
    # the 90 % intervals (.10 -+ 0.0355: not inside +-.05) and the step KL (0.2 everywhere: ratio 1)
    assert (const["welch90"]["low"], const["welch90"]["high"]) == pytest.approx(
        (0.1 - T95_6 * SE, 0.1 + T95_6 * SE), abs=1e-6)
    assert not const["equivalent"] and const["step_size"]["ratio"] == pytest.approx(1.0)
    assert (const["verdict"], tr["verdict"]) == ("adds something", "adds something")
    assert const["reason"] is None


def test_holm_keeps_a_raw_interval_above_0_from_counting():
    # both treatments gain .05 (p .0338 each, raw 95 % intervals [+0.0053, +0.0947] above 0); Holm: the first
    # 2 x .0338 = .0676 is not below .05, so the step-down stops there: neither is above 0
    runs = (cell("llds_action", HIGHER) + cell("grpo", LOW) + cell("llds_trust_region", HIGHER)
            + cell("grpo_trust_region", LOW))
    out = hypotheses(runs, BOTH)
    p = p_two_sided(0.05 / SE, 6)
    for res in out.values():
        assert res["welch"]["low"] == pytest.approx(0.05 - T975_6 * SE, abs=1e-6) and res["welch"]["low"] > 0
        assert res["p_holm"] == pytest.approx(2 * p, rel=1e-6) and res["holm_level"] == pytest.approx(0.975)
        assert res["welch_holm"]["low"] == pytest.approx(0.05 - T9875_6 * SE, abs=1e-6)  # -0.0042: 0 inside
        assert not res["above_zero"] and not res["equivalent"]  # 90 %: [+0.0145, +0.0855]
        assert res["verdict"] == "inconclusive"
        assert res["reason"] == "neither above 0 after Holm's adjustment nor inside the margin"


def test_no_added_value_when_the_90_percent_interval_lies_inside_the_margin():
    same = [.10, .11, .12, .13]  # s^2 = .0005 / 3, se = sqrt(2 (.0005 / 3) / 4) = 0.0091287, df 6
    res = hypotheses(cell("llds_action", same) + cell("grpo", same), CONSTANT)["E"]
    half = T95_6 * math.sqrt(2 * (0.0005 / 3) / 4)  # 0.01774
    assert (res["welch90"]["low"], res["welch90"]["high"]) == pytest.approx((-half, half), abs=1e-6)
    assert res["equivalent"] and not res["above_zero"] and res["family_size"] == 1
    assert res["verdict"] == "no added value" and res["reason"] is None


def test_inconclusive_when_neither_above_0_nor_inside_the_margin():
    # a = [0, .2, 0, .2] against a constant .1: difference 0; s_a^2 = 4 (.1^2) / 3, se = sqrt(s_a^2 / 4) = 0.057735,
    # Welch-Satterthwaite df = n_a - 1 = 3 (b has no variance); 90 %: -+ 2.353363 x 0.057735 = -+0.1359
    res = hypotheses(cell("llds_action", [0.0, 0.2, 0.0, 0.2]) + cell("grpo", [0.1] * 4), CONSTANT)["E"]
    assert res["welch90"]["df"] == pytest.approx(3.0)
    assert res["welch90"]["high"] == pytest.approx(2.353363 * 0.057735, abs=1e-5)
    assert res["verdict"] == "inconclusive" and not res["above_zero"] and not res["equivalent"]


def test_a_control_that_gained_more_is_named_in_the_reason():
    # the first case with the arms swapped: difference -.10, Holm-adjusted p 0.0015 (one member): below 0
    res = hypotheses(cell("llds_action", LOW) + cell("grpo", HIGH), CONSTANT)["E"]
    assert res["welch"]["estimate"] == pytest.approx(-0.1) and res["p_holm"] == pytest.approx(
        p_two_sided(0.1 / SE, 6), rel=1e-6)
    assert res["verdict"] == "inconclusive" and res["reason"].startswith("below 0 after Holm's adjustment")


def test_inconclusive_when_the_step_kl_is_not_matched_over_the_stretch_up_to_the_endpoint():
    # the constant-rate gains of the first case (above 0) with GRPO taking 1.3x LLDS's step KL: not within 1.25x
    runs = cell("llds_action", HIGH, kl=0.2) + cell("grpo", LOW, kl=0.26)
    res = hypotheses(runs, CONSTANT)["E"]
    assert res["above_zero"] and res["step_size"]["ratio"] == pytest.approx(1.3) and not res["step_size"]["matched"]
    assert res["verdict"] == "inconclusive" and res["reason"] == "step KL not matched"
    assert hypotheses(cell("llds_action", HIGH) + cell("grpo", LOW, kl=0.24), CONSTANT)["E"]["verdict"] == (
        "adds something")  # 1.2x is within 1.25x
    # GRPO matches LLDS through step 4 (0.2) and doubles after: the midpoint (step 4) reads steps 1-4, ratio 1; the
    # end reads steps 1-8, (4 x 0.2 + 4 x 0.4) / 8 / 0.2 = 1.5
    reg = registration(mid=hyp("em_mid", "llds_action", "grpo"), end=hyp("em_end", "llds_action", "grpo"))
    runs = ([run("llds_action", s, g, mid=g) for s, g in enumerate(HIGH)]
            + [run("grpo", s, g, mid=g, kl_late=0.4) for s, g in enumerate(LOW)])
    out = hypotheses(runs, reg)
    assert (out["mid"]["step_size"]["last"], out["mid"]["step_size"]["ratio"]) == (4, pytest.approx(1.0))
    assert out["end"]["step_size"]["ratio"] == pytest.approx(1.5)
    assert (out["mid"]["verdict"], out["end"]["verdict"]) == ("adds something", "inconclusive")


def test_the_report_line_of_an_endpoint_hypothesis():
    runs = (cell("llds_action", HIGH) + cell("grpo", LOW) + cell("llds_trust_region", HIGHER)
            + cell("grpo_trust_region", LOW))
    res = hypotheses(runs, BOTH)["E_constant"]
    # numbers of the first case: Holm 97.5 % [.0458, .1542], 90 % [.0645, .1355], p .00155 and 2 x .00155; each
    # arm against its warm start: .13 and .03 -+ 3.182446 x 0.0129099 = -+0.0411
    assert endpoint_text(res, BOTH["hypotheses"]["E_constant"]) == (
        "llds_action minus grpo (lr 0.001), gain of `eval/val_em` over the warm start (step 0) after step 8: +0.100, "
        "Holm-adjusted 95 % [+0.046, +0.154] (Welch at 97.5 %; p 0.0015, Holm-adjusted 0.0031 over the 2 of family "
        "em_end); 90 % [+0.065, +0.135] (not inside +-0.05); step KL grpo / llds_action 1.00 over the 8 steps of 1-8 "
        "with runs alive (matched within 1.25x): **adds something**. Against the warm start: llds_action +0.130 "
        "[+0.089, +0.171] (4 runs), grpo +0.030 [-0.011, +0.071] (4 runs)")


# ---------------------------------------------------------------- a draft study: a registration and a config

DRAFT = REPO_ROOT / "tests" / "registrations" / "endpoint_study.json"


def test_the_draft_registration_is_valid_and_its_config_scores_the_midpoint():
    from searchr1_lab.methods import read_lab_config
    from searchr1_lld.config import config_from_dict

    reg = load_registration(DRAFT)  # every arm's overrides on the draft config, validated
    assert len(cells(reg)) == 4 * 8
    values, _, _ = read_lab_config(reg["registration"]["config"], [])
    cfg = config_from_dict(values)
    assert cfg.trainer.full_eval_steps == [reg["endpoints"]["em_mid"]["step"]]
    assert cfg.trainer.total_steps == reg["endpoints"]["em_end"]["step"] == reg["label"]["horizon"]
    from searchr1_lab.stepsize.readings import warmup_steps

    assert reg["step_size"]["first"] == warmup_steps(cfg.trainer.warmup_ratio, cfg.trainer.total_steps) + 1


def write_draft_grid(tmp_path):
    """The draft's 32 runs (150 steps, held-out EM every 10, never collapsing), one reading per hypothesis:
    E1 (end, constant) LLDS .10 above GRPO, step KL matched over 16-150; E2 (end, trust region) equal gains;
    E3 (midpoint, constant) LLDS .10 above, GRPO at 1.5x LLDS's step KL over 16-75 (0.3 against 0.2; 0.12 after, so
    over 16-150 the means match: (60 x 0.3 + 75 x 0.12) / 135 = 0.2); E4 (midpoint, trust region) spread wide."""
    reg = json.loads(DRAFT.read_text())
    reg["registration"].update(runs_dir=str(tmp_path / "runs"), report_dir=str(tmp_path / "report"))
    spread = [0.01 * k for k in range(8)]
    plan = {"llds_action": ([0.1 + g for g in spread], [0.1 + g for g in spread], {}),
            "grpo": (spread, spread, {"kl": 0.3, "kl_late": 0.12}),
            "llds_trust_region": (spread, [0.0, 0.2] * 4, {}),
            "grpo_trust_region": (spread, [0.1] * 8, {})}
    for arm, (ends, mids, kl) in plan.items():
        for seed, (end, mid) in enumerate(zip(ends, mids)):
            r = run(arm, seed, end, mid=mid, steps=150, mid_step=75, every=10, **{"kl": 0.2, **kl})
            write_gz_json(tmp_path / "runs" / compact_name(arm, LR, seed), r)
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(reg))
    return path, reg


def test_the_draft_study_is_reported_from_its_registration_alone(tmp_path):
    path, reg = write_draft_grid(tmp_path)
    readme = tmp_path / "README.md"
    from searchr1_lab.stepsize.report import readme_markers

    begin, end = readme_markers(reg)
    readme.write_text(f"{begin}\nold\n{end}\n")
    assert lab_main(["stepsize-report", "--registration", str(path), "--readme", str(readme)]) == 0
    s = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert (s["runs_finished"], s["complete"]) == (32, True)
    verdicts = {n: (h["verdict"], h.get("reason")) for n, h in s["hypotheses"].items() if "endpoint" in h}
    assert verdicts == {"E1": ("adds something", None), "E2": ("no added value", None),
                        "E3": ("inconclusive", "step KL not matched"),
                        "E4": ("inconclusive", "neither above 0 after Holm's adjustment nor inside the margin")}
    e3 = s["hypotheses"]["E3"]["step_size"]
    assert (e3["first"], e3["last"], e3["steps"], e3["ratio"]) == (16, 75, 60, pytest.approx(1.5))
    assert s["hypotheses"]["E1"]["step_size"]["ratio"] == pytest.approx(1.0)
    text = (tmp_path / "report" / "README.md").read_text()
    assert text.count("gain of `eval/val_em` over the warm start (step 0) after step") == 4
    assert ("Registered verdicts: E1 (llds_action against grpo, `eval/val_em` after step 150): **adds something**; "
            "E2 (llds_trust_region against grpo_trust_region, `eval/val_em` after step 150): **no added value**;") in text
    block = readme.read_text()
    assert "- Endpoints against the warm start: E1 llds_action minus grpo" in block
    assert "- Survival (one-sided log-rank p" in block  # the secondary survival hypothesis, S1
    # the registered labels (0.3x and 0.5x) re-read every verdict: no run collapses, nothing changes
    assert all(row["verdicts"]["E1"] == "adds something" for row in s["sensitivity"])
