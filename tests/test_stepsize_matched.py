"""The matched-control test on hand-made runs: each of its three verdicts, the step-size match after the warm-up,
utility beside survival, equivalence within the margin, and Holm's adjustment over the confirmatory family deciding
what is supported."""

from __future__ import annotations

import pytest

from searchr1_lab.stepsize.analysis import (adjust_for_multiplicity, family, hypotheses, matched_verdict,
                                            step_size_match, utility_comparison)
from searchr1_lab.stats.smallsample import holm

from test_stepsize_analysis import make_run

LR, HORIZON = 0.002, 20


def held_out(collapse_at=None, peak=0.6):
    """val_sub_em every 2 steps: 0.4 at step 0, ``peak`` at steps 2-4, 0.4 until ``collapse_at``, 0 from it on."""
    out = {}
    for s in range(0, HORIZON + 1, 2):
        out[s] = 0.0 if collapse_at is not None and s >= collapse_at else (peak if s in (2, 4) else 0.4)
    return out


def cell(arm, collapses, step_kl=0.2, peak=0.6, warmup_kl=0.05):
    """One run per entry of ``collapses`` (seeds 0, 1, ...): its collapse step or None; its per-step KL
    ``warmup_kl`` over steps 1-4 (the warm-up) and ``step_kl`` (x (1 + seed / 100)) after."""
    return [make_run(arm, LR, seed, held_out(c, peak),
                     step_kl=[warmup_kl] * 4 + [step_kl * (1 + seed / 100)] * (HORIZON - 4))
            for seed, c in enumerate(collapses)]


REGISTRATION = {
    "label": {"ratio": 0.3, "persist": 2, "horizon": HORIZON},
    "alpha": 0.05,
    "multiplicity": "holm",
    "lrs": {"collapse": LR},
    "step_size": {"first": 5, "last": HORIZON},
    "arms": {"grpo": {"lrs": [LR]}, "llds_action": {"lrs": [LR]}, "grpo_trust_region": {"lrs": [LR]}},
    "hypotheses": {
        "H1": {"treatment": "llds_action", "control": "grpo", "lr": "collapse"},
        "H2": {"treatment": "llds_action", "matched_control": "grpo_trust_region", "lr": "collapse",
               "equivalence_margin": 4, "utility_margin": 0.03, "match_tolerance": 0.2},
        "H5": {"treatment": "grpo_trust_region", "control": "grpo", "lr": "collapse"}},
    "sensitivity": {"ratio": [0.3], "persist": [2]},
}
NEVER, EARLY = [None] * 6, [4, 4, 6, 6, 8, 8]


def test_matched_verdict_rule():
    assert matched_verdict(True, True, True, False) == "mechanism"
    assert matched_verdict(True, False, True, True) == "smaller steps suffice"
    assert matched_verdict(True, True, False, False) == "inconclusive"  # outlived, but learned less
    assert matched_verdict(False, True, True, False) == "inconclusive"  # the control did not match
    assert matched_verdict(False, False, True, True) == "inconclusive"
    assert matched_verdict(True, False, True, False) == "inconclusive"  # neither different nor equivalent


def test_mechanism_when_the_matched_control_collapses_and_learns_no_more():
    runs = cell("grpo", EARLY) + cell("llds_action", NEVER) + cell("grpo_trust_region", [6, 8, 8, 10, 10, 12])
    h2 = hypotheses(runs, REGISTRATION)["H2"]
    # alive control runs are the later seeds at later steps (x 1 + seed / 100): the ratio is 1 within 2 %
    assert h2["step_size"]["matched"] and h2["step_size"]["ratio"] == pytest.approx(1.0, rel=0.02)
    assert h2["supported"] and h2["utility_ok"] and not h2["equivalent"]
    assert h2["verdict"] == "mechanism"


def test_smaller_steps_suffice_needs_equivalent_survival():
    same = [8, 10, 10, 12, 12, 14]
    runs = cell("grpo", EARLY) + cell("llds_action", same) + cell("grpo_trust_region", same)
    h2 = hypotheses(runs, REGISTRATION)["H2"]
    welch90 = h2["comparison"]["welch90"]
    # equal restricted times: estimate 0; mean 11, squared deviations 9+1+1+1+1+9 = 22, var = 22 / 5, se^2 =
    # 2 x var / 6, df = 10 (equal variances and sizes: 2 (n - 1)); the 90 % half-width t_{0.95, 10} x se
    assert welch90["estimate"] == 0.0 and welch90["df"] == pytest.approx(10.0)
    assert welch90["high"] == pytest.approx(1.812461 * (2 * (22 / 5) / 6) ** 0.5, rel=1e-5)
    assert h2["equivalent"] and not h2["supported"]
    assert h2["verdict"] == "smaller steps suffice"
    # the same survival with a margin of 1 step is neither different nor shown equivalent
    narrow = {**REGISTRATION, "hypotheses": {**REGISTRATION["hypotheses"],
                                             "H2": {**REGISTRATION["hypotheses"]["H2"], "equivalence_margin": 1}}}
    assert hypotheses(runs, narrow)["H2"]["verdict"] == "inconclusive"


def test_an_unmatched_control_or_a_worse_utility_is_inconclusive():
    # the control took twice LLDS's step KL after the warm-up (matched during it): no verdict of mechanism
    runs = cell("grpo", EARLY) + cell("llds_action", NEVER) + cell("grpo_trust_region", EARLY, step_kl=0.4)
    h2 = hypotheses(runs, REGISTRATION)["H2"]
    assert h2["supported"] and h2["step_size"]["ratio"] == pytest.approx(2.0, rel=0.03)
    assert not h2["step_size"]["matched"] and h2["verdict"] == "inconclusive"
    # matched and outlived, but LLDS gained 0.1 less at its peak than the control
    runs = (cell("grpo", EARLY) + cell("llds_action", NEVER, peak=0.5)
            + cell("grpo_trust_region", EARLY, peak=0.6))
    h2 = hypotheses(runs, REGISTRATION)["H2"]
    assert h2["supported"] and not h2["utility_ok"]
    assert h2["utility"]["peak_gain"]["estimate"] == pytest.approx(-0.1)
    assert h2["verdict"] == "inconclusive"


def test_step_size_match_reads_the_window_after_the_warm_up():
    label = REGISTRATION["label"]
    a = cell("llds_action", NEVER[:2], step_kl=0.2, warmup_kl=0.05)
    b = cell("grpo_trust_region", NEVER[:2], step_kl=0.23, warmup_kl=0.5)
    m = step_size_match(a, b, label, 5, HORIZON, tolerance=0.2)
    assert m["steps"] == HORIZON - 4 and m["mean_a"] == pytest.approx(0.2 * 1.005) and m["ratio"] == pytest.approx(1.15)
    assert m["matched"]
    assert not step_size_match(a, b, label, 1, HORIZON, tolerance=0.2)["matched"]  # the warm-up's 10x: 1.8x
    assert not step_size_match(a, b, label, 5, HORIZON, tolerance=0.1)["matched"]


def test_step_size_match_counts_only_the_steps_before_a_collapse():
    # the control collapses at step 10 (evaluations 10 and 12 at 0) and then takes tiny steps in its dead state;
    # it matched LLDS exactly while alive. Over steps 5-10 (both alive) the ratio is 1; with the dead steps it is not
    label = REGISTRATION["label"]
    a = cell("llds_action", [None], step_kl=0.2)
    dead = make_run("grpo_trust_region", LR, 0, held_out(10), step_kl=[0.05] * 4 + [0.2] * 6 + [0.001] * 10)
    m = step_size_match(a, [dead], label, 5, HORIZON, tolerance=0.2)
    assert (m["steps"], m["last_step"]) == (6, 10) and m["ratio"] == pytest.approx(1.0) and m["matched"]
    assert m["per_step_b"] == [0.2] * 6


def test_utility_of_a_run_that_never_learns_is_none_whatever_it_survives():
    never_learns = cell("grpo_kl", NEVER, peak=0.4)  # flat at its step-0 value, never collapses
    learns = cell("llds_action", EARLY, peak=0.6)
    u = utility_comparison(learns, never_learns, HORIZON)
    assert u["b"]["peak_gain"] == [0.0] * 6 and u["b"]["mean_gain_area"] == 0.0
    assert u["a"]["mean_peak_gain"] == pytest.approx(0.2)
    assert u["peak_gain"]["estimate"] == pytest.approx(0.2)


def test_holm_over_the_family_decides_what_is_supported():
    # LLDS never collapses; the control collapses in 3 of 6 runs, GRPO in 4 of 6: raw one-sided p H1 0.009, H2
    # 0.028, H5 0.25. Holm: H1 x 3 = 0.027, H2 x 2 = 0.055, H5 x 1: H2 is below 0.05 raw but not after adjustment
    runs = (cell("grpo", [10, 12, 14, 16, None, None]) + cell("llds_action", [None] * 6)
            + cell("grpo_trust_region", [12, 14, 16, None, None, None]))
    out = hypotheses(runs, REGISTRATION)
    members = family(out)
    assert list(members) == ["H1", "H2", "H5"]
    raw = {n: c["comparison"]["logrank"]["p_one_sided"] for n, c in members.items()}
    assert {n: c["comparison"]["p_holm"] for n, c in members.items()} == pytest.approx(holm(raw))
    assert raw["H2"] < 0.05 < out["H2"]["comparison"]["p_holm"], raw
    assert out["H1"]["supported"] and not out["H2"]["supported"] and not out["H5"]["supported"]
    # without the registration's "multiplicity", p_holm is reported beside the registered rule, which stands
    plain = {k: v for k, v in REGISTRATION.items() if k != "multiplicity"}
    unadjusted = hypotheses(runs, plain)
    assert unadjusted["H2"]["comparison"]["p_holm"] == out["H2"]["comparison"]["p_holm"]
    assert unadjusted["H2"]["supported"] is True  # raw p < 0.05 and the bootstrap interval above 0


def test_a_mechanism_family_counts_each_comparison_once():
    results = {"H1": {"treatment": "t", "control": "g", "lr": 1, "control_lr": 1, "comparison": {}},
               "H2": {"baseline": {"treatment": "t", "control": "g", "lr": 1, "control_lr": 1},
                      "controls": {"c1": {"treatment": "t", "control": "c1", "lr": 1, "control_lr": 0.5}}}}
    assert list(family(results)) == ["H1", "H2 vs c1"]
    assert adjust_for_multiplicity({}, REGISTRATION) == {}


def test_the_readings_beside_the_verdict_by_hand():
    from searchr1_lab.stepsize.readings import cell_step_sizes, unregistered_comparisons, warmup_steps

    # 10 % of 75 steps of 8 updates = 60 updates = 7.5 steps: steps 1-8 hold warm-up updates; 28.5 % of 1,005: 287
    assert warmup_steps(0.1, 75) == 8 and warmup_steps(0.285, 1005) == 287 and warmup_steps(0.0, 75) == 0
    label = REGISTRATION["label"]
    # step KL 0.05 over steps 1-4, 0.2 (x 1 + seed / 100) after; seed 0 collapses at 10, seed 1 never
    runs = cell("llds_action", [10, None])
    sizes = cell_step_sizes(runs, label, (5, HORIZON), after=4, fixed=4)
    assert sizes["registered"] == pytest.approx((0.2 + 0.202) / 2)
    assert sizes["to_collapse"] == pytest.approx((0.2 + 0.202) / 2)  # steps 5-10 and 5-20: constant either way
    assert sizes["fixed"] == pytest.approx((0.2 + 0.202) / 2)
    early = cell_step_sizes(cell("grpo", [4, 4]), label, (1, 4), after=4, fixed=4)
    assert early["to_collapse"] is None and early["registered"] == pytest.approx(0.05)  # collapsed in the warm-up
    # an arm no hypothesis names, against the first treatment at the rate they share
    reg = {**REGISTRATION, "arms": {**REGISTRATION["arms"], "lam1": {"lrs": [LR, 0.001]}}}
    found = unregistered_comparisons(cell("llds_action", NEVER) + cell("lam1", EARLY), reg, [("lam1", "llds_action")])
    assert [(f["treatment"], f["control"], f["lr"]) for f in found] == [("lam1", "llds_action", LR)]
    assert found[0]["comparison"]["welch"]["estimate"] == pytest.approx(6 - HORIZON)  # mean of 4,4,6,6,8,8 vs 20


def test_a_control_that_outlives_the_treatment_is_named_beside_the_registered_verdict():
    from searchr1_lab.stepsize.report import matched_verdict_text

    runs = cell("grpo", EARLY) + cell("llds_action", [8, 8, 10, 10, 12, 12]) + cell("grpo_trust_region", NEVER)
    h2 = hypotheses(runs, REGISTRATION)["H2"]
    assert h2["verdict"] == "inconclusive" and h2["step_size"]["matched"]
    text = matched_verdict_text(h2)
    assert ("grpo_trust_region outlived llds_action (RMST difference -10.0 [" in text
            and "which the registered verdicts do not name (not registered)" in text), text
