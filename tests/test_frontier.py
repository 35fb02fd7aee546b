"""The learning-stability frontier: its endpoints on hand-made curves, the Pareto frontier on a hand-made set, the
choice on validation and the test read once, and the committed registration (valid, before every run, its report
what the committed runs compute)."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO_ROOT, registered_run_violations, stale_report_parts
from searchr1_lld.config import ConfigError
from searchr1_lab.frontier.endpoints import cell_endpoints, final_value, run_endpoints
from searchr1_lab.frontier.pareto import dominates, pareto_front
from searchr1_lab.frontier.selection import choose, ranks, selection_key

LABEL = {"ratio": 0.3, "persist": 2, "horizon": 10}


def run(arm, curve, seed=0, lr=0.002, whole=None, test=None):
    """A compact run whose held-out EM follows ``curve`` at steps 0, 2, 4, ..."""
    records = [{"step": 2 * i, "eval/val_sub_em": v} for i, v in enumerate(curve)]
    for step, v in (whole or {}).items():
        records.append({"step": step, "eval/val_em": v})
    return {"method": arm, "lr": lr, "seed": seed, "records": sorted(records, key=lambda r: r["step"]),
            "test": {"correct": test or {q: 0 for q in ("q1", "q2", "q3", "q4")}}}


def test_a_run_that_never_learns_has_zero_utility_whatever_it_survives():
    flat = run_endpoints(run("a", [0.4, 0.4, 0.38, 0.39, 0.4, 0.37]), LABEL)
    assert flat["utility"] == 0.0 and flat["peak_gain"] == 0.0 and flat["event"] == 0 and flat["time"] == 10
    falling = run_endpoints(run("a", [0.4, 0.3, 0.2, 0.2, 0.2, 0.2]), LABEL)
    assert falling["utility"] == 0.0 and falling["peak_gain"] == pytest.approx(-0.1) and falling["event"] == 0
    assert falling["gain_area"] < 0


def test_a_run_that_learns_then_collapses_scores_its_peak_and_its_collapse():
    e = run_endpoints(run("a", [0.4, 0.5, 0.6, 0.1, 0.05, 0.1], whole={0: 0.41, 10: 0.08, 12: 0.5}), LABEL)
    assert e["utility"] == pytest.approx(0.2) and e["peak_step"] == 4
    assert (e["time"], e["event"]) == (6, 1)  # 0.1 and 0.05 <= 0.12 at steps 6 and 8
    # gain area: trapezoids (0,0) (2,.1) (4,.2) (6,-.3) (8,-.35) (10,-.3) over 10 steps
    area = (0.5 * 0.1 * 2 + 0.5 * 0.3 * 2 + 0.5 * (-0.1) * 2 + 0.5 * (-0.65) * 2 + 0.5 * (-0.65) * 2) / 10
    assert e["gain_area"] == pytest.approx(area)
    assert e["final_val_em"] == 0.08  # the last whole-validation EM at or before the horizon, not step 12's
    assert final_value([{"step": 3, "x": float("nan")}], "x", 10) is None


def test_a_cells_summary_is_its_runs_spread_and_rmst():
    points = [run_endpoints(run("a", c, seed=s), LABEL) for s, c in
              enumerate([[0.4, 0.5, 0.6, 0.1, 0.05, 0.1], [0.4, 0.45, 0.42, 0.41, 0.44, 0.43]])]
    cell = cell_endpoints(points, 10)
    assert cell["runs"] == 2 and cell["collapsed"] == "1/2"
    assert cell["rmst"] == pytest.approx(0.5 * 6 + 0.5 * 10)  # KM: 1 to step 6, then 0.5 to the horizon
    assert cell["utility"] == {"mean": pytest.approx(0.125), "min": pytest.approx(0.05), "max": pytest.approx(0.2)}
    assert cell_endpoints([], 10)["rmst"] is None and cell_endpoints([], 10)["utility"]["mean"] is None


def test_the_pareto_frontier_of_a_hand_made_set():
    points = [(10, 0.1), (30, 0.05), (20, 0.2), (20, 0.1), (75, 0.0), (30, 0.05), (5, 0.3)]
    assert dominates((20, 0.2), (20, 0.1)) and not dominates((30, 0.05), (30, 0.05))
    # (10, .1) and (20, .1) lie under (20, .2); the two (30, .05) tie and neither dominates the other
    assert pareto_front(points) == [6, 2, 1, 5, 4]
    assert pareto_front([]) == []


def cell(name, area, utility, rmst, runs=3):
    return {"name": name, "runs": runs, "gain_area": {"mean": area}, "utility": {"mean": utility}, "rmst": rmst}


def test_a_place_on_the_frontier_is_resolved_only_when_every_lead_is_clear_of_zero():
    """A (RMST 10, utility 0.5) and B (20, 0.3) are on the frontier, C (15, 0.2) is not. By hand, Welch with 3 runs a
    cell: A leads B on utility by 0.2, se sqrt(0.01 / 3), df 2, t 4.3027: [-0.048, +0.448], not clear of 0; A leads
    C by 0.3, se sqrt(0.02 / 3), df 4, t 2.7764: [+0.073, +0.527]; B leads A on RMST by 10, se sqrt(1 / 3), df 2:
    [+7.52, +12.48]. A's place is unresolved, B's resolved."""
    from searchr1_lab.frontier.margins import frontier_margins
    from searchr1_lab.frontier.report import frontier_names, margin_lines

    plan = {"a": ([10, 10, 10], [0.4, 0.5, 0.6]), "b": ([19, 20, 21], [0.3, 0.3, 0.3]),
            "c": ([15, 15, 15], [0.1, 0.2, 0.3])}
    points = [{"arm": arm, "lr": 0.002, "time": t, "event": 1, "utility": u}
              for arm, (times, utils) in plan.items() for t, u in zip(times, utils)]
    cells = [{"name": f"{arm}@0.002", "arm": arm, "lr": 0.002, "runs": 3, "rmst": sum(times) / 3,
              "utility": {"mean": sum(utils) / 3}, "on_frontier": arm != "c"} for arm, (times, utils) in plan.items()]
    a, b = frontier_margins(cells, points, horizon=30)
    assert (a["cell"], a["resolved"], b["cell"], b["resolved"]) == ("a@0.002", False, "b@0.002", True)
    assert [(d["challenger"], d["axis"]) for d in a["leads"]] == [("b@0.002", "utility"), ("c@0.002", "utility")]
    lead_b, lead_c = (d["lead"] for d in a["leads"])
    assert (lead_b["estimate"], lead_b["low"], lead_b["high"]) == pytest.approx((0.2, -0.0484, 0.4484), abs=1e-4)
    assert (lead_c["low"], lead_c["high"]) == pytest.approx((0.0733, 0.5267), abs=1e-4)
    ((name, axis, lead),) = [(d["challenger"], d["axis"], d["lead"]) for d in b["leads"]]
    assert (name, axis) == ("a@0.002", "rmst")
    assert (lead["low"], lead["high"]) == pytest.approx((7.516, 12.484), abs=1e-3)
    s = {"frontier": ["a@0.002", "b@0.002"], "margins": [a, b], "held_out_questions": 120}
    assert frontier_names(s) == "a@0.002 (its place unresolved), b@0.002"
    text = "\n".join(margin_lines(s))
    assert "| a@0.002 | b@0.002 | utility | +0.200 [-0.048, +0.448] | +24.0 | no |" in text
    assert "| b@0.002 | a@0.002 | RMST | +10.0 [+7.5, +12.5] |  | yes |" in text
    assert "Flagged: a@0.002." in text


def test_each_methods_dose_is_chosen_by_gain_area_then_utility_then_survival():
    assert choose([cell("a", 0.01, 0.1, 30), cell("b", 0.02, 0.05, 10)])["name"] == "b"
    assert choose([cell("a", 0.02, 0.1, 30), cell("b", 0.02, 0.2, 10)])["name"] == "b"
    assert choose([cell("a", 0.02, 0.2, 30), cell("b", 0.02, 0.2, 10)])["name"] == "a"
    assert choose([cell("a", 0.02, 0.2, 30), cell("b", 0.02, 0.2, 30)])["name"] == "a"  # a tie: the registered order
    assert choose([cell("a", None, None, None), cell("b", -0.1, 0.0, 5)])["name"] == "b"  # a missing value ranks last
    assert choose([cell("a", 0.5, 0.5, 75, runs=0)]) is None
    assert selection_key(cell("a", None, 0.1, 3))[0] == float("-inf")
    assert ranks({"x": 0.3, "y": 0.5, "z": 0.3, "w": None}) == {"x": 2, "y": 1, "z": 2, "w": None}


def hand_made_registration():
    return {"registration": {"title": "t", "analysis_command": "python -m searchr1_lab frontier-report",
                             "report_dir": "r", "runs_dir": "r/runs"},
            "seeds": [0, 1], "label": LABEL,
            "arms": {"grpo": {"method": "grpo", "lrs": [0.002]},
                     "llds_a": {"method": "llds_action", "lrs": [0.002], "dose": "lambda 0.2"},
                     "llds_b": {"method": "llds_action", "lrs": [0.002], "dose": "lambda 1.0"}},
            "frontier": {"methods": {"GRPO": ["grpo"], "LLDS": ["llds_a", "llds_b"]},
                         "phenomena": {"window": 2, "early_steps": 2}}}


def write_runs(tmp_path, runs, base=True):
    from searchr1_lab.compact import BASELINES_FILE, write_gz_json

    for i, r in enumerate(runs):
        write_gz_json(tmp_path / f"{r['method']}-seed{r['seed']}-{i}.json.gz", r)
    if base:
        questions = [{"id": q, "subject": s} for q, s in (("q1", "A"), ("q2", "A"), ("q3", "B"), ("q4", "C"))]
        correct = {"majority": {q: 0 for q in ("q1", "q2", "q3", "q4")},
                   "warm_start_no_retrieval": {q: 0 for q in ("q1", "q2", "q3", "q4")},
                   "warm_start": {"q1": 1, "q2": 0, "q3": 0, "q4": 0}}
        write_gz_json(tmp_path / BASELINES_FILE, {"splits": {"test": {"questions": questions, "correct": correct}}})
    return tmp_path


def test_the_analysis_reads_the_test_split_only_once_the_grid_is_complete(tmp_path):
    from searchr1_lab.frontier.report import analyse, readme_block, render, test_lines

    reg = hand_made_registration()
    good, bad = {"q1": 1, "q2": 1, "q3": 0, "q4": 1}, {"q1": 0, "q2": 0, "q3": 0, "q4": 1}
    runs = [run("grpo", [0.4, 0.3, 0.1, 0.1, 0.1, 0.1], seed=s, test=bad) for s in (0, 1)]
    runs += [run("llds_a", [0.4, 0.5, 0.55, 0.5, 0.5, 0.45], seed=s, test=good) for s in (0, 1)]
    runs += [run("llds_b", [0.4, 0.42, 0.41, 0.4, 0.41, 0.4], seed=0, test=bad)]
    partial = analyse(reg, write_runs(tmp_path / "partial", runs))
    assert partial["runs_planned"] == 6 and not partial["complete"] and partial["test"] is None
    assert partial["chosen"] == {"GRPO": "grpo@0.002", "LLDS": "llds_a@0.002"}
    assert partial["frontier"] == ["llds_a@0.002"]  # it learned most and lasted to the horizon
    assert "Withheld until every registered run is in (5 of 6)" in render(partial, reg)
    assert "test withheld" in readme_block(partial, reg)
    extra = runs + [run("llds_b", [0.4, 0.42, 0.41, 0.4, 0.41, 0.4], seed=7, test=bad)]  # a seed not registered
    assert analyse(reg, write_runs(tmp_path / "extra", extra))["test"] is None  # 6 runs, yet not the 6 registered
    runs.append(run("llds_b", [0.4, 0.42, 0.41, 0.4, 0.41, 0.4], seed=1, test=bad))
    full = analyse(reg, write_runs(tmp_path / "full", runs))
    assert full["complete"] and full["test"]["LLDS"]["test_em"]["mean"] == 0.75
    assert full["test"]["GRPO"]["test_em"]["mean"] == 0.25 and full["test"]["GRPO"]["test_em"]["clusters"] == 3
    assert (full["test"]["LLDS"]["rank_validation"], full["test"]["LLDS"]["rank_test"]) == (1, 1)
    assert full["test_baselines"]["warm_start"]["mean"] == 0.25 and full["test_baselines"]["majority"]["mean"] == 0
    assert partial["test_baselines"] is None  # the baselines' test EM waits for the grid too
    text = render(full, reg)
    assert "warm start (step 0) 0.250 [" in text
    # LLDS (0.75) is not called above the warm start (0.25): with 3 subjects a resample of B alone (1 in 27) scores
    # it 0, one of A alone the warm start 0.5, so the intervals overlap
    above = "score above the warm start on test (intervals apart): "
    assert above + "none." in text and "(the warm start, untrained: 0.250)" in readme_block(full, reg)
    em = lambda mean, lo, hi: {"mean": mean, "lo": lo, "hi": hi}  # noqa: E731
    by_hand = {"chosen": {"A": "a@0.002", "B": "b@0.002"},
               "test": {"A": {"test_em": em(0.6, 0.5, 0.7), "rank_validation": 1, "rank_test": 1},
                        "B": {"test_em": em(0.45, 0.35, 0.55), "rank_validation": 2, "rank_test": 2}},
               "test_baselines": {"majority": em(0.0, 0.0, 0.0), "warm_start_no_retrieval": em(0.0, 0.0, 0.0),
                                  "warm_start": em(0.4, 0.3, 0.49)}}
    assert above + "A." in "\n".join(test_lines(by_hand))  # B's interval overlaps the warm start's
    with pytest.raises(FileNotFoundError, match="baselines"):
        analyse(reg, write_runs(tmp_path / "nobase", runs, base=False))


def test_every_arm_belongs_to_exactly_one_method():
    from searchr1_lab.frontier.report import method_of_arm

    reg = hand_made_registration()
    assert method_of_arm(reg) == {"grpo": "GRPO", "llds_a": "LLDS", "llds_b": "LLDS"}
    reg["frontier"]["methods"]["LLDS"] = ["llds_a"]
    with pytest.raises(ConfigError, match="no method for the arms \\['llds_b'\\]"):
        method_of_arm(reg)
    reg["frontier"]["methods"]["LLDS"] = ["llds_a", "llds_b", "grpo"]
    with pytest.raises(ConfigError, match="listed twice"):
        method_of_arm(reg)


# ---------------------------------------------------------------------------------------------------------------
# the committed registration
# ---------------------------------------------------------------------------------------------------------------

FRONTIER_FILE = "docs/lab/frontier/registration.json"


@pytest.fixture(scope="module")
def reg():
    from searchr1_lab.registered.registration import load_registration

    return load_registration(REPO_ROOT / FRONTIER_FILE)


def test_the_registration_is_valid_on_a_world_whose_test_split_no_report_scored(reg):
    from searchr1_lab.frontier.report import method_of_arm
    from searchr1_lab.methods import read_lab_config
    from searchr1_lab.registered.registration import cells
    from searchr1_lab.studies import current_path
    from searchr1_lld.world import load_world_config
    from searchr1_lld.world.build import world_config_hash

    block = reg["registration"]
    _, world_file, _ = read_lab_config(block["config"], [])
    assert world_file == reg["world"]["config"]
    assert world_config_hash(load_world_config(REPO_ROOT / world_file)) == reg["world"]["hash"]
    assert len(cells(reg)) == 51 and set(method_of_arm(reg)) == set(reg["arms"])
    for path in block["analysis_code"]:  # each file where it lives now
        assert (REPO_ROOT / current_path(path)).is_file(), path
    # the reports of the other studies on this world never print a test EM (their lists of the commits that changed
    # their code name commits of this study's report, which did)
    for other in ("docs/lab/stepsize/README.md", "docs/lab/trustregion/README.md"):
        lines = (REPO_ROOT / other).read_text().splitlines()
        assert not [ln for ln in lines if "test EM" in ln and not ln.startswith("- `")], other


def test_the_registration_precedes_every_run_of_its_grid():
    assert registered_run_violations(FRONTIER_FILE) == []


def test_the_readme_block_and_the_report_are_what_the_committed_runs_compute(reg):
    from searchr1_lab.frontier.report import REPORT

    assert stale_report_parts(REPORT, reg) == []


def test_the_report_command_writes_the_report_figures_and_readme_block(tmp_path):
    from searchr1_lab.cli import main as lab_main

    reg = hand_made_registration()
    reg["registration"].update(status="registered", config="configs/lab/frontier.yaml", train_dir="runs/x")
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(reg))
    runs = [run("grpo", [0.4, 0.3, 0.1, 0.1, 0.1, 0.1], seed=s) for s in (0, 1)]
    runs += [run(arm, [0.4, 0.5, 0.55, 0.5, 0.5, 0.45], seed=s) for arm in ("llds_a", "llds_b") for s in (0, 1)]
    for r in runs:
        r["records"] += [{"step": 2 * i + 1, "actor/entropy": 1.0 - 0.1 * i, "actor/grad_norm": 1.0 + i,
                          "lld/correct_logp_old_per_token": -1.0 - 0.1 * i} for i in range(5)]
    write_runs(tmp_path / "runs", runs)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- frontier-results:begin (python -m searchr1_lab frontier-report) -->\nold\n"
                      "<!-- frontier-results:end -->\n")
    assert lab_main(["frontier-report", "--registration", str(path), "--runs", str(tmp_path / "runs"), "--out",
                     str(tmp_path / "out"), "--readme", str(readme)]) == 0
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"README.md", "summary.json", "frontier.png", "phenomena.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["chosen"]["LLDS"] == "llds_a@0.002"  # a tie: the registered order
    assert "6 of 6 runs" in readme.read_text() and "old" not in readme.read_text()
    assert "| LLDS | lambda 0.2 | 2 | 0/2 | 10.0 |" in (out / "README.md").read_text()


def test_the_reading_added_after_the_test_split_was_read_came_after_it(reg):
    """The frontier's late reading: its commit descends from the one whose report first showed the test EMs, and
    that commit is the first whose report did (its parent's report shows none)."""
    from searchr1_lab.studies import late_readings

    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone: run `git fetch --unshallow` to read the commits the late readings name")
    report = f"{reg['registration']['report_dir']}/README.md"
    shown = lambda commit: "| rank on test |" in subprocess.run(  # noqa: E731
        ["git", "show", f"{commit}:{report}"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    late = late_readings(reg["registration"])
    assert set(late) == {"test_baselines"}
    for entry in late.values():
        after = subprocess.run(["git", "merge-base", "--is-ancestor", entry["read"], entry["added"]], cwd=REPO_ROOT)
        assert after.returncode == 0, entry
        assert shown(entry["read"]) and not shown(f"{entry['read']}^")


def test_the_figures_group_every_method_once_label_cells_and_read_the_warm_starts_em():
    from searchr1_lab.frontier.figures import cell_label, phenomena_groups, start_val_em

    assert phenomena_groups(["GRPO", "DAPO", "reference KL", "a new fix"]) == {
        "GRPO and the likelihood fixes": ["GRPO"], "step-size controls": ["reference KL"],
        "the field's other fixes": ["DAPO", "a new fix"]}
    assert cell_label({"method": "GRPO", "dose": "GRPO, lr 0.0014"}) == "GRPO, lr 0.0014"
    assert cell_label({"method": "LLDS", "dose": "lambda 0.2"}) == "LLDS: lambda 0.2"
    runs = [{"records": [{"step": 0, "eval/val_em": v}, {"step": 5, "eval/val_em": 0.0}]} for v in (0.4, 0.5)]
    assert start_val_em(runs) == pytest.approx(0.45) and start_val_em([{"records": []}]) is None


def test_git_keeps_the_studys_results(reg):
    block = reg["registration"]
    paths = [f"{block['runs_dir']}/grpo-lr0.002-seed20.json.gz", f"{block['runs_dir']}/baselines.json.gz",
             f"{block['report_dir']}/summary.json"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert ignored == "", f"git ignores {ignored.split()}"


def test_the_frontier_figure_names_close_points_without_overlap_and_inside_the_axes():
    from searchr1_lab.frontier.figures import _label_points, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    points = [(10.0, 0.1), (10.0, 0.1), (10.1, 0.1), (20.0, 0.05)]  # three at one place, one at the right edge
    ax.plot(*zip(*points), "o")
    ax.set_xlim(0, 20.0)
    _label_points(ax, points, ["first@0.002", "second@0.002", "third@0.002", "edge@0.002"])
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    plt.close(fig)
    assert [t.get_text() for t in ax.texts] == ["first@0.002", "second@0.002", "third@0.002", "edge@0.002"]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert boxes[-1].x1 <= ax.bbox.x1  # named to the left of a point at the right edge


def test_the_frontier_is_named_and_drawn_by_survival_whatever_the_registered_order(tmp_path, monkeypatch):
    from searchr1_lab.frontier import figures
    from searchr1_lab.frontier.report import analyse

    # grpo (registered first) never learns much but lasts; llds_a learns most and collapses; llds_b is beaten by both
    runs = [run("grpo", [0.4, 0.45, 0.45, 0.45, 0.45, 0.45], seed=s) for s in (0, 1)]
    runs += [run("llds_a", [0.4, 0.6, 0.1, 0.1, 0.1, 0.1], seed=s) for s in (0, 1)]
    runs += [run("llds_b", [0.4, 0.42, 0.1, 0.1, 0.1, 0.1], seed=s) for s in (0, 1)]
    summary = analyse(hand_made_registration(), write_runs(tmp_path, runs))
    assert summary["frontier"] == ["llds_a@0.002", "grpo@0.002"]
    plt, kept = figures._pyplot(), []
    monkeypatch.setattr(plt, "close", kept.append)
    figures.frontier_figure(summary, tmp_path / "frontier.png")
    (line,) = [ln for ln in kept[0].axes[0].lines if ln.get_linestyle() == "--"]
    assert list(line.get_xdata()) == sorted(line.get_xdata())  # the line runs along the frontier, not across it


def test_the_report_lists_every_change_to_the_registered_analysis_code(tmp_path, scratch_git):
    from searchr1_lab.report import analysis_change_lines as change_lines
    from searchr1_lab.studies import analysis_changes

    git = scratch_git
    for name in ("analysis.py", "other.py"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "registered")
    registered = git("rev-parse", "HEAD").stdout.strip()
    block = {"analysis_commit": registered, "analysis_code": ["analysis.py"]}
    assert analysis_changes(block, tmp_path) == []
    assert change_lines([]) == ["The code that writes this report is as it was at the registered analysis commit.", ""]
    for name, subject in (("other.py", "a change elsewhere"), ("analysis.py", "the label moved"),
                          ("analysis.py", "a second change")):
        (tmp_path / name).write_text(f"x = '{subject}'\n")
        git("commit", "-q", "-am", subject)
    changes = analysis_changes(block, tmp_path)
    assert [c["subject"] for c in changes] == ["the label moved", "a second change"]  # oldest first, its files only
    lines = change_lines(changes)
    assert "2 commit(s)" in lines[0] and lines[2] == f"- `{changes[0]['commit']}` the label moved"
    assert analysis_changes({"analysis_code": ["analysis.py"]}, tmp_path) is None  # a hand-made registration
    assert change_lines(None) == []
    with pytest.raises(RuntimeError, match="not in the history"):
        analysis_changes({**block, "analysis_commit": "0" * 40}, tmp_path)
    # a file registered at its old place (searchr1_lld/lab/..., searchr1_lab/... today): its changes under both names
    old, new = tmp_path / "searchr1_lld/lab/stepsize.py", tmp_path / "searchr1_lab/stepsize.py"
    old.parent.mkdir(parents=True)
    old.write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "registered at the old place")
    moved = {"analysis_commit": git("rev-parse", "HEAD").stdout.strip(),
             "analysis_code": ["searchr1_lld/lab/stepsize.py"]}
    old.write_text("x = 2\n")
    git("commit", "-q", "-am", "changed before the move")
    new.parent.mkdir()
    git("mv", "searchr1_lld/lab/stepsize.py", "searchr1_lab/stepsize.py")
    git("commit", "-q", "-m", "the move")
    new.write_text("x = 3\n")
    git("commit", "-q", "-am", "changed after the move")
    assert [c["subject"] for c in analysis_changes(moved, tmp_path)] == [
        "changed before the move", "the move", "changed after the move"]
