"""The world's questions: the single-hop and multi-hop families and their templates, every candidate question of a
split (from the entities and their passages, :mod:`.generate`), and the seeded sample of each split's questions in
the project schema ``{id, question, golden_answers, data_source, metadata}``."""

from __future__ import annotations

import random
from typing import Any

from searchr1_lld.prompts import normalize_question
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
        for k, tpl in enumerate(templates):
            pool.append({"family": family, "template": k, "question": tpl.format(s=subject), "golds": golds,
                         "support": support, "subject": subject, "bridge": bridge})

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


def sample_questions(rng: random.Random, single: list[dict], multi: list[dict], n: int, multi_frac: float,
                      passages: list[dict], split: str) -> list[dict]:
    # a multi-hop question must not be answerable from its first passage alone
    multi = [q for q in multi if not _answer_in(q["golds"], passages[int(q["support"][0])]["contents"])]
    n_multi = round(n * multi_frac)
    n_single = n - n_multi
    if n_multi > len(multi) or n_single > len(single):
        raise ValueError(
            f"{split}: asked for {n_single} single-hop and {n_multi} multi-hop questions but the world only has "
            f"{len(single)} and {len(multi)} distinct ones; raise num_people/num_companies/num_cities or lower "
            f"num_{split}_questions")
    chosen = rng.sample(single, n_single) + rng.sample(multi, n_multi)
    rng.shuffle(chosen)
    rows = []
    for i, q in enumerate(chosen):
        rows.append({
            "id": f"synthetic-{split}-{i:05d}",
            "question": normalize_question(q["question"]),
            "golden_answers": list(q["golds"]),
            "data_source": DATA_SOURCE,
            "metadata": {"hops": len(q["support"]), "family": q["family"], "support_ids": list(q["support"]),
                         "subject": q["subject"], "bridge": q["bridge"]},
        })
    return rows


def question_splits(rng: random.Random, cfg: WorldConfig, parts: dict[str, Any], passages: list[dict[str, str]],
                     splits: tuple[str, ...]) -> dict[str, list[dict]]:
    """Every split's QA rows (``parts``: people, cities, companies and doc ids), the held-out rows marked where
    their answer is a training answer."""
    families = tuple(cfg.multi_hop_families)
    rows = {}
    for split in splits:
        single, multi = candidates(parts, split, families)
        rows[split] = sample_questions(rng, single, multi, getattr(cfg, f"num_{split}_questions"),
                                        cfg.multi_hop_fraction, passages, split)
    for split in HELD_OUT_SPLITS:
        mark_train_answers(rows[split], rows["train"])
    return rows
