"""The demo: its before/after example, the choice of its settings on validation, its result line (pure, no training)."""

import json

from searchr1_lld import demo


def _rec(rid, em, hops, pred="x"):
    return {"id": rid, "em": em, "hops": hops, "question": f"q {rid}?", "golden_answers": ["g"], "queries": ["s"],
            "prediction": pred, "response_text": "<think> look it up </think>\n<search> s </search>" * 30}


def test_pick_example_prefers_a_multi_hop_win():
    before = {"a": _rec("a", 0.0, 1), "b": _rec("b", 0.0, 2), "c": _rec("c", 1.0, 2), "d": _rec("d", 0.0, 2)}
    after = {"a": _rec("a", 1.0, 1), "b": _rec("b", 0.0, 2), "c": _rec("c", 1.0, 2), "d": _rec("d", 1.0, 2)}
    assert demo.pick_example(before, after) == "d"  # the only multi-hop question won by training
    del after["d"]
    assert demo.pick_example(before, after) == "a"  # else any win
    assert demo.pick_example(before, {"a": _rec("a", 0.0, 1)}) is None  # no win: nothing to show


def test_pick_example_prefers_a_multi_hop_win_that_searched_each_hop():
    """A multi-hop question answered right after a single search is a guess: the example is one that searched
    twice, when there is one."""
    before = {k: _rec(k, 0.0, 2) for k in "abc"}
    after = {k: _rec(k, 1.0, 2) for k in "abc"}
    after["c"]["queries"] = ["s", "bridge"]
    assert demo.pick_example(before, after) == "c"
    after["c"]["queries"] = ["s"]
    assert demo.pick_example(before, after) == "a"  # none searched twice: the first multi-hop win


def test_format_example_shows_both_trajectories_cut_to_width():
    text = demo.format_example("a", _rec("a", 0.0, 1, pred="1790"), _rec("a", 1.0, 1, pred="1834"), width=50)
    assert "q a?" in text and "'1790'" in text and "'1834'" in text
    assert text.count(" ...") == 2  # both long responses cut
    assert text.splitlines()[1].startswith("--- warm start (EM 0") and "--- trained (EM 1" in text


def test_choose_takes_the_best_validation_step_over_the_selection_runs(tmp_path):
    from searchr1_lld.demo import choose, selection_file, selection_overrides

    assert choose(tmp_path) is None
    for lr, curve in ((5e-4, [[5, 0.30], [10, 0.42]]), (1e-3, [[5, 0.42], [10, 0.40]]), (2e-3, [[5, 0.10]])):
        selection_file(tmp_path, lr).write_text(json.dumps({"lr": lr, "seed": 0, "steps": 10, "eval_every": 5,
                                                            "val_curve": curve}))
    chosen = choose(tmp_path)
    assert (chosen["lr"], chosen["steps"], chosen["val_em"]) == (1e-3, 5, 0.42)  # a tie: fewer steps first
    assert len(chosen["candidates"]) == 5 and "0.0005, 0.001, 0.002" in chosen["procedure"]
    assert selection_overrides(chosen)[-2:] == ["trainer.lr=0.001", "trainer.total_steps=5"]


def test_readme_line_and_table_show_the_baselines_and_the_slice():
    from searchr1_lld.demo import readme_line, slice_table

    em = {k: {"all": a, "not_guessable": g, "1-hop": a, "2-hop": a} for k, a, g in
          (("majority", 0.16, 0.0), ("warm_start_no_retrieval", 0.05, 0.0), ("warm_start", 0.3, 0.2),
           ("trained", 0.5, 0.41))}
    summary = {"test_em": em, "seed": 0, "machine": "AMD EPYC 7B13, 2 cores",
               "selection": {"lr": 1e-3, "steps": 25}, "test_questions": 100}
    # 2 x sqrt(0.3 x 0.7 / 100) = 0.092
    assert readme_line(summary) == (
        "Demo result: test EM 0.30 -> 0.50, not-guessable slice 0.20 -> 0.41, majority-answer baseline 0.16 (seed 0, "
        "lr 0.001 and 25 steps chosen on validation, 2-core AMD EPYC 7B13); the change, +0.20, is beyond ±0.09, two "
        "binomial standard errors of one run's EM on 100 questions")
    em["trained"]["all"] = 0.25
    assert "the change, -0.05, is within ±0.09" in readme_line(summary)
    table = slice_table(em, {"all": 100, "not_guessable": 44})
    assert "| test EM | all (100) | not guessable (44) | 1-hop | 2-hop |" in table
    assert "| majority training answer per question type | 0.16 | 0.00 | 0.16 | 0.16 |" in table


def test_replace_readme_line_swaps_the_one_demo_line():
    import pytest

    from searchr1_lld.demo import replace_readme_line

    assert replace_readme_line("a\nDemo result: old\nb", "Demo result: new") == "a\nDemo result: new\nb"
    with pytest.raises(ValueError):
        replace_readme_line("no line", "Demo result: new")


def test_the_report_names_its_dir_relative_to_the_repository(tmp_path):
    from searchr1_lld.demo import REPO, repo_relative

    assert repo_relative(REPO / "docs" / "demo") == "docs/demo"
    assert repo_relative(tmp_path) == str(tmp_path.resolve())
