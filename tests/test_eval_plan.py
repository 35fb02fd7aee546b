"""What evaluation during training costs (searchr1_lld/preflight/eval_plan.py), counted by hand, and its block in
docs/configs.md as the command renders it."""

from __future__ import annotations

import json

import pytest

from searchr1_lld.config import load_config
from searchr1_lld.preflight import eval_plan as ep

from conftest import REPO_ROOT

NQ_HOTPOTQA = REPO_ROOT / "configs" / "paper" / "qwen2.5-3b-base_nq-hotpotqa_llds.yaml"


def test_the_paper_schedule_against_the_authors():
    """1,005 steps, every 50: evaluations at 50, 100, ..., 1,000 and 1,005 = 21. Ours: 500 + 500 held-out questions
    each time and the seven test sets (51,713 questions) once; the authors': the seven every time. Training: 1,005 x
    512 prompts x 5 responses = 2,572,800 trajectories."""
    cfg = load_config(NQ_HOTPOTQA)
    ours = ep.eval_schedule(cfg, ep.paper_sets(cfg))
    assert (ours.evaluations, ours.per_evaluation, ours.once) == (21, 1000, 51713)
    assert ours.trajectories == 21 * 1000 + 51713 == 72713 and ours.training_trajectories == 2572800
    assert ours.max_tokens == 72713 * 5 * 500  # 4 turns + the answer turn, 500 tokens each
    authors_cfg = load_config(NQ_HOTPOTQA, ["trainer.select_on_test=true", "trainer.keep_best=eval/avg_em",
                                            "data.val_holdout.size=0"])
    authors = ep.eval_schedule(authors_cfg, ep.paper_sets(authors_cfg))
    assert (authors.evaluations, authors.per_evaluation, authors.once) == (21, 51713, 0)
    assert authors.share_of_training == pytest.approx(1085973 / 2572800)
    assert authors.max_gpu_hours(2500.0) == pytest.approx(1085973 * 2500 / 2500.0 / 3600)


def test_a_small_schedule_counted_by_hand():
    """10 steps, every 4: evaluations at 4, 8, 10. A validation split of 30 sampled 10 at a time (the whole split
    before the first step and at the last: 60), 7 test rows before and after (14), a benchmark of 5 at the end."""
    cfg = load_config(None, ["trainer.total_steps=10", "trainer.eval_every=4", "trainer.val_subsample=10",
                             "trainer.train_batch_size=4", "rollout.n=2", "trainer.ppo_mini_batch_size=8"])
    sets = ep.EvalSets(validation=30, test_rows=7, benchmarks={"b": 5})
    s = ep.eval_schedule(cfg, sets)
    assert (s.evaluations, s.per_evaluation, s.once, s.training_trajectories) == (3, 10, 5 + 14 + 60, 80)
    on_test = ep.eval_schedule(load_config(None, ["trainer.total_steps=10", "trainer.eval_every=4",
                                                  "trainer.select_on_test=true"]), sets)
    assert (on_test.per_evaluation, on_test.once) == (30 + 5, 14)
    # no validation split: the test rows are the curve, and the last evaluation is their after-training score
    no_val = ep.eval_schedule(load_config(None, ["trainer.total_steps=10", "trainer.eval_every=4"]),
                              ep.EvalSets(test_rows=7))
    assert (no_val.per_evaluation, no_val.once) == (7, 7)
    limited = ep.eval_schedule(load_config(None, ["trainer.total_steps=10", "trainer.eval_every=4",
                                                  "trainer.eval_limit=3"]), sets)
    assert (limited.per_evaluation, limited.once) == (3, 3 + 6)  # every set cut to 3 questions
    # the whole split once more after step 5 (trainer.full_eval_steps; the last step's is counted already): 30 more
    midpoint = ep.eval_schedule(load_config(None, ["trainer.total_steps=10", "trainer.eval_every=4",
                                                   "trainer.val_subsample=10", "trainer.full_eval_steps=[5,10]"]), sets)
    assert midpoint.once == 5 + 14 + 90
    off = ep.eval_schedule(load_config(None, ["trainer.eval_every=0"]), sets)
    assert (off.evaluations, off.trajectories) == (0, 14)  # before and after training only


def test_the_preflight_lines():
    cfg = load_config(NQ_HOTPOTQA)
    first, cost = ep.plan_lines(cfg, ep.paper_sets(cfg))
    assert first.startswith("evaluation: 21 evaluations (every 50 steps and the last), 1,000 questions each; "
                            "eval.datasets (51,713 questions: nq 3,610, triviaqa 11,313")
    assert first.endswith("once, at the last step")
    assert cost.startswith("evaluation cost: 72,713 greedy trajectories over the run, 2.8 % of its 2,572,800")
    assert ep.plan_lines(cfg, ep.EvalSets(), unread=True)[0].startswith("evaluation: not computed")
    assert ep.plan_lines(load_config(None), ep.EvalSets())[0].startswith("evaluation: none")


def test_the_rate_is_the_largest_model_at_its_largest_batch():
    report = {"device": "GPU X", "models": ["small", "big"], "results": {
        "rollout_tokens_per_s_small_b256": 900.0, "rollout_tokens_per_s_big_b64": 100.0,
        "rollout_tokens_per_s_big_b256": 300.0, "rollout_tokens_per_s_big_b512": None}}
    rate, basis = ep.measured_rate(report)
    assert rate == 300.0 and "GPU X (big's shape, batch 256" in basis
    committed = json.loads((REPO_ROOT / ep.GPU_CHECK).read_text())
    assert ep.measured_rate(committed)[0] == committed["results"]["rollout_tokens_per_s_qwen2.5-1.5b_b256"]


def test_the_documented_command_leaves_docs_configs_md_as_it_is(tmp_path):
    """The cost block of docs/configs.md is what the command renders from the configs and the GPU check's JSON."""
    doc = (REPO_ROOT / "docs" / "configs.md").read_text()
    copy = tmp_path / "configs.md"
    copy.write_text(doc.replace("| 72,713 |", "| 1 |"))
    assert ep.main(["--doc", str(copy)]) == 0
    assert copy.read_text() == doc, "run: python -m searchr1_lld.preflight.eval_plan --doc docs/configs.md"
    assert "| 72,713 |" in doc and "| 1,085,973 |" in doc
