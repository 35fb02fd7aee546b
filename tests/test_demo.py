"""The demo's before/after example: which test question it shows and how it prints it (pure, no training)."""

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
