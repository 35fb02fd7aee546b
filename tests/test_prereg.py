"""The pre-registered analysis on a hand-made grid of compact runs, and the registration itself."""


import pytest

from searchr1_lld.lab.compact import BASELINES_FILE, compact_name, write_gz_json
from searchr1_lld.lab.prereg import analyse, make_alarm, render

PREREG = {
    "registration": {"analysis_command": "python -m searchr1_lld.lab prereg-report", "analysis_commit": "abc",
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
    assert "H1" in text and "probe_drop" in text and "4 of 4" not in text


def test_an_unfinished_grid_says_so_and_h1_can_be_untestable(grid):
    for p in grid.glob("grpo-lr0.001-*.json.gz"):
        p.unlink()
    s = analyse(PREREG, grid)
    assert not s["complete"] and s["runs_finished"] == 6
    assert s["H1"]["verdict"].startswith("not testable") and s["H3"]["verdict"].startswith("not testable")
    assert "interim" in render(s)


def test_a_registered_alarm_on_the_collapse_signal_is_refused():
    with pytest.raises(ValueError, match="collapse label is computed from"):
        make_alarm({"name": "val", "kind": "drop_below_start", "key": "eval/val_em", "drop": 0.1})
    with pytest.raises(ValueError, match="unknown kind"):
        make_alarm({"name": "x", "kind": "guess", "key": "actor/entropy"})


def test_the_analysis_reads_the_baselines(tmp_path):
    with pytest.raises(FileNotFoundError, match="baselines"):
        analyse(PREREG, tmp_path)
