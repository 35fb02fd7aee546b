"""The synthetic world: determinism, answerability, real multi-hop structure, no entity leakage, files on disk."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from searchr1_lld.world.build import ensure_world, parse_world_overrides, read_card, warm_start_shortfalls, world_config_hash
from searchr1_lld.world.generate import generate_world, name_word_groups, passage_kind
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.config import ConfigError
from searchr1_lld.world.config import WorldConfig
from searchr1_lld.rewards import normalize_answer

DEFAULT = WorldConfig()


def _norm_in(answer: str, text: str) -> bool:
    return f" {normalize_answer(answer)} " in f" {normalize_answer(text)} "


def _title(contents: str) -> str:
    return contents.split("\n", 1)[0].strip('"')


@pytest.fixture(scope="module")
def world():
    return generate_world(DEFAULT)


def test_deterministic_for_a_seed() -> None:
    a, b = generate_world(DEFAULT), generate_world(DEFAULT)
    assert a.passages == b.passages and a.train_rows == b.train_rows and a.test_rows == b.test_rows
    c = generate_world(dataclasses.replace(DEFAULT, seed=1))
    assert c.passages != a.passages


def test_sizes_follow_the_config(world) -> None:
    counts = world.counts()
    assert (counts["people"], counts["cities"], counts["companies"], counts["rivers"]) == (300, 150, 280, 8)
    assert counts["distractor_passages"] == 300 + 150 + 280  # one per person, city, company
    assert (counts["train_questions"], counts["val_questions"], counts["test_questions"]) == (400, 400, 400)
    assert counts["train_multi_hop"] == counts["val_multi_hop"] == counts["test_multi_hop"] == 200


def test_corpus_format(world) -> None:
    ids = [p["id"] for p in world.passages]
    assert len(set(ids)) == len(ids)
    titles = [_title(p["contents"]) for p in world.passages]
    assert len(set(titles)) == len(titles), "two passages share a title"
    for p in world.passages:
        assert p["contents"].startswith('"') and '"\n' in p["contents"]


def test_row_schema(world) -> None:
    for r in world.train_rows + world.test_rows:
        assert set(r) == {"id", "question", "golden_answers", "data_source", "metadata"}
        assert r["question"].endswith("?") and r["golden_answers"] and r["data_source"] == "synthetic"
        assert r["metadata"]["hops"] in (1, 2) and len(r["metadata"]["support_ids"]) == r["metadata"]["hops"]
    assert len({r["id"] for r in world.train_rows + world.test_rows}) == 800


def test_every_answer_is_stated_by_its_support_passage(world) -> None:
    for r in world.train_rows + world.test_rows:
        last = world.passage(r["metadata"]["support_ids"][-1])["contents"]
        assert any(_norm_in(g, last) for g in r["golden_answers"]), (r, last)
        assert _norm_in(r["metadata"]["subject"], world.passage(r["metadata"]["support_ids"][0])["contents"])


def test_multi_hop_questions_need_two_passages(world) -> None:
    multi = [r for r in world.train_rows + world.test_rows if r["metadata"]["hops"] == 2]
    assert multi
    for r in multi:
        first_id, second_id = r["metadata"]["support_ids"]
        first, second = world.passage(first_id)["contents"], world.passage(second_id)["contents"]
        bridge, subject = r["metadata"]["bridge"], r["metadata"]["subject"]
        assert first_id != second_id
        assert not any(_norm_in(g, first) for g in r["golden_answers"]), "answerable from the first passage alone"
        assert _norm_in(bridge, first) and _title(second) == bridge  # the first passage leads to the second
        assert not _norm_in(subject, second), "the second passage alone would identify the subject"
        assert not _norm_in(bridge, r["question"]), "the question must not give the bridge away"


def test_no_entity_leakage_into_test(world) -> None:
    train_subjects = {r["metadata"]["subject"] for r in world.train_rows}
    train_bridges = {r["metadata"]["bridge"] for r in world.train_rows} - {""}
    for r in world.test_rows:
        assert r["metadata"]["subject"] not in train_subjects
        # a test question's bridge fact is never the target of a training question
        assert r["metadata"]["bridge"] not in train_subjects | train_bridges
    train_q = {r["question"] for r in world.train_rows}
    assert not train_q & {r["question"] for r in world.test_rows}


def test_train_val_and_test_share_no_subject_bridge_or_support_passage(world) -> None:
    splits = {"train": world.train_rows, "val": world.val_rows, "test": world.test_rows}
    assert all(splits.values())

    def entities(rows):
        return {r["metadata"]["subject"] for r in rows} | {r["metadata"]["bridge"] for r in rows} - {""}

    def support(rows):
        return {d for r in rows for d in r["metadata"]["support_ids"]}

    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not entities(splits[a]) & entities(splits[b]), (a, b)
        assert not support(splits[a]) & support(splits[b]), (a, b)
        assert not {r["question"] for r in splits[a]} & {r["question"] for r in splits[b]}, (a, b)


def test_held_out_splits_ask_one_question_per_fact(world) -> None:
    """Validation and test hold 400 questions each, no two asking the same fact (``metadata["fact"]``: the entity
    that holds the answer and the attribute), within a split or across splits; every row names its cluster (the
    subject) and its hop count."""
    from searchr1_lld.world.questions import FACT_ATTRIBUTE

    facts = {}
    for split in ("val", "test"):
        rows = getattr(world, f"{split}_rows")
        assert len(rows) >= 400
        facts[split] = [r["metadata"]["fact"] for r in rows]
        assert len(set(facts[split])) == len(rows), split
        for r in rows:
            meta = r["metadata"]
            holder = meta["bridge"] if meta["hops"] == 2 else meta["subject"]
            assert meta["fact"] == f"{holder}|{FACT_ATTRIBUTE[meta['family']]}"
            assert meta["subject"] and meta["hops"] in (1, 2)
    train_facts = {r["metadata"]["fact"] for r in world.train_rows}
    assert not set(facts["val"]) & set(facts["test"]) and not train_facts & (set(facts["val"]) | set(facts["test"]))


def test_a_founder_question_and_the_founder_s_own_question_are_one_fact() -> None:
    """"When was the founder of X born?" asks what "When was <X's founder> born?" asks: the same fact, so a held-out
    split never holds both, while the two multi-hop families of one founder are two facts."""
    from searchr1_lld.world.generate import Company, Person
    from searchr1_lld.world.questions import candidates

    person = Person("Ash Bren", 1850, "Mora", "poet", "val")
    company = Company("Velm Works", "Ash Bren", 1890, "Mora", "textile", "val")
    parts = {"people": [person], "cities": [], "companies": [company], "doc_id_of": {"Ash Bren": "0", "Velm Works": "1"}}
    parts["cities"] = [type("C", (), {"name": "Mora", "river": "Sel River", "founded_year": 1200, "split": "val"})()]
    parts["doc_id_of"]["Mora"] = "2"
    single, multi = candidates(parts, "val", ("founder_birth_year", "founder_birth_city"))
    fact_of = {q["family"]: q["fact"] for q in single + multi}
    assert fact_of["founder_birth_year"] == fact_of["person_birth_year"] == "Ash Bren|birth_year"
    assert fact_of["founder_birth_city"] == fact_of["person_birth_city"] != fact_of["founder_birth_year"]


def test_the_test_questions_follow_their_own_seed(world) -> None:
    """The test split's questions are drawn with ``test_seed``: another test seed draws other test questions and
    leaves the training and validation questions as they are."""
    other = generate_world(dataclasses.replace(DEFAULT, test_seed=DEFAULT.test_seed + 1))
    assert other.train_rows == world.train_rows and other.val_rows == world.val_rows
    assert [r["metadata"]["fact"] for r in other.test_rows] != [r["metadata"]["fact"] for r in world.test_rows]
    assert {r["metadata"]["subject"] for r in other.test_rows} <= {p.name for p in world.people + world.companies
                                                                   if p.split == "test"} | {
        c.name for c in world.cities if c.split == "test"}


def test_held_out_rows_say_whether_their_answer_is_a_training_answer(world) -> None:
    from searchr1_lld.rewards import normalize_answer
    from searchr1_lld.world.splits import guessable

    train_answers = {normalize_answer(g) for r in world.train_rows for g in r["golden_answers"]}
    for r in world.val_rows + world.test_rows:
        assert guessable(r) == any(normalize_answer(g) in train_answers for g in r["golden_answers"])
    flags = [guessable(r) for r in world.test_rows]
    assert any(flags) and not all(flags)  # both slices exist in the test world


def test_distractors_have_similar_names(world) -> None:
    real = [p for p in world.people if p.split != "distractor"]
    fake = [p for p in world.people if p.split == "distractor"]
    for p in real:
        first, last = p.name.split(" ", 1)
        assert any(f.name.startswith(first + " ") or f.name.endswith(" " + last) for f in fake), p.name
    assert not {p.name for p in real} & {f.name for f in fake}


def test_name_words_are_grouped_by_the_role_they_play(world) -> None:
    """Every passage's kind is read back from its text, and every title word lands in the group of its entity's
    role (what the warm start's renaming keeps apart)."""
    kinds = {_title(p["contents"]): passage_kind(p["contents"]) for p in world.passages}
    assert {n: kinds[n] for n in (world.people[0].name, world.cities[0].name, world.companies[0].name,
                                  world.rivers[0].name)} == {world.people[0].name: "person",
                                                             world.cities[0].name: "city",
                                                             world.companies[0].name: "company",
                                                             world.rivers[0].name: "river"}
    groups = name_word_groups(world.passages)
    expected = {"person_first": {p.name.split()[0] for p in world.people},
                "person_last": {p.name.split()[1] for p in world.people},
                "city": {c.name for c in world.cities},
                "company": {c.name.split()[0] for c in world.companies},
                "river": {r.name.split()[0] for r in world.rivers}}
    assert {k: set(v) for k, v in groups.items()} == expected
    assert sum(len(v) for v in groups.values()) == len(set().union(*expected.values()))  # roles are disjoint
    with pytest.raises(ValueError, match="not a passage of this world"):
        passage_kind('"Paris"\nParis is the capital of France.')


def test_impossible_sizes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="num_people"):
        generate_world(dataclasses.replace(DEFAULT, num_people=1))
    with pytest.raises(ValueError, match="distinct questions"):
        generate_world(dataclasses.replace(DEFAULT, num_train_questions=100_000))
    with pytest.raises(ValueError, match="one per fact.*num_val_questions"):
        generate_world(dataclasses.replace(DEFAULT, num_val_questions=2_000))


def test_overrides_parse_and_hash() -> None:
    cfg = parse_world_overrides(["num_people=80", "world.seed=3", "retriever=bm25"])
    assert (cfg.num_people, cfg.seed, cfg.retriever) == (80, 3, "bm25")
    assert world_config_hash(cfg) != world_config_hash(DEFAULT)
    assert world_config_hash(dataclasses.replace(DEFAULT)) == world_config_hash(DEFAULT)
    with pytest.raises(ConfigError, match="unknown key world.nope"):
        parse_world_overrides(["nope=1"])
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_world_overrides(["num_people=many"])


def test_a_world_config_loads_from_a_cards_values_with_overrides() -> None:
    """A built world's ``world.json`` config (every field, lists included) reloads to the same config, overrides on
    top; a YAML and values together are refused."""
    from searchr1_lld.world import load_world_config

    built = dataclasses.replace(DEFAULT, num_people=80, multi_hop_families=["hq_river"], warmstart_repeat_steps=5)
    values = json.loads(json.dumps(dataclasses.asdict(built)))  # as a card stores it
    assert load_world_config(values=values) == built
    assert load_world_config(overrides=["seed=3"], values=values) == dataclasses.replace(built, seed=3)
    with pytest.raises(ValueError, match="not both"):
        load_world_config("configs/world/default.yaml", values=values)


def test_an_option_that_is_off_leaves_the_hash_of_the_worlds_built_before_it() -> None:
    """Off (its switch at its off value), an option's fields are not hashed: a world built before the option existed
    keeps its identity, whatever the option's other fields say; on, every field of it counts."""
    import hashlib
    import json

    from searchr1_lld.world.config import HASH_OMITTED_WHEN_OFF, RECIPE_VERSION

    values = dataclasses.asdict(DEFAULT)
    for _, fields in HASH_OMITTED_WHEN_OFF.values():
        for key in fields:
            del values[key]
    before = hashlib.sha256(json.dumps({"recipe_version": RECIPE_VERSION, **values}, sort_keys=True).encode())
    assert world_config_hash(DEFAULT) == before.hexdigest()[:12]
    assert world_config_hash(dataclasses.replace(DEFAULT, warmstart_repeat_length=7)) == world_config_hash(DEFAULT)
    on = dataclasses.replace(DEFAULT, warmstart_repeat_steps=100)
    assert world_config_hash(on) != world_config_hash(DEFAULT)
    assert world_config_hash(dataclasses.replace(on, warmstart_repeat_length=7)) != world_config_hash(on)
    practice = dataclasses.replace(DEFAULT, warmstart_traj_drill_weight=0.5)
    assert world_config_hash(practice) != world_config_hash(DEFAULT)
    balanced = dataclasses.replace(DEFAULT, warmstart_family_balance=True)
    assert world_config_hash(balanced) not in (world_config_hash(DEFAULT), world_config_hash(practice))


# ---------------------------------------------------------------------------------------------------------------
# the built world on disk (the shared tiny_world fixture)
# ---------------------------------------------------------------------------------------------------------------


def test_world_layout_on_disk(tiny_world: Path, tiny_world_config: WorldConfig) -> None:
    for name in ("corpus.jsonl", "index/manifest.json", "qa/train.jsonl", "qa/test.jsonl", "tokenizer",
                 "model/config.json", "world.json"):
        assert (tiny_world / name).exists(), name
    card = read_card(tiny_world)
    assert card["config_hash"] == world_config_hash(tiny_world_config)
    corpus = read_jsonl(tiny_world / "corpus.jsonl")
    ids = {d["id"] for d in corpus}
    rows = read_jsonl(tiny_world / "qa" / "test.jsonl")
    assert len(rows) == tiny_world_config.num_test_questions == card["counts"]["test_questions"]
    for r in rows + read_jsonl(tiny_world / "qa" / "train.jsonl"):
        assert set(r["metadata"]["support_ids"]) <= ids
    assert generate_world(tiny_world_config).passages == corpus  # the files are the generator's output


def test_retriever_finds_single_hop_support(tiny_world: Path, world_rows: list[dict]) -> None:
    """Searching the subject's name returns its passage in the top 3 for most questions (the world is solvable)."""
    from retriever.inprocess import InProcessRetriever

    r = InProcessRetriever(tiny_world / "index")
    hits = r.search([row["metadata"]["subject"] for row in world_rows], 3)
    found = [row["metadata"]["support_ids"][0] in {h["id"] for h in hs} for row, hs in zip(world_rows, hits)]
    assert sum(found) / len(found) >= 0.8


def test_ensure_world_reuses_a_finished_build(tiny_world: Path, tiny_world_config: WorldConfig) -> None:
    before = json.loads((tiny_world / "world.json").read_text())
    model_mtime = (tiny_world / "model" / "config.json").stat().st_mtime_ns
    assert ensure_world(tiny_world, tiny_world_config, progress=False) == tiny_world
    assert json.loads((tiny_world / "world.json").read_text()) == before  # nothing rebuilt
    assert (tiny_world / "model" / "config.json").stat().st_mtime_ns == model_mtime



def test_a_directory_holding_another_configs_world_is_never_built_over(tmp_path: Path) -> None:
    """A finished world of another config (its card) is someone's data: ensure_world refuses, names both hashes and
    touches nothing; `world build --force` is the way to replace it on purpose."""
    from searchr1_lld.world.build import main as build_main

    out = tmp_path / "study-world"
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text("{}")
    (out / "world.json").write_text(json.dumps({"config_hash": "0123456789ab"}))
    with pytest.raises(ValueError, match=rf"holds the world of another config \(config hash 0123456789ab; this one's "
                                         rf"is {world_config_hash(DEFAULT)}\): building here would delete it"):
        ensure_world(out, DEFAULT, progress=False)
    assert (out / "model" / "config.json").read_text() == "{}" and (out / "world.json").exists()
    assert build_main(["--out", str(out), "--quiet"]) == 2  # the CLI says so in one line, without --force

OTHER_HOPS = dataclasses.replace(DEFAULT, multi_hop_families=[
    "founder_occupation", "founder_birth_city", "hq_river", "birthplace_founded_year"])


def test_multi_hop_families_choose_what_the_world_asks(world) -> None:
    assert {r["metadata"]["family"] for r in world.test_rows if r["metadata"]["hops"] == 2} == {
        "founder_birth_year", "founder_birth_city", "hq_founded_year", "birthplace_founded_year"}
    chosen = generate_world(OTHER_HOPS)
    multi = [r for r in chosen.train_rows + chosen.test_rows if r["metadata"]["hops"] == 2]
    assert {r["metadata"]["family"] for r in multi} == set(OTHER_HOPS.multi_hop_families)
    assert chosen.counts()["test_multi_hop"] == 200
    # the city-year families: the bridge is the city, its passage states the founding year, the first one does not
    cities = {c.name: c for c in chosen.cities}
    for r in multi:
        meta = r["metadata"]
        first, second = (chosen.passage(i)["contents"] for i in meta["support_ids"])
        if meta["family"] in ("hq_founded_year", "birthplace_founded_year"):
            assert r["golden_answers"] == [str(cities[meta["bridge"]].founded_year)]
            assert _norm_in(r["golden_answers"][0], second) and not _norm_in(r["golden_answers"][0], first)
    with pytest.raises(ValueError, match="multi_hop_families"):
        generate_world(dataclasses.replace(DEFAULT, multi_hop_families=["founder_birth_year", "moon_phase"]))
    with pytest.raises(ValueError, match="multi_hop_families"):
        generate_world(dataclasses.replace(DEFAULT, multi_hop_families=[]))


def test_warm_start_shortfalls_name_unmet_drill_targets_and_weak_figures() -> None:
    # the card of a build whose answer copy did not form (figures as measured on an AMD EPYC build of the default
    # world's earlier recipe): the full stage ran out of budget at answer 0.31; greedy answer copy 0.082
    card = {
        "policy": {"drill_stop": {"short": "targets met", "full": "budget used"},
                   "drill_checks": [{"step": 800, "stage": "short", "context": "short", "subject_query": 0.98},
                                    {"step": 4000, "stage": "full", "context": "full", "subject_query": 1.0,
                                     "answer": 0.3125}]},
        "warm_start": {"greedy": {"format_valid_rate": 0.98, "first_query_subject_rate": 1.0,
                                  "answer_copied_rate": 0.082}},
    }
    lines = warm_start_shortfalls(card)
    assert len(lines) == 2
    assert "'full'" in lines[0] and "answer 0.31" in lines[0] and "subject_query 1.00" in lines[0]
    assert "answer_copied_rate 0.082 < 0.5" in lines[1]
    card["policy"]["drill_stop"]["full"] = "targets met"
    card["warm_start"]["greedy"]["answer_copied_rate"] = 0.5
    assert warm_start_shortfalls(card) == []
    assert warm_start_shortfalls({"warm_start": {"greedy": {"answer_copied_rate": float("nan")}}}) == []
    # a drill stage that ran out of budget is no shortfall of a warm start that then passed its acceptance (the
    # shipped default world's: drill_stop short "budget used", acceptance passed)
    card["policy"]["drill_stop"]["full"] = "budget used"
    assert len(warm_start_shortfalls(card)) == 1
    assert warm_start_shortfalls({**card, "acceptance": {"passed": True, "missed": []}}) == []


def test_a_reused_world_is_one_line(tiny_world, tmp_path, capsys) -> None:
    """``world build`` of a world already built says so in one line (the build's summary and warnings came with the
    build)."""
    import yaml

    from conftest import TEST_WORLD_CONFIG
    from searchr1_lld.world.build import main

    config = tmp_path / "world.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(TEST_WORLD_CONFIG)))
    assert main(["--config", str(config), "--out", str(tiny_world), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"world reused: {tiny_world} (config hash {world_config_hash(TEST_WORLD_CONFIG)})"]
    assert err == ""


def _measured(one_hop: float, two_hop: float, pass_k: float, majority: float) -> dict:
    return {"split": "val", "greedy_em_by_hops": {"1": one_hop, "2": two_hop}, "two_hop_pass_at_k": pass_k,
            "majority_train_answer_em_by_hops": {"1": 0.3, "2": majority}}


def test_acceptance_names_every_figure_it_misses() -> None:
    """The warm start's acceptance on validation: single-hop greedy EM >= 0.8, two-hop greedy EM <= 0.15, two-hop
    pass@k >= 0.4, two-hop majority-training-answer EM <= 0.05; the bounds themselves pass, every miss is named."""
    from searchr1_lld.world.build import acceptance

    ok = acceptance(_measured(0.8, 0.15, 0.4, 0.05))
    assert ok["passed"] and ok["missed"] == [] and ok["split"] == "val"
    assert set(ok["figures"]) == {"greedy_one_hop_em", "greedy_two_hop_em", "two_hop_pass_at_k",
                                  "two_hop_majority_train_answer_em"}
    bad = acceptance(_measured(0.79, 0.2, 0.39, 0.06))
    assert not bad["passed"] and len(bad["missed"]) == 4
    assert "greedy_one_hop_em 0.790, needs >= 0.8" in bad["missed"][0]
    assert "greedy_two_hop_em 0.200, needs <= 0.15" in bad["missed"][1]
    one = acceptance(_measured(0.9, 0.1, 0.5, 0.0) | {"two_hop_pass_at_k": float("nan")})
    assert one["missed"] == ["acceptance missed: two_hop_pass_at_k nan, needs >= 0.4 (val split)"]
    assert warm_start_shortfalls({"acceptance": one}) == one["missed"]


def test_pass_at_k_and_majority_answer_baseline_by_hand() -> None:
    from types import SimpleNamespace

    from searchr1_lld.world.scoring import majority_answer_em, pass_at_k

    def traj(row_id: str, reward: float):
        return SimpleNamespace(row={"id": row_id}, reward=reward)

    # row a solved by one of its 3 samples, b by none, c by two: pass@3 = 2/3
    trajs = [traj("a", 0), traj("a", 1), traj("a", 0), traj("b", 0), traj("b", 0), traj("b", 0),
             traj("c", 1), traj("c", 1), traj("c", 0)]
    assert pass_at_k(trajs) == pytest.approx(2 / 3)

    def row(family: str, answer: str) -> dict:
        return {"golden_answers": [answer], "metadata": {"family": family}}

    train = [row("f", "1850"), row("f", "1850"), row("f", "1900"), row("g", "Mora"), row("g", "Kel")]
    held_out = [row("f", "1850"), row("f", "1901"), row("g", "Kel"), row("g", "Mora"), row("h", "x")]
    # f's majority is 1850 (1 of 2 right); g ties between Kel and Mora: the alphabetically first, Kel (1 of 2);
    # h has no training answer (0 of 1)
    assert majority_answer_em(train, held_out) == pytest.approx(2 / 5)


def test_the_build_measures_on_validation_and_never_reads_test(tmp_path, monkeypatch) -> None:
    """A whole build with its measurement, every read of a ``qa/test.jsonl`` an error: the build finishes, measured
    on the validation split, its acceptance in ``world.json``."""
    import builtins
    import io

    from conftest import TEST_WORLD_CONFIG
    from searchr1_lld.world.build import build_world

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        path = Path(file) if isinstance(file, (str, Path)) else None
        if path is not None and path.name == "test.jsonl" and path.parent.name == "qa" and "r" in mode:
            raise AssertionError(f"the world build read the test split: {path}")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    cfg = dataclasses.replace(TEST_WORLD_CONFIG, num_train_questions=16, num_val_questions=8, num_test_questions=8,
                              warmstart_trajectories=16, warmstart_drills=0, warmstart_measure_pass_k=2)
    card = build_world(tmp_path / "w", cfg, progress=False, measure=True)
    with pytest.raises(AssertionError, match="read the test split"):
        read_jsonl(tmp_path / "w" / "qa" / "test.jsonl")  # the guard is live
    assert card["warm_start"]["split"] == "val" and card["warm_start"]["questions"] == 8
    assert card["acceptance"]["split"] == "val" and len(card["acceptance"]["figures"]) == 4
    assert card["test_seed"] == cfg.test_seed
    assert json.loads((tmp_path / "w" / "world.json").read_text())["acceptance"] == json.loads(
        json.dumps(card["acceptance"]))


def test_a_build_shows_the_warm_starts_progress_under_its_own(tmp_path, capsys) -> None:
    """The warm start's training and its measurement (minutes each on the default world) show a bar of their own
    under the build's stage bar."""
    import dataclasses

    from conftest import TEST_WORLD_CONFIG

    small = dataclasses.replace(TEST_WORLD_CONFIG, warmstart_trajectories=32, warmstart_drills=16,
                                warmstart_measure=True, warmstart_measure_pass_k=1)
    ensure_world(tmp_path / "world", small, progress=True)
    err = capsys.readouterr().err
    assert "build world" in err and "warm start:" in err and "stage=policy" in err
