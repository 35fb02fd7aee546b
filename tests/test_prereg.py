"""The pre-registered analysis on a hand-made grid of compact runs, and the registration itself."""

import json
import subprocess

import pytest

from searchr1_lld.config import ConfigError
from searchr1_lab.cli import main as lab_main
from searchr1_lab.compact import BASELINES_FILE, compact_name, read_runs, write_gz_json
from searchr1_lab.grid import rebuild_report
from searchr1_lab.methods import REPO_ROOT
from searchr1_lab.comparison.claims import readme_block_of
from searchr1_lab.prereg.registration import (PREREG_FILE, analyse, check_registered, h2, load_preregistration, make_alarm,
                                              registration_violations)
from searchr1_lab.prereg.report import README_BEGIN, README_END, readme_block, render, spiral_statement

PREREG = {
    "registration": {"analysis_command": "python -m searchr1_lab prereg-report",
                     "runs_dir": "x", "report_dir": "y"},
    "grid": {"methods": ["grpo", "llds_action"], "lrs": [5e-4, 1e-3], "seeds": [0, 1]},
    "label": {"ratio": 0.3, "persist": 2, "reward_ratio": 0.3},
    "alarms": [{"name": "probe_drop", "kind": "drop_below_start", "key": "probe/logp_per_token",
                "reference_key": "probe/initial_logp_per_token", "drop": 0.5},
               {"name": "grad_norm_spike", "kind": "ratio_over_early", "key": "actor/grad_norm_signal", "ratio": 5,
                "early_steps": 2}],
    "hypotheses": {"H2": {"alarm": "probe_drop", "lead_k": 2}},
    "phenomena": {"window": 2, "early_steps": 2},
}
# 4 subjects x (1 single-hop + 1 two-hop) questions on each split; the warm start answers 2 of 4 validation questions
QUESTIONS = [{"id": f"q{i}", "hops": 1 + i % 2, "family": "f", "subject": f"s{i // 2}", "train_answer": False}
             for i in range(8)]


def _run(method, lr, seed, collapse, single_hop_right):
    """A run of 10 steps, evaluated every 2; ``collapse``: validation EM falls to 0 from step 6 and the probe set's
    likelihood falls from step 3 (3 steps ahead)."""
    records = []
    for step in range(1, 11):
        r = {"step": step, "reward/em_mean": 0.5, "actor/grad_norm": 1.0, "actor/grad_norm_signal": 1.0,
             "actor/entropy": 1.0, "lld/correct_logp_old_per_token": -1.0, "rollout/valid_searches_mean": 1.0,
             "probe/logp_per_token": -1.0 - (step >= 3) * collapse * 1.0}
        if step == 1:
            r["probe/initial_logp_per_token"] = -1.0
        if step % 2 == 0:
            r["eval/val_em"] = 0.0 if collapse and step >= 6 else 0.5
        records.append(r)
    correct = {q["id"]: int(q["hops"] == 1 and single_hop_right) for q in QUESTIONS}
    return {"method": method, "label": method, "seed": seed, "lr": lr, "steps": 10, "records": records,
            "test": {"em": sum(correct.values()) / 8, "correct": correct}, "code": {"commit": "abc", "dirty": False}}


@pytest.fixture
def grid(tmp_path):
    write_gz_json(tmp_path / BASELINES_FILE, {"splits": {
        split: {"questions": QUESTIONS, "correct": {"warm_start": {q["id"]: int(i < 4) for i, q in enumerate(QUESTIONS)}}}
        for split in ("val", "test")}})
    # GRPO collapses at 1e-3 on both seeds and keeps no single-hop skill; LLDS collapses on none and keeps it
    for lr in (5e-4, 1e-3):
        for seed in (0, 1):
            write_gz_json(tmp_path / compact_name("grpo", lr, seed), _run("grpo", lr, seed, lr == 1e-3, lr < 1e-3))
            write_gz_json(tmp_path / compact_name("llds_action", lr, seed), _run("llds_action", lr, seed, False, True))
    return tmp_path


def test_registered_analysis_on_a_hand_made_grid(grid):
    s = analyse(PREREG, grid)
    assert s["complete"] and s["warm_start_val_em"] == 0.5 and s["collapse_bound"] == pytest.approx(0.15)
    assert [r["collapse_step"] for r in s["runs"] if r["method"] == "grpo"] == [None, None, 6, 6]
    one = s["H1"]
    assert one["rates"] == ["0.001"] and one["cells"]["grpo"]["0.001"]["k"] == 2
    arm = one["arms"]["llds_action"]
    assert (arm["collapsed"], arm["grpo_collapsed"]) == (0, 2) and arm["difference"]["value"] == -1.0
    assert arm["supported"]  # 0/2 vs 2/2: Newcombe's interval [-1, -0.12] lies below 0
    two = s["H2"]
    assert two["warned_k_ahead"]["k"] == 2 and two["warned_k_ahead"]["n"] == 2  # probe alarm at step 3, collapse 6
    assert two["mixed_rates"] == ["0.001"] and two["verdict"] is None
    three = s["H3"]["arms"]["llds_action"]["difference"]
    assert three["mean"] == 1.0 and three["clusters"] == 4  # every single-hop question: LLDS right, GRPO wrong
    probe = next(a for a in s["alarms"] if a["alarm"] == "probe_drop")
    assert probe["by_lr"]["0.001"]["sensitivity"]["k"] == 2 and probe["by_lr"]["0.0005"]["specificity"]["k"] == 4
    assert probe["overall"]["lead_steps"] == [3, 3]
    text = render(s)
    assert "H1" in text and "probe_drop" in text and "4 of 4" not in text and "(likelihood.png)" in text
    assert "| grpo | 0.001 | 0 | 0:0.50 2:0.50 4:0.50 6:0.00 8:0.00 10:0.00 | 6 | - | 0.000 |" in text  # a run
    assert "| grpo | 0.500 ± 0.000 (2) | 0.000 ± 0.000 (2) |" in text  # validation EM at the end per arm and rate
    block = readme_block(s)
    assert block.startswith("8 of 8 runs finished.\n") and "grpo 0/2, 2/2; llds_action 0/2, 0/2" in block
    assert ("- H1 (LLDS collapses less often than GRPO where GRPO collapses): llds_action minus GRPO -1.00 "
            "[-1.00, -0.07]: supported") in block
    assert "firing share difference +1.00 [+0.07, +1.00]: supported" in block  # H2


def test_the_plain_statement_names_collapses_and_whether_the_likelihood_fell_first(grid):
    s = analyse(PREREG, grid)
    assert spiral_statement(s) == ("2 runs collapsed on validation EM; in 2 of them the `probe_drop` alarm (the "
                                   "likelihood of correct responses falling) came 2 or more steps first, the paper's "
                                   "order.")

    def of(runs, **kw):  # the summary of other runs: their H2 recomputed as the analysis computes it
        return {**s, **kw, "runs": runs, "H2": h2(runs, "probe_drop", 2)}

    late = of([{**r, "alarms": {**r["alarms"], "probe_drop": r["collapse_step"] - 1}}
               if r["collapse_step"] else r for r in s["runs"]])  # the alarm one step ahead only
    assert "none after the `probe_drop` alarm came 2 or more steps ahead" in spiral_statement(late)
    one = of([r for r in s["runs"] if not r["collapse_step"]] + [next(r for r in s["runs"] if r["collapse_step"])])
    assert spiral_statement(one).startswith("1 run collapsed on validation EM; in 1 of them")
    calm = of([r for r in s["runs"] if not r["collapse_step"]], complete=False, runs_finished=3)
    assert spiral_statement(calm) == "No run's validation EM collapsed (so far, 3 of 8 runs)."
    assert spiral_statement({**calm, "complete": True}).endswith("the sandbox did not reproduce the death spiral.")


def test_an_unfinished_grid_says_so_and_h1_can_be_untestable(grid):
    for p in grid.glob("grpo-lr0.001-*.json.gz"):
        p.unlink()
    s = analyse(PREREG, grid)
    assert not s["complete"] and s["runs_finished"] == 6
    assert s["H1"]["verdict"].startswith("not testable") and s["H3"]["verdict"].startswith("not testable")
    assert "interim" in render(s)


def test_an_arm_without_runs_at_the_h1_rate_says_so(grid):
    for p in grid.glob("llds_action-lr0.001-*.json.gz"):  # GRPO collapsed at 1e-3; LLDS has not run there yet
        p.unlink()
    s = analyse(PREREG, grid)
    block = readme_block(s)
    assert "llds_action minus GRPO no run at these rates yet." in block  # H1 and H3 alike, not "-: not supported"
    assert "- llds_action: no run at these rates yet." in render(s)


def test_a_registered_alarm_on_the_collapse_signal_is_refused():
    with pytest.raises(ValueError, match="collapse label is computed from"):
        make_alarm({"name": "val", "kind": "drop_below_start", "key": "eval/val_em", "drop": 0.1})
    with pytest.raises(ValueError, match="unknown kind"):
        make_alarm({"name": "x", "kind": "guess", "key": "actor/entropy"})


def test_the_analysis_reads_the_baselines(tmp_path):
    with pytest.raises(FileNotFoundError, match="baselines"):
        analyse(PREREG, tmp_path)


def _git(repo, *args):
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_provenance_check_catches_runs_started_before_or_beside_the_registration(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "analysis.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "analysis")
    analysis = _git(repo, "rev-parse", "HEAD")
    reg = {"registration": {"analysis_commit": analysis}}
    (repo / "prereg.json").write_text(json.dumps(reg))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "registration")
    registered = _git(repo, "rev-parse", "HEAD")
    (repo / "run.txt").write_text("a result\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a run lands")
    later = _git(repo, "rev-parse", "HEAD")

    def run(commit, dirty=False):
        return {"method": "grpo", "lr": 1e-3, "seed": 0, "code": {"commit": commit, "dirty": dirty}}

    assert registration_violations(repo, "prereg.json", [run(registered), run(later)]) == []
    bad = registration_violations(repo, "prereg.json", [run(analysis), run(later, dirty=True), {"method": "x"}])
    assert len(bad) == 3 and "does not descend" in bad[0] and "uncommitted" in bad[1] and "no commit" in bad[2]
    (repo / "prereg.json").write_text(json.dumps({"registration": {"analysis_commit": analysis, "lrs": [1]}}))
    assert registration_violations(repo, "prereg.json", [])[0] == "prereg.json has uncommitted changes"
    _git(repo, "commit", "-q", "-am", "the registration edited after a run started")
    edited = registration_violations(repo, "prereg.json", [run(later)])
    assert len(edited) == 1 and "does not descend" in edited[0]
    (repo / "prereg.json").write_text(json.dumps({"registration": {"analysis_commit": "0" * 40}}))
    _git(repo, "commit", "-q", "-am", "an analysis commit outside the history")
    assert "not an ancestor" in registration_violations(repo, "prereg.json", [])[0]


def test_the_committed_registration_precedes_every_run_of_its_grid():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "true":  # a depth-limited clone lacks the commits the runs name: the check needs the history
        pytest.skip("shallow clone: run `git fetch --unshallow` to check the runs against the registration")
    prereg = load_preregistration()
    runs, _ = read_runs(REPO_ROOT / prereg["registration"]["runs_dir"])
    assert registration_violations(REPO_ROOT, PREREG_FILE, runs) == []


def test_the_registered_grid_still_trains_on_the_registered_world():
    """The registration names its grid config and its world's hash: the world file that grid config names must still
    hash to it (an edit of that file, a new WorldConfig field or a recipe change would give a run of the registered
    grid command another world than the registered one)."""
    from searchr1_lab.methods import read_lab_config
    from searchr1_lld.world import load_world_config
    from searchr1_lld.world.build import world_config_hash

    prereg = load_preregistration()
    _, world_file, _ = read_lab_config(prereg["grid"]["config"], [])
    assert world_config_hash(load_world_config(world_file)) == prereg["world"]["hash"]


def test_the_grid_refuses_the_registrations_runs_dir_until_it_is_registered(tmp_path):
    reg = tmp_path / "prereg.json"
    reg.write_text(json.dumps({"registration": {"status": "draft", "runs_dir": str(tmp_path / "runs")}}))
    with pytest.raises(ConfigError, match="before its grid runs"):
        check_registered(tmp_path / "runs", reg)
    check_registered(tmp_path / "elsewhere", reg)  # another directory: an exploratory grid
    reg.write_text(json.dumps({"registration": {"status": "registered", "runs_dir": str(tmp_path / "runs")}}))
    check_registered(tmp_path / "runs", reg)


def test_the_report_command_writes_the_report(grid, tmp_path, capsys):
    prereg = tmp_path / "prereg.json"
    prereg.write_text(json.dumps(PREREG))
    out, readme = tmp_path / "report", tmp_path / "README.md"
    readme.write_text(f"{README_BEGIN}\n{README_END}\n")
    assert lab_main(["prereg-report", "--prereg", str(prereg), "--runs", str(grid), "--out", str(out),
                     "--readme", str(readme)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs_finished"] == 8 and summary["H1"]["arms"]["llds_action"]["supported"]
    assert "## H1" in (out / "README.md").read_text() and "8 of 8 runs" in capsys.readouterr().out
    assert readme_block_of(readme.read_text(), README_BEGIN, README_END) == readme_block(summary)
    # H3's levels: the warm start answers 2 of the 4 single-hop test questions; at the H1 rate GRPO none, LLDS all
    assert summary["single_hop_test_em"] == {"warm_start": 0.5, "rates": ["0.001"],
                                             "arms": {"grpo": 0.0, "llds_action": 1.0}}
    assert ("H3 (LLDS loses less single-hop skill than GRPO; from the warm start's 0.50, GRPO ends at 0.00 and the "
            "LLDS arms at 1.00-1.00 at lr 0.001)") in readme_block(summary)


def test_the_grid_rebuilds_the_registered_report_into_its_own_dir(grid, tmp_path):
    # a result of the registered grid rebuilds the registered analysis (never the other comparison's report)
    reg = tmp_path / "prereg.json"
    reg.write_text(json.dumps({**PREREG, "registration": {**PREREG["registration"], "status": "registered",
                                                          "runs_dir": str(grid), "report_dir": str(tmp_path / "out")}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\ntail\n")
    for run in grid.glob("*-seed1.json.gz"):
        run.unlink()
    paths = rebuild_report(grid, reg, readme)
    assert {p.name for p in paths} == {"design.json", "summary.json", "README.md", "likelihood.png", "entropy.png",
                                       "grad_norm.png", "valid_searches.png", "reward.png"}
    assert all(p.is_file() for p in paths if p.name != "design.json")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["runs_finished"] == 4
    block = readme_block_of(readme.read_text(), README_BEGIN, README_END)
    assert block.startswith("4 of 8 runs finished (interim") and "grpo 0/1, 1/1" in block
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("tail\n")
    for run in grid.glob("*.json.gz"):
        if run.name != BASELINES_FILE:
            run.unlink()
    rebuild_report(grid, reg, readme)  # the baselines alone: an interim report with nothing to test yet
    assert "0 of 8 runs finished" in (tmp_path / "out" / "README.md").read_text()


def test_a_report_that_fails_does_not_stop_the_grid(tmp_path, monkeypatch, capsys):
    import subprocess as sp

    from searchr1_lab import grid as grid_mod

    def broken(compact_dir):
        raise sp.CalledProcessError(1, ["python", "-m", "searchr1_lab", "prereg-report"])

    committed = []
    monkeypatch.setattr(grid_mod, "rebuild_report", broken)
    monkeypatch.setattr(grid_mod, "commit", lambda paths, message, repo: committed.append((list(paths), message)))
    done = tmp_path / "run.json.gz"
    done.write_text("x")
    grid_mod.finish(grid_mod.LabTask("run", [], done, report=True), True, tmp_path)
    assert committed == [([done], "lab: result of run")]  # the result is committed without the report
    assert "failed (exit 1); committing the result alone" in capsys.readouterr().out
