"""The world's questions: the single-hop and multi-hop families and their templates, every candidate question of a
split (from the entities and their passages, :mod:`.generate`), and the seeded sample of each split's questions in
the project schema ``{id, question, golden_answers, data_source, metadata}``."""

from __future__ import annotations

import random
from typing import Any

from searchr1_lld.data.prompts import normalize_question
from searchr1_lld.rewards import normalize_answer
from searchr1_lld.world.config import MULTI_HOP_FAMILIES, WorldConfig
from searchr1_lld.world.splits import HELD_OUT_SPLITS, mark_train_answers

DATA_SOURCE = "synthetic"

# family -> (hops, question templates). {s}: subject name.
SINGLE_HOP = {
    "person_birth_year": ["In which year was {s} born?", "When was {s} born?", "What is the birth year of {s}?"],
    "person_birth_city": ["In which city was {s} born?", "Where was {s} born?"],
    "person_occupation": ["What was the occupation of {s}?", "What did {s} work as?"],
    "company_founder": ["Who founded {s}?", "Who was the founder of {s}?"],
    "company_year": ["In which year was {s} founded?", "When was {s} founded?"],
    "company_hq": ["In which city is {s} headquartered?", "Where are the headquarters of {s}?"],
    "city_river": ["Which river flows through {s}?", "On which river does {s} lie?"],
}
MULTI_HOP = {
    "founder_birth_year": ["In which year was the founder of {s} born?", "When was the founder of {s} born?"],
    "founder_birth_city": ["In which city was the founder of {s} born?", "Where was the founder of {s} born?"],
    "founder_occupation": ["What was the occupation of the founder of {s}?", "What did the founder of {s} work as?"],
    "hq_river": ["Which river flows through the city where {s} is headquartered?",
                 "On which river lies the headquarters city of {s}?"],
    "birthplace_river": ["Which river flows through the birthplace of {s}?",
                         "Which river flows through the city where {s} was born?"],
    # year answers from the second passage (a city's founding year); not in the default world, chosen by
    # WorldConfig.multi_hop_families
    "hq_founded_year": ["In which year was the headquarters city of {s} founded?",
                        "When was the city where {s} is headquartered founded?"],
    "birthplace_founded_year": ["In which year was the birthplace of {s} founded?",
                                "When was the city where {s} was born founded?"],
}
assert tuple(MULTI_HOP) == MULTI_HOP_FAMILIES, "config.MULTI_HOP_FAMILIES names the families of MULTI_HOP"


# family -> the attribute its answer is (of the subject, single-hop; of the bridge entity, multi-hop): a question
# asks the fact "<entity>|<attribute>", so "When was the founder of X born?" and "When was <X's founder> born?" ask
# one fact, as do the founder questions of two companies with one founder.
FACT_ATTRIBUTE = {
    "person_birth_year": "birth_year", "person_birth_city": "birth_city", "person_occupation": "occupation",
    "company_founder": "founder", "company_year": "founded_year", "company_hq": "hq_city", "city_river": "river",
    "founder_birth_year": "birth_year", "founder_birth_city": "birth_city", "founder_occupation": "occupation",
    "hq_river": "river", "birthplace_river": "river", "hq_founded_year": "founded_year",
    "birthplace_founded_year": "founded_year",
}


def _river_golds(river: str) -> list[str]:
    return [river, river.removesuffix(" River")]


def candidates(world_parts: dict[str, Any], split: str, multi_hop_families: tuple[str, ...]
                ) -> tuple[list[dict], list[dict]]:
    """All (single-hop, multi-hop) question candidates whose subject lives in ``split``; multi-hop ones only of
    ``multi_hop_families`` (in generation order, so a subset keeps the others' order)."""
    people = {p.name: p for p in world_parts["people"]}
    cities = {c.name: c for c in world_parts["cities"]}
    doc = world_parts["doc_id_of"]
    single: list[dict] = []
    multi: list[dict] = []

    def add(pool, family, templates, subject, golds, support, bridge=""):
        fact = f"{bridge or subject}|{FACT_ATTRIBUTE[family]}"
        for k, tpl in enumerate(templates):
            pool.append({"family": family, "template": k, "question": tpl.format(s=subject), "golds": golds,
                         "support": support, "subject": subject, "bridge": bridge, "fact": fact})

    for p in world_parts["people"]:
        if p.split != split:
            continue
        add(single, "person_birth_year", SINGLE_HOP["person_birth_year"], p.name, [str(p.birth_year)], [doc[p.name]])
        add(single, "person_birth_city", SINGLE_HOP["person_birth_city"], p.name, [p.birth_city], [doc[p.name]])
        add(single, "person_occupation", SINGLE_HOP["person_occupation"], p.name, [p.occupation], [doc[p.name]])
        city = cities[p.birth_city]
        add(multi, "birthplace_river", MULTI_HOP["birthplace_river"], p.name, _river_golds(city.river),
            [doc[p.name], doc[city.name]], bridge=city.name)
        add(multi, "birthplace_founded_year", MULTI_HOP["birthplace_founded_year"], p.name, [str(city.founded_year)],
            [doc[p.name], doc[city.name]], bridge=city.name)
    for c in world_parts["companies"]:
        if c.split != split:
            continue
        founder = people[c.founder]
        add(single, "company_founder", SINGLE_HOP["company_founder"], c.name,
            [c.founder, c.founder.split()[-1]], [doc[c.name]])
        add(single, "company_year", SINGLE_HOP["company_year"], c.name, [str(c.founded_year)], [doc[c.name]])
        add(single, "company_hq", SINGLE_HOP["company_hq"], c.name, [c.hq_city], [doc[c.name]])
        add(multi, "founder_birth_year", MULTI_HOP["founder_birth_year"], c.name, [str(founder.birth_year)],
            [doc[c.name], doc[founder.name]], bridge=founder.name)
        add(multi, "founder_birth_city", MULTI_HOP["founder_birth_city"], c.name, [founder.birth_city],
            [doc[c.name], doc[founder.name]], bridge=founder.name)
        add(multi, "founder_occupation", MULTI_HOP["founder_occupation"], c.name, [founder.occupation],
            [doc[c.name], doc[founder.name]], bridge=founder.name)
        hq = cities[c.hq_city]
        add(multi, "hq_river", MULTI_HOP["hq_river"], c.name, _river_golds(hq.river),
            [doc[c.name], doc[hq.name]], bridge=hq.name)
        add(multi, "hq_founded_year", MULTI_HOP["hq_founded_year"], c.name, [str(hq.founded_year)],
            [doc[c.name], doc[hq.name]], bridge=hq.name)
    for c in world_parts["cities"]:
        if c.split != split:
            continue
        add(single, "city_river", SINGLE_HOP["city_river"], c.name, _river_golds(c.river), [doc[c.name]])
    multi = [q for q in multi if q["family"] in multi_hop_families]
    return single, multi


def contains_phrase(text: str, phrase: str) -> bool:
    """``phrase`` occurs in ``text`` as whole words after answer normalisation (an empty phrase never does)."""
    phrase = normalize_answer(phrase)
    return bool(phrase) and f" {phrase} " in f" {normalize_answer(text)} "


def _answer_in(golds: list[str], contents: str) -> bool:
    return any(contains_phrase(contents, g) for g in golds)


def _one_per_fact(rng: random.Random, pool: list[dict], n: int, taken: set[str]) -> list[dict]:
    """Up to ``n`` questions of ``pool`` in a seeded order, at most one per fact and none of a fact in ``taken``
    (the facts chosen are added to ``taken``); each fact's template drawn at random."""
    order = rng.sample(pool, len(pool))
    chosen = []
    for q in order:
        if len(chosen) == n:
            break
        if q["fact"] not in taken:
            taken.add(q["fact"])
            chosen.append(q)
    return chosen


def sample_questions(rng: random.Random, single: list[dict], multi: list[dict], n: int, multi_frac: float,
                      passages: list[dict], split: str) -> list[dict]:
    """``n`` questions of a split (share ``multi_frac`` multi-hop). A held-out split (validation, test) asks one
    question per fact: no two ask the same fact (``FACT_ATTRIBUTE``), the multi-hop ones drawn first, so that its
    questions are as many independent measurements as the facts allow; the training split draws distinct
    questions. ValueError naming the shortfall when the split's entities hold too few."""
    # a multi-hop question must not be answerable from its first passage alone
    multi = [q for q in multi if not _answer_in(q["golds"], passages[int(q["support"][0])]["contents"])]
    n_multi = round(n * multi_frac)
    n_single = n - n_multi
    if split in HELD_OUT_SPLITS:
        taken: set[str] = set()
        chosen_multi = _one_per_fact(rng, multi, n_multi, taken)
        chosen_single = _one_per_fact(rng, single, n_single, taken)
        what = "distinct facts"
    else:  # training questions may ask a fact twice (another template, another company of one founder)
        chosen_multi = rng.sample(multi, n_multi) if n_multi <= len(multi) else multi
        chosen_single = rng.sample(single, n_single) if n_single <= len(single) else single
        what = "distinct questions"
    if len(chosen_multi) < n_multi or len(chosen_single) < n_single:
        one_per_fact = ", one per fact," if split in HELD_OUT_SPLITS else ""
        raise ValueError(
            f"{split}: asked for {n_single} single-hop and {n_multi} multi-hop questions{one_per_fact} but the "
            f"world only has {len(chosen_single)} and {len(chosen_multi)} {what} for them; raise "
            f"num_people/num_companies/num_cities or lower num_{split}_questions")
    chosen = chosen_single + chosen_multi
    rng.shuffle(chosen)
    rows = []
    for i, q in enumerate(chosen):
        rows.append({
            "id": f"synthetic-{split}-{i:05d}",
            "question": normalize_question(q["question"]),
            "golden_answers": list(q["golds"]),
            "data_source": DATA_SOURCE,
            "metadata": {"hops": len(q["support"]), "family": q["family"], "support_ids": list(q["support"]),
                         "subject": q["subject"], "bridge": q["bridge"], "fact": q["fact"]},
        })
    return rows


def question_splits(rng: random.Random, cfg: WorldConfig, parts: dict[str, Any], passages: list[dict[str, str]],
                     splits: tuple[str, ...]) -> dict[str, list[dict]]:
    """Every split's QA rows (``parts``: people, cities, companies and doc ids), the held-out rows marked where
    their answer is a training answer; train and validation drawn with ``rng``, test with ``cfg.test_seed``."""
    families = tuple(cfg.multi_hop_families)
    rows = {}
    for split in splits:
        single, multi = candidates(parts, split, families)
        # the test questions are drawn with their own seed: no recipe setting or other split moves them
        split_rng = random.Random(cfg.test_seed) if split == "test" else rng
        rows[split] = sample_questions(split_rng, single, multi, getattr(cfg, f"num_{split}_questions"),
                                        cfg.multi_hop_fraction, passages, split)
    for split in HELD_OUT_SPLITS:
        mark_train_answers(rows[split], rows["train"])
    return rows
