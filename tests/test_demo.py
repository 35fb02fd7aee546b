"""The demo: its before/after example, the choice of its settings on validation (step 0 a candidate), the claim and
the intervals, its result line (pure), and the recipe end to end on the test world."""

import json

import pytest

from searchr1_lab.demo import command as demo
from searchr1_lab.demo import report as demo_report


def _rec(rid, em, hops, pred="x"):
    return {"id": rid, "em": em, "hops": hops, "question": f"q {rid}?", "golden_answers": ["g"], "queries": ["s"],
            "prediction": pred, "response_text": "<think> look it up </think>\n<search> s </search>" * 30}


def test_pick_example_prefers_a_multi_hop_win():
    before = {"a": _rec("a", 0.0, 1), "b": _rec("b", 0.0, 2), "c": _rec("c", 1.0, 2), "d": _rec("d", 0.0, 2)}
    after = {"a": _rec("a", 1.0, 1), "b": _rec("b", 0.0, 2), "c": _rec("c", 1.0, 2), "d": _rec("d", 1.0, 2)}
    assert demo_report.pick_example(before, after) == "d"  # the only multi-hop question won by training
    del after["d"]
    assert demo_report.pick_example(before, after) == "a"  # else any win
    assert demo_report.pick_example(before, {"a": _rec("a", 0.0, 1)}) is None  # no win: nothing to show


def test_pick_example_prefers_a_multi_hop_win_that_searched_each_hop():
    """A multi-hop question answered right after a single search is a guess: the example is one that searched
    twice, when there is one."""
    before = {k: _rec(k, 0.0, 2) for k in "abc"}
    after = {k: _rec(k, 1.0, 2) for k in "abc"}
    after["c"]["queries"] = ["s", "bridge"]
    assert demo_report.pick_example(before, after) == "c"
    after["b"]["queries"] = ["s", "bridge"]
    before["c"]["queries"] = ["s", "bridge"]  # the warm start made the second search on c already
    assert demo_report.pick_example(before, after) == "b"  # the second search the trained policy learned
    after["b"]["queries"] = after["c"]["queries"] = ["s"]
    assert demo_report.pick_example(before, after) == "a"  # none searched twice: the first multi-hop win


def test_format_example_shows_both_trajectories_cut_to_width():
    text = demo_report.format_example("a", _rec("a", 0.0, 1, pred="1790"), _rec("a", 1.0, 1, pred="1834"), width=50)
    assert "q a?" in text and "'1790'" in text and "'1834'" in text
    assert text.count(" ...") == 2  # both long responses cut
    assert text.splitlines()[1].startswith("--- warm start (EM 0") and "--- trained (EM 1" in text


def test_format_example_keeps_every_search_and_the_answer_of_a_two_hop_trajectory():
    """The example's point is the second search: the observations are cut to their first document, the model's own
    text is kept whole (cut at 600 characters it ended before the second search)."""
    docs = "\n".join(f'Doc {i}(Title: "Brosi {t}") Brosi {t} is a company founded in 1964 by Dith Drendsound. Its '
                     f"headquarters are in Braendbrond." for i, t in ((1, "Holdings"), (2, "Foundry"), (3, "Works")))
    response = ("<think> look it up </think>\n<search> Brosi Holdings </search>\n\n<information>" + docs
                + "</information>\n\n<think> founded by Dith Drendsound </think>\n<search> Dith Drendsound </search>"
                + "\n\n<information>" + docs + "</information>\n\n<answer> Thobro </answer>")
    trained = {**_rec("a", 1.0, 2, pred="Thobro"), "response_text": response}
    text = demo_report.format_example("a", _rec("a", 0.0, 2), trained)
    shown = text.split("--- trained", 1)[1]
    assert "<search> Dith Drendsound </search>" in shown and "<answer> Thobro </answer>" in shown
    assert shown.count("Doc 1(") == 2 and "Doc 2(" not in shown and shown.count(" ...</information>") == 2


def _selection(tmp_path, curves, warm_em=0.30, world_hash="h", warm_hash=None):
    """Hand-made selection results in ``tmp_path``: one run per (lr, curve), the warm start's validation EM."""
    from searchr1_lab.demo.selection import selection_file, warm_start_file

    for lr, curve in curves:
        selection_file(tmp_path, lr).write_text(json.dumps({"lr": lr, "seed": 0, "steps": 10, "eval_every": 5,
                                                            "world_hash": world_hash, "val_curve": curve}))
    warm_start_file(tmp_path).write_text(json.dumps({"val_em": warm_em, "world_hash": warm_hash or world_hash,
                                                     "correct": {}}))


def test_choose_takes_the_best_validation_step_over_the_selection_runs(tmp_path):
    from searchr1_lab.demo.selection import choose, selection_overrides

    assert choose(tmp_path) is None
    _selection(tmp_path, ((5e-4, [[5, 0.30], [10, 0.42]]), (1e-3, [[5, 0.42], [10, 0.40]]), (2e-3, [[5, 0.10]])))
    chosen = choose(tmp_path)
    assert (chosen["lr"], chosen["steps"], chosen["val_em"]) == (1e-3, 5, 0.42)  # a tie: fewer steps first
    assert len(chosen["candidates"]) == 6 and "0.0005, 0.001, 0.002" in chosen["procedure"]
    assert chosen["candidates"][0] == {"lr": None, "steps": 0, "val_em": 0.30}  # the warm start is a candidate
    assert selection_overrides(chosen)[-2:] == ["trainer.lr=0.001", "trainer.total_steps=5"]


def test_the_warm_start_is_chosen_when_no_step_beats_it(tmp_path):
    from searchr1_lab.demo.selection import choose, selection_overrides

    _selection(tmp_path, ((5e-4, [[5, 0.30], [10, 0.28]]), (1e-3, [[5, 0.12]])), warm_em=0.30)
    chosen = choose(tmp_path)
    assert (chosen["lr"], chosen["steps"]) == (None, 0)  # a tie with step 5: fewer steps, nothing trained
    assert selection_overrides(chosen) == []


def test_the_selection_refuses_a_missing_warm_start_or_mixed_worlds(tmp_path):
    from searchr1_lab.demo.selection import choose, warm_start_file

    _selection(tmp_path, ((5e-4, [[5, 0.30]]),), world_hash="other", warm_hash="h")
    with pytest.raises(ValueError, match="different worlds"):
        choose(tmp_path)
    warm_start_file(tmp_path).unlink()
    with pytest.raises(ValueError, match="step 0"):
        choose(tmp_path)


QUESTIONS = [{"id": f"q{k}", "hops": 1 + k % 2, "subject": f"s{k // 2}", "train_answer": k < 2} for k in range(8)]


def _summary(gain_lo: float = 0.05, steps: int = 25, seed: int = 0) -> dict:
    from searchr1_lab.demo.report import em_intervals, gain_intervals, question_slices

    before = {q["id"]: int(q["id"] in ("q0", "q2")) for q in QUESTIONS}
    after = {q["id"]: int(q["id"] in ("q0", "q1", "q2", "q3", "q5")) for q in QUESTIONS}
    none = {q["id"]: 0 for q in QUESTIONS}
    em = {k: em_intervals(c, QUESTIONS) for k, c in (("majority", none), ("warm_start_no_retrieval", none),
                                                      ("warm_start", before), ("trained", after))}
    val_gain = {"all": {"mean": 0.2, "lo": gain_lo, "hi": 0.4}}
    return {"test_em": em, "test_gain": gain_intervals(before, after, QUESTIONS), "seed": seed,
            "slice_n": {k: len(v) for k, v in question_slices(QUESTIONS).items()}, "test_subjects": 4,
            "machine": "AMD EPYC 7B13, 2 cores", "selection": {"lr": 1e-3, "steps": steps},
            "validation": {"gain": val_gain, "claimed": {"all": gain_lo > 0}}}


def test_slices_intervals_and_the_claim_by_hand():
    from searchr1_lab.demo.report import claimed, em_intervals, gain_intervals, question_slices

    slices = question_slices(QUESTIONS)
    assert slices["1-hop"] == ["q0", "q2", "q4", "q6"] and slices["not_guessable"] == [f"q{k}" for k in range(2, 8)]
    before = {q["id"]: 0 for q in QUESTIONS}
    after = {q["id"]: int(q["hops"] == 2) for q in QUESTIONS}  # every two-hop question won, no single-hop one
    gain = gain_intervals(before, after, QUESTIONS)
    assert gain["2-hop"] == {**gain["2-hop"], "mean": 1.0, "lo": 1.0, "hi": 1.0, "clusters": 4}
    assert gain["1-hop"]["mean"] == 0.0 and gain["all"]["mean"] == 0.5
    assert claimed(gain) == {"all": True, "not_guessable": True, "1-hop": False, "2-hop": True}
    assert em_intervals(after, QUESTIONS)["all"]["questions"] == 8


def test_readme_line_and_table_show_the_baselines_intervals_and_the_claim():
    from searchr1_lab.demo.report import em_table, readme_line

    s = _summary()
    line = readme_line(s)
    assert line.startswith("Demo result: test EM 0.25 -> 0.62, gain 0.38 [")
    assert "two-hop (4) 0.00 -> 0.75, gain 0.75 [" in line and "majority-answer baseline 0.00" in line
    assert "; single-hop (4) 0.50 -> 0.50, gain 0.00 [" in line  # the cost (or not) on what the warm start could do
    assert "8 test questions over 4 subjects, 95 % paired bootstrap over subjects" in line
    assert "lr 0.001 and 25 steps chosen on validation, where the gain is claimed: on validation it is 0.20 [0.05, " \
           "0.40], above 0" in line
    assert "no gain is claimed: on validation it is 0.20 [-0.10, 0.40], which does not exclude 0" in \
           readme_line(_summary(gain_lo=-0.1))
    assert "the warm start (step 0) chosen on validation: nothing trained" in readme_line(_summary(steps=0))
    table = em_table(s["test_em"], s["test_gain"], s["slice_n"], "test")
    assert "| test EM [95 % CI] | all (8) | not guessable (6) | 1-hop (4) | 2-hop (4) |" in table
    assert "| majority training answer per question type | 0.00 [0.00, 0.00] |" in table
    assert "| gain: trained - warm start | 0.38 [" in table


def test_the_result_figure_draws_the_test_em_by_hop_with_intervals(tmp_path):
    import matplotlib.image

    s = _summary()
    rows = demo_report.figure_rows(s)
    assert [(r["slice"], r["questions"]) for r in rows] == [("single-hop", 4), ("two-hop", 4), ("all", 8)]
    assert (rows[1]["warm_start"]["mean"], rows[1]["trained"]["mean"]) == (0.0, 0.75)
    assert rows[2]["trained"] == {k: s["test_em"]["trained"]["all"][k] for k in ("mean", "lo", "hi")}
    path = demo_report.write_figure(s, tmp_path / "a" / demo_report.RESULT_FIGURE)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and demo_report.read_figure_rows(path) == rows
    s["test_em"]["trained"]["2-hop"] = {"mean": 0.25, "lo": 0.0, "hi": 0.5}  # other numbers, another picture
    other = demo_report.write_figure(s, tmp_path / "b.png")
    assert demo_report.read_figure_rows(other)[1]["trained"]["mean"] == 0.25
    assert (matplotlib.image.imread(path) != matplotlib.image.imread(other)).any()


def test_the_report_shows_its_figure(tmp_path):
    s = {**_summary(), "steps": 25, "method": "grpo+llds", "torch": "2", "world_config_hash": "h",
         "time_s": {"world": 1, "training": 2, "eval": 3}}
    s["selection"] = {**s["selection"], "val_em": 0.5, "procedure": "p", "candidates": []}
    s["validation"] = {**s["validation"], "questions": 8, "subjects": 4, "slice_n": s["slice_n"],
                       "em": s["test_em"], "gain": s["test_gain"]}
    demo_report.write_report(tmp_path, s, "table", "example", "`python -m searchr1_lab.demo --report x`")
    assert f"]({demo_report.RESULT_FIGURE})" in (tmp_path / "README.md").read_text()
    assert demo_report.read_figure_rows(tmp_path / demo_report.RESULT_FIGURE) == demo_report.figure_rows(s)


def test_seeds_summary_reports_every_seed_and_the_spread(tmp_path):
    from searchr1_lab.demo.report import seeds_summary, write_seeds_report

    seeds = seeds_summary([_summary(seed=0), _summary(seed=1, gain_lo=-0.1)])
    assert [(r["seed"], r["claimed"]) for r in seeds["seeds"]] == [(0, True), (1, False)]
    assert seeds["spread"]["gain_all"]["min"] == seeds["spread"]["gain_all"]["max"] == 0.375
    assert seeds["spread"]["gain_2-hop"]["std"] == 0.0
    write_seeds_report(tmp_path, seeds, "python -m searchr1_lab.demo --seeds 0,1 --report docs/demo/seeds")
    text = (tmp_path / "README.md").read_text()
    assert "| 0 | 0.25 | 0.62 | 0.38 [" in text and "[seed1](seed1/README.md)" in text
    assert "| single-hop gain [95 % CI] |" in text and seeds["spread"]["gain_1-hop"]["mean"] == 0.0
    assert json.loads((tmp_path / "seeds.json").read_text()) == seeds


def test_replace_readme_line_swaps_the_one_demo_line():
    from searchr1_lab.demo.report import replace_readme_line

    assert replace_readme_line("a\nDemo result: old\nb", "Demo result: new") == "a\nDemo result: new\nb"
    with pytest.raises(ValueError):
        replace_readme_line("no line", "Demo result: new")


def test_the_report_names_its_dir_relative_to_the_repository(tmp_path):
    from searchr1_lab.demo.report import repo_relative
    from searchr1_lab.methods import REPO_ROOT as REPO

    assert repo_relative(REPO / "docs" / "demo") == "docs/demo"
    assert repo_relative(tmp_path) == str(tmp_path.resolve())
def test_the_report_says_how_the_world_came_to_be():
    assert demo_report._world_how({"world_reused": True, "world_policy_shipped": None}) == " (built earlier, reused)"
    assert demo_report._world_how({"world_reused": False, "world_policy_shipped": "assets/warm-start"}) \
        == " (its policy the warm start shipped in assets/warm-start)"
    assert demo_report._world_how({"world_reused": False}) == ""  # trained by its build (or an older summary)


def test_the_report_names_the_command_that_made_it():
    from searchr1_lab.methods import REPO_ROOT

    parse = demo._parser().parse_args
    assert demo.command_line(parse(["--report", str(REPO_ROOT / "docs" / "demo"), "--readme", "README.md"])) \
        == "python -m searchr1_lab.demo --report docs/demo --readme README.md"
    args = parse(["--world", "configs/world/balanced-seed1.yaml", "--world-dir", ".cache/w1", "--select-dir",
                  str(REPO_ROOT / "docs" / "x" / "select"), "--seeds", "0,1", "--report", "docs/x", "--readme",
                  "README.md", "trainer.kl_coef=0"])
    assert demo.command_line(args) == ("python -m searchr1_lab.demo --world configs/world/balanced-seed1.yaml "
                                       "--world-dir .cache/w1 --select-dir docs/x/select --seeds 0,1 --report docs/x "
                                       "trainer.kl_coef=0")  # --readme only without --seeds


TOY_TRAINING = ["trainer.train_batch_size=2", "rollout.n=2", "trainer.ppo_mini_batch_size=2", "rollout.max_turns=2",
                "rollout.max_tokens_per_turn=24", "rollout.max_obs_length=60", "trainer.micro_batch_token_budget=1000",
                "trainer.probe_size=2", "logging.progress_bar=false"]


@pytest.mark.slow
def test_the_recipe_trains_claims_on_validation_and_tests_once_on_the_test_world(tmp_path, tiny_world):
    """``python -m searchr1_lab.demo --seeds 1 --report DIR`` on the test world with a hand-made selection whose
    best candidate is one step at lr 1e-3 (so the training path runs): the seed's report, its validation claim,
    every test figure with an interval over the world's subjects, and the seeds' report."""
    import dataclasses

    import yaml

    from conftest import TEST_WORLD_CONFIG
    from searchr1_lld.world import read_card

    world_yaml = tmp_path / "world.yaml"
    world_yaml.write_text(yaml.safe_dump(dataclasses.asdict(TEST_WORLD_CONFIG), sort_keys=False))
    select = tmp_path / "select"
    select.mkdir()
    _selection(select, ((1e-3, [[1, 0.5]]),), warm_em=0.0, world_hash=read_card(tiny_world)["config_hash"])
    report = tmp_path / "seeds"
    rc = demo.main(["--world", str(world_yaml), "--world-dir", str(tiny_world), "--select-dir", str(select),
                    "--seeds", "1", "--report", str(report), *TOY_TRAINING, f"trainer.output_dir={tmp_path / 'runs'}"])
    assert rc == 0
    s = json.loads((report / "seed1" / "summary.json").read_text())
    assert (s["seed"], s["steps"], s["selection"]["lr"], s["selection"]["steps"]) == (1, 1, 1e-3, 1)
    assert set(s["test_em"]) == {"majority", "warm_start_no_retrieval", "warm_start", "trained"}
    assert s["slice_n"]["all"] == 24 and s["slice_n"]["1-hop"] + s["slice_n"]["2-hop"] == 24
    assert s["test_gain"]["all"]["clusters"] == s["test_subjects"] < 24  # subjects, fewer than questions
    assert s["validation"]["questions"] == 24
    # the run's own training seconds (its one step), within the call's, which also loads and saves
    assert 0 < s["time_s"]["training"] <= s["time_s"]["train_call"]
    assert s["validation"]["claimed"]["all"] == (s["validation"]["gain"]["all"]["lo"] > 0)
    assert "## The claim (validation split)" in (report / "seed1" / "README.md").read_text()
    figure = demo_report.RESULT_FIGURE  # drawn from the seed's numbers, in its report and in the run's demo-eval/
    assert demo_report.read_figure_rows(report / "seed1" / figure) == json.loads(json.dumps(demo_report.figure_rows(s)))
    (drawn,) = (tmp_path / "runs").glob(f"*/demo-eval/{figure}")
    assert demo_report.read_figure_rows(drawn) == demo_report.read_figure_rows(report / "seed1" / figure)
    seeds = json.loads((report / "seeds.json").read_text())
    assert [r["seed"] for r in seeds["seeds"]] == [1]
    rel = demo_report.repo_relative
    assert f"python -m searchr1_lab.demo --world {rel(world_yaml)} --world-dir {rel(tiny_world)} --select-dir " \
        f"{rel(select)} --seeds 1 --report {rel(report)} " in (report / "README.md").read_text()  # the world named


@pytest.mark.parametrize("progress_bar", [True, False])
def test_the_demo_evaluation_shows_the_evaluators_progress(tiny_world, tmp_path, capfd, progress_bar):
    """Step 3's eval.py runs show their bars (the config's logging.progress_bar), not minutes of silence."""
    from conftest import REPO_ROOT, world_args
    from searchr1_lld.config import load_config
    from searchr1_lld.config.loading import save_config

    cfg_file = tmp_path / "config.yaml"
    save_config(load_config(str(REPO_ROOT / "configs" / "tiny.yaml"),
                            world_args(tiny_world) + [f"logging.progress_bar={str(progress_bar).lower()}"]), cfg_file)
    traj = demo._evaluate(cfg_file, tiny_world, "val", {"warm_start": tiny_world / "model"}, tmp_path / "val", limit=2)
    assert len(traj["warm_start"]) == 2
    assert ("eval synthetic: 100%" in capfd.readouterr().err) == progress_bar


def test_the_time_line_gives_the_runs_own_training_time():
    """A summary keeps the run's own training seconds (``training``, every pass) and the call's (``train_call``):
    a call that loads a run finished earlier takes seconds, which is not the training's time. An older summary
    kept the call's time only, and the line says so."""
    s = {"world_config_hash": "h", "world_reused": True,
         "time_s": {"world": 0, "training": 50, "train_call": 4, "eval": 80}}
    assert demo_report.timing_line(s) == ("- wall time: world 0 s (built earlier, reused), training 50 s (the run's "
                                          "own steps; this call 4 s), evaluation 80 s; world config hash h")
    old = {**s, "time_s": {"world": 0, "training": 4, "eval": 80}}
    assert "the call that trained or loaded the run 4 s (the run's own training time was not recorded)" in (
        demo_report.timing_line(old))


def test_every_committed_demo_report_states_its_summarys_times():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "docs"
    reports = [p for p in sorted(root.rglob("summary.json")) if "time_s" in json.loads(p.read_text())]
    assert len(reports) >= 7  # docs/demo, its 3 seeds, and the 3 seeds of world seed 1
    for path in reports:
        lines = (path.parent / "README.md").read_text().splitlines()
        assert demo_report.timing_line(json.loads(path.read_text())) in lines, path
