"""The README's findings table and headline figure (searchr1_lab/findings.py) are what the committed reports and runs
compute; each row's reading on hand-made summaries; one colour per arm in every figure (searchr1_lab/plots.py)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT
from searchr1_lab import findings
from searchr1_lab.comparison.claims import readme_block_of


def _welch(estimate: float, low: float, high: float) -> dict:
    return {"welch": {"estimate": estimate, "low": low, "high": high}}


def test_the_readme_findings_block_is_what_the_committed_summaries_give():
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme_block_of(readme, findings.FINDINGS_BEGIN, findings.FINDINGS_END)
    summaries = findings.read_summaries()
    assert set(summaries) == set(findings.SUMMARIES), "every report the table reads is committed"
    assert block == findings.findings_block(summaries)
    assert block.count("\n| ") == len(findings.findings_rows(summaries))  # a row per claim under the header


def test_the_committed_headline_figure_draws_what_the_committed_runs_compute():
    series, label, warmup = findings.headline_inputs()
    assert findings.read_headline(REPO_ROOT / findings.HEADLINE_FIGURE) == json.loads(json.dumps(series))
    assert {s["arm"] for s in series} == set(findings.HEADLINE_ARMS) and warmup > 0
    # the collapses it marks are the study's own (its summary's points, under the same registered label)
    summary = json.loads((REPO_ROOT / findings.SUMMARIES["trustregion"][0]).read_text())
    marked = {(s["arm"], s["seed"]): s["collapse_step"] for s in series}
    assert marked == {(p["arm"], p["seed"]): (p["collapse_time"] if p["event"] else None) for p in summary["points"]}
    assert "(docs/lab/headline.png)" in (REPO_ROOT / "README.md").read_text()


def test_the_command_writes_the_block_and_the_figure(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{findings.FINDINGS_BEGIN}\nSTALE BLOCK\n{findings.FINDINGS_END}\ntail\n")
    assert findings.main(["--readme", str(readme), "--figure", str(tmp_path / "headline.png")]) == 0
    text = readme.read_text()
    assert "STALE BLOCK" not in text and text.startswith("intro\n") and text.endswith("tail\n")
    assert readme_block_of(text, findings.FINDINGS_BEGIN, findings.FINDINGS_END) == findings.findings_block(
        findings.read_summaries())
    assert findings.read_headline(tmp_path / "headline.png") == json.loads(json.dumps(findings.headline_inputs()[0]))


def test_a_run_is_marked_at_the_first_of_its_collapsed_evaluations():
    records = [{"step": 0, "eval/val_sub_em": 0.5}, {"step": 2, "eval/val_sub_em": 0.6},
               {"step": 4, "eval/val_sub_em": 0.1}, {"step": 6, "eval/val_sub_em": 0.3},
               {"step": 8, "eval/val_sub_em": 0.15}, {"step": 10, "eval/val_sub_em": 0.0}, {"step": 12, "other": 1}]
    runs = [{"method": "grpo", "lr": 0.002, "seed": 3, "records": records},
            {"method": "nll_anchor", "lr": 0.002, "seed": 3, "records": records}]  # not a headline arm
    (s,) = findings.headline_series(runs, {"ratio": 0.3, "persist": 2, "horizon": 75})
    # bound 0.15: step 4 (0.1) is followed by 0.3, so the collapse is steps 8-10, marked at 8
    assert (s["arm"], s["steps"], s["collapse_step"], s["bound"]) == ("grpo", [0, 2, 4, 6, 8, 10], 8, 0.15)
    (censored,) = findings.headline_series(runs[:1], {"ratio": 0.3, "persist": 3, "horizon": 75})
    assert censored["collapse_step"] is None


def test_the_comparison_row_says_whether_its_interval_excludes_zero():
    s = {"labels": {"llds_action": "LLDS", "grpo": "GRPO"}, "design": {"seeds": [0, 1, 2]}, "runs": [{"steps": 40}],
         "difference": {"of": "llds_action", "minus": "grpo", "all": {"mean": 0.05, "lo": -0.01, "hi": 0.11}}}
    (row,) = findings.comparison_rows(s)
    assert "(40 steps, 3 seeds a method)" in row[0]
    assert row[1:] == ["+0.050", "[-0.010, +0.110] paired bootstrap over subjects", "no difference detected"]
    s["difference"]["all"].update(lo=0.01)
    assert findings.comparison_rows(s)[0][3] == "LLDS higher"
    s["difference"] = None
    assert findings.comparison_rows(s)[0][1] == "pending"


def test_the_trust_region_rows_quote_welch_and_name_an_unregistered_direction():
    comparison = {"a": {"count": "10/10"}, "b": {"count": "1/10"}, **_welch(-39.94, -53.78, -26.02)}
    s = {"hypotheses": {
        "H5": {"supported": True, "comparison": {"a": {"count": "1/10"}, "b": {"count": "5/5"},
                                                 **_welch(58.1, 44.1, 72.1)}},
        "H2": {"verdict": "inconclusive", "comparison": comparison, "step_size": {"first": 9, "last_step": 34}}}}
    five, two = findings.trustregion_rows(s)
    assert five[1:] == ["+58.1 steps", "[+44.1, +72.1] Welch", "supported"] and "collapsed 1/10 vs 5/5" in five[0]
    assert "the 26 steps 9-34" in two[0]
    assert two[1:] == ["-39.9 steps", "[-53.8, -26.0] Welch",
                       "inconclusive: the control outlived LLDS (a direction not registered)"]
    comparison.update(_welch(-5.0, -12.0, 2.0))
    assert findings.trustregion_rows(s)[1][3] == "inconclusive"


def test_the_frontier_row_names_the_best_method_and_the_others_bound():
    em = lambda m, lo, hi: {"test_em": {"mean": m, "lo": lo, "hi": hi}}  # noqa: E731
    s = {"complete": True, "label": {"horizon": 75}, "test_baselines": {"warm_start": {"mean": 0.45, "lo": 0.4,
                                                                                        "hi": 0.5}},
         "test": {"A": em(0.1, 0.05, 0.15), "B": em(0.33, 0.28, 0.38), "C": em(0.02, 0.0, 0.06)}}
    (row,) = findings.frontier_rows(s)
    assert "(3 methods" in row[0]
    assert row[1:3] == ["B 0.330, the others <= 0.100; warm start 0.450",
                        "[0.280, 0.380] vs [0.400, 0.500] bootstrap over subjects"]
    assert row[3] == "exploratory: every fix ends below the warm start, intervals apart"
    s["test"]["B"] = em(0.33, 0.28, 0.42)  # its interval reaches the warm start's
    assert findings.frontier_rows(s)[0][3] == "exploratory: the best fix is not shown below the warm start"
    assert findings.frontier_rows({**s, "complete": False})[0][1] == "pending"


def test_the_step_size_rows_say_where_the_controls_were_matched_and_whether_every_llds_run_collapsed():
    def comparison(count: str, lr: float) -> dict:
        return {"a": {"count": count, "lr": lr}, "b": {"count": "5/5"}, **_welch(10.0, 5.0, 15.0)}

    s = {"label": {"horizon": 75}, "step_size_window": [1, 8], "warmup_steps": 8,
         "hypotheses": {"H1": {"supported": True, "comparison": comparison("5/5", 0.002)},
                        "H1c": {"supported": True, "comparison": comparison("5/5", 0.0014)},
                        "H2": {"verdict": "smaller steps suffice", "controls": {},
                               "baseline": {"comparison": {"a": {"arm": "llds_action", "lr": 0.002}}}}}}
    survival, matched = findings.stepsize_rows(s)
    assert survival[1:4] == ["+10.0 steps; +10.0 steps", "[+5.0, +15.0] Welch; [+5.0, +15.0] Welch",
                             "supported: a delay, every LLDS run collapsed too"]
    assert "in the warm-up (steps 1-8)" in matched[0]
    assert matched[3] == "registered: smaller steps suffice; what the data support: inconclusive"
    s["hypotheses"]["H1c"]["comparison"] = comparison("3/5", 0.0014)
    s["step_size_window"] = [1, 20]
    survival, matched = findings.stepsize_rows(s)
    assert survival[3] == "supported" and "over steps 1-20" in matched[0]


def test_rows_link_their_report_and_a_missing_report_gives_none():
    s = {"difference": None, "labels": {}, "design": {"seeds": []}}
    assert findings.findings_rows({"comparison": s}) == [
        ["LLDS vs GRPO at matched tuning", "pending", "-", "grid not complete", "docs/lab/README.md"]]
    assert findings.findings_rows({}) == []


# ---------------------------------------------------------------------------------------------------------------
# one colour per arm
# ---------------------------------------------------------------------------------------------------------------

def _registered_arm_sets() -> dict[str, list[str]]:
    out = {}
    for path in sorted((REPO_ROOT / "docs" / "lab").rglob("registration.json")):
        out[str(path.relative_to(REPO_ROOT))] = list(json.loads(path.read_text())["arms"])
    prereg = json.loads((REPO_ROOT / "docs" / "lab" / "preregistration.json").read_text())
    out["docs/lab/preregistration.json"] = list(prereg["grid"]["methods"])
    return out


@pytest.mark.parametrize("study", sorted(_registered_arm_sets()))
def test_every_arm_of_a_committed_study_has_a_colour_no_other_arm_of_it_shares(study: str):
    from searchr1_lab.plots import COLOURS

    arms = _registered_arm_sets()[study]
    assert not [a for a in arms if a not in COLOURS], f"{study}: add these arms to searchr1_lab/plots.py COLOURS"
    assert len({COLOURS[a] for a in arms}) == len(arms), f"{study}: two arms share a colour"


def test_every_method_of_the_lab_has_a_colour():
    from searchr1_lab.methods import ARMS
    from searchr1_lab.plots import COLOURS, UNLISTED, colour

    assert not [a for a in ARMS if a not in COLOURS]
    assert colour("grpo") == COLOURS["grpo"] and colour("no-such-arm") == UNLISTED
