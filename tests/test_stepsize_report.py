"""The step-size study's report on a hand-made grid: the summary, the verdict in words, the sensitivity table, the
figures and the README block, all from one command."""

from __future__ import annotations

import json

from searchr1_lab.cli import main as lab_main
from searchr1_lab.comparison.claims import readme_block_of
from searchr1_lab.compact import compact_name, write_gz_json
from searchr1_lab.stepsize import report

HORIZON = 12


def registration(tmp_path) -> dict:
    return {"registration": {"status": "registered", "config": "configs/lab/stepsize.yaml",
                             "runs_dir": str(tmp_path / "runs"), "train_dir": str(tmp_path / "train"),
                             "report_dir": str(tmp_path / "report")},
            "seeds": [0, 1, 2],
            "arms": {"grpo": {"method": "grpo", "lrs": [2e-3]}, "llds_action": {"method": "llds_action", "lrs": [2e-3]},
                     "grpo_lr_matched": {"method": "grpo", "lrs": [1.5e-3]},
                     "grpo_kl_matched": {"method": "grpo", "overrides": ["algorithm.kl_coef=0.05"], "lrs": [2e-3]}},
            "label": {"ratio": 0.3, "persist": 2, "horizon": HORIZON}, "alpha": 0.05, "lrs": {"collapse": 2e-3},
            "step_size": {"first": 1, "last": 4},
            "hypotheses": {
                "H1": {"title": "LLDS survives longer than GRPO", "treatment": "llds_action", "control": "grpo",
                       "lr": "collapse"},
                "H2": {"title": "mechanism", "treatment": "llds_action", "baseline": "grpo", "lr": "collapse",
                       "controls": ["grpo_lr_matched", "grpo_kl_matched"]}},
            "sensitivity": {"ratio": [0.3, 0.5], "persist": [1, 2]}}


def run(arm, lr, seed, collapse_at, step_kl):
    """A run evaluated every 2 steps: held-out EM 0.4 until ``collapse_at`` (None: never), then 0.0, except a single
    dip to 0.1 at step 4 in the runs that never collapse (a one-evaluation label counts it)."""
    records = [{"step": 0, "eval/val_sub_em": 0.4}]
    for step in range(1, HORIZON + 1):
        r = {"step": step, "lld/step_kl": step_kl, "reward/em_mean": 0.5}
        if step % 2 == 0:
            dip = collapse_at is None and step == 4
            r["eval/val_sub_em"] = 0.0 if collapse_at is not None and step >= collapse_at else 0.1 if dip else 0.4
        records.append(r)
    return {"method": arm, "lr": lr, "seed": seed, "records": records, "test": {"em": 0.3}}


def write_grid(tmp_path):
    # GRPO collapses at step 4, its KL-matched control at 6; LLDS and the lr-matched control never do
    plan = {("grpo", 2e-3): (4, 0.2), ("llds_action", 2e-3): (None, 0.1), ("grpo_lr_matched", 1.5e-3): (None, 0.1),
            ("grpo_kl_matched", 2e-3): (6, 0.12)}
    for (arm, lr), (at, kl) in plan.items():
        for seed in (0, 1, 2):
            write_gz_json(tmp_path / "runs" / compact_name(arm, lr, seed), run(arm, lr, seed, at, kl + 0.01 * seed))
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(registration(tmp_path)))
    return path


def test_the_report_command_writes_summary_verdict_figures_and_readme_block(tmp_path, capsys):
    path = write_grid(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nold\n{report.README_END}\nrest\n")
    assert lab_main(["stepsize-report", "--registration", str(path), "--readme", str(readme)]) == 0
    out = tmp_path / "report"
    s = json.loads((out / "summary.json").read_text())
    assert (s["runs_finished"], s["runs_planned"], s["complete"]) == (12, 12, True)
    cells = {(c["arm"], c["lr"]): c for c in s["survival"]}
    assert cells[("grpo", 0.002)]["times"] == [4, 4, 4] and cells[("llds_action", 0.002)]["count"] == "0/3"
    h2 = s["hypotheses"]["H2"]
    # LLDS beats GRPO (collapse at 4 vs never) but not the lr-matched control (neither collapses)
    assert h2["baseline"]["supported"] and not h2["controls"]["grpo_lr_matched"]["supported"]
    assert h2["verdict"] == "smaller steps suffice"
    text = (out / "README.md").read_text()
    # the registered verdict as registered, and beside it what the data support: not outliving a control is a
    # failure to reject, so on mechanism the study is inconclusive
    assert "Registered verdict: **smaller steps suffice** (the registered rule)." in text
    assert "What the data support on mechanism: **inconclusive**." in text
    # what the controls took after the warm-up (stepsize.yaml: 10 % of 75 steps, steps 1-8; seeds 0-2 add 0, .01,
    # .02): LLDS and the lr-matched control 0.11 from step 9 on; the KL-held control collapsed at step 6, before it
    assert ("from step 9 to each run's collapse the mean per-step KL was llds_action 0.110, grpo_kl_matched - "
            "(collapsed within the warm-up), grpo_lr_matched 0.110 (1.0x).") in text
    assert ("llds_action did not outlive grpo_lr_matched: RMST difference +0.0 [+0.0, +0.0] steps (Welch 95 %), a "
            "failure to reject, not an equivalence") in text
    # under a one-evaluation label the never-collapsing runs "collapse" at their dip: H1's verdict changes there
    one = next(r for r in s["sensitivity"] if r["persist"] == 1 and r["ratio"] == 0.3)
    assert one["verdicts"]["H1"] is False and "H1's differs under 2 of the 3 other labels" in text
    assert ("| 0.3 | 2 (primary) | supported | smaller steps suffice (outlived: grpo_kl_matched; not: "
            "grpo_lr_matched) |") in text
    # the matching table: the lr-matched control's mean step KL over steps 1-4 equals LLDS's
    match = {(m["arm"], m["lr"]): m for m in s["matching"]}
    assert abs(match[("grpo_lr_matched", 0.0015)]["mean"] - match[("llds_action", 0.002)]["mean"]) < 1e-12
    assert abs(match[("grpo", 0.002)]["mean"] - 0.21) < 1e-12
    for name in report.FIGURES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    block = readme_block_of(readme.read_text(), report.README_BEGIN, report.README_END)
    assert block == report.readme_block(s, registration(tmp_path))
    assert block.startswith("12 of 12 runs finished. Registered verdict: **smaller steps suffice**")
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("rest\n")
    assert "12 of 12 runs" in capsys.readouterr().out


def test_an_unfinished_grid_is_interim(tmp_path):
    path = write_grid(tmp_path)
    for p in sorted((tmp_path / "runs").glob("grpo_kl_matched*"))[:2]:
        p.unlink()
    s = report.write_report(path, tmp_path / "runs", tmp_path / "report")
    assert (s["runs_finished"], s["complete"]) == (10, False)
    reg = registration(tmp_path)
    assert report.verdict_text(s, reg).startswith("Interim (10 of 12 runs): nothing below is final.")
    for p in (tmp_path / "runs").glob("llds_action*"):
        p.unlink()
    s = report.write_report(path, tmp_path / "runs", tmp_path / "report")
    assert report.verdict_text(s, reg) == ("Interim (7 of 12 runs): nothing below is final. The comparisons wait for "
                                      "finished runs of both LLDS and GRPO.")


def test_runs_outside_the_registered_cells_are_left_out(tmp_path):
    path = write_grid(tmp_path)
    write_gz_json(tmp_path / "runs" / compact_name("grpo", 1e-3, 0), run("grpo", 1e-3, 0, 4, 0.2))  # not registered
    write_gz_json(tmp_path / "runs" / compact_name("grpo", 2e-3, 7), run("grpo", 2e-3, 7, 4, 0.2))  # seed 7 neither
    s = report.write_report(path, tmp_path / "runs", tmp_path / "report")
    assert s["runs_finished"] == 12 and all(p["seed"] != 7 and p["lr"] != 1e-3 for p in s["points"])


def test_the_healthy_stretch_alarm_retest_is_reported_apart_as_not_registered(tmp_path):
    path = write_grid(tmp_path)
    reg = json.loads(path.read_text())
    reg["hypotheses"]["H3"] = {"title": "alarms", "lr": "collapse", "false_alarm_rate": 0.34,
                               "alarms": ["probe_drop"]}
    path.write_text(json.dumps(reg))
    assert lab_main(["stepsize-report", "--registration", str(path)]) == 0
    s = json.loads((tmp_path / "report" / "summary.json").read_text())
    registered, retest = s["hypotheses"]["H3"], s["exploratory_alarms"]["H3"]
    assert (registered["rule"], retest["rule"]) == ("calm_runs", "healthy_stretch")
    # at 2e-3: 6 collapsed runs (GRPO, KL-matched) and 3 calm LLDS runs. Registered: the calm runs' flat reward scores
    # 0, 1 of 3 may fire, threshold 0, none does. Re-test: all 9 set it; only the KL-matched runs (stretch ends at 6)
    # hold a complete early window (step 5, score 0), the others' peaks are -inf: 3 of 9 may fire, threshold -inf.
    assert registered["alarms"]["reward_drop"]["false_alarms"] == "0/3"
    assert retest["alarms"]["reward_drop"]["false_alarms"] == "3/9"
    text = (tmp_path / "report" / "README.md").read_text()
    section = text.index("## Alarms against each run's healthy stretch (exploratory, not registered)")
    window = text.index("## Step size over the registered window")
    assert text.index("## The label's sensitivity (registered)") < section < window
    assert "exploratory" not in report.readme_block(s, reg)


def test_each_registered_comparison_prints_its_welch_interval_beside_the_bootstrap():
    """The report's hypothesis line keeps the registered bootstrap interval and adds Welch's; the README's bullet
    quotes Welch first, the bootstrap beside it (a hand-made comparison where the two differ)."""
    comp = {"a": {"arm": "llds_action", "lr": 0.002, "count": "5/5", "rmst": 25.2},
            "b": {"arm": "grpo", "lr": 0.002, "count": "5/5", "rmst": 10.0},
            "rmst_difference": {"estimate": 15.2, "low": 12.4, "high": 18.0},
            "welch": {"estimate": 15.2, "low": 11.3, "high": 19.1}, "logrank": {"p_one_sided": 0.00124},
            "p_holm": 0.00622}
    c = {"comparison": comp, "supported": True}
    assert ("difference 15.2 [12.4, 18.0] steps (bootstrap 95 %; Welch 95 % [+11.3, +19.1]), log-rank one-sided p "
            "0.00124 (Holm-adjusted 0.00622): supported") in report._comparison_text(c)
    assert report._short(c) == ("llds_action 5/5 vs grpo (lr 0.002) 5/5 collapsed, RMST difference +15.2 steps, "
                                "Welch [+11.3, +19.1] (bootstrap [+12.4, +18.0]), p 0.0012 (Holm-adjusted 0.00622): "
                                "supported")
    assert "Welch 95 % -" in report._comparison_text({**c, "comparison": {**comp, "welch": None}})
