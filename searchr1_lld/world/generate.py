"""The synthetic search world: a small fictional encyclopedia that no model can answer from memory.

A seeded generator (``generate_world(cfg)``) invents

- entities: people, cities, companies and rivers with attributes (birth year, birth city, occupation, founder,
  headquarters, founding year, the river a city lies on, ...), all names made of invented syllables;
- a corpus of wiki-18 style passages ``{"id": str, "contents": "\\"Title\\"\\ntext"}``, one per entity, plus
  distractor passages about *similarly named* entities (one syllable changed, or a sibling company name) so that a
  careless search returns plausible wrong documents;
- QA rows (:mod:`.questions`) in the project schema ``{id, question, golden_answers, data_source, metadata}`` in two families:
  single-hop (one search on the subject suffices) and multi-hop (the first passage names a bridge entity, whose own
  passage states the answer: two chained searches), with ``metadata = {"hops", "family", "support_ids", "subject",
  "bridge", "fact"}`` (``fact``: the entity that holds the answer and the attribute, ``"Mera Ost|birth_year"``; the
  held-out splits ask one question per fact, and their test questions are drawn with ``WorldConfig.test_seed``).

Train / validation / test splits without entity leakage: people, cities and companies are partitioned into a train,
a validation and a test part, each *closed under the relations that questions follow* (a test company's founder is a
test person, born in a test city, ...), so the splits share no subject, no bridge entity and no support passage, and
no fact a held-out question needs is ever the target of a training question. Rivers (only a handful) are shared:
they are answers, never subjects. Answers can therefore repeat across splits (a river, an occupation, a year): every
held-out row records in ``metadata["train_answer"]`` whether one of its gold answers is also a training question's
gold answer (such a question can be answered right by guessing a frequent training answer;
:func:`searchr1_lld.world.splits.guessable`).

Everything is a pure function of ``WorldConfig`` (same seed -> byte-identical files).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1_lld.world.config import WorldConfig, validate_world
from searchr1_lld.world.questions import question_splits
from searchr1_lld.world.splits import HELD_OUT_SPLITS, held_out_shares, split_labels


_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "ei"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "x", "nd"]

OCCUPATIONS = ["painter", "engineer", "poet", "botanist", "architect", "sculptor", "astronomer", "composer",
               "cartographer", "physician", "merchant", "historian"]
INDUSTRIES = ["shipbuilding", "textile", "glassware", "railway", "publishing", "brewing", "mining", "clockmaking"]
COMPANY_SUFFIXES = ["Industries", "Works", "Company", "Holdings", "Trading", "Foundry"]
REGIONS_SYLLABLES = 2


@dataclass
class Person:
    name: str
    birth_year: int
    birth_city: str
    occupation: str
    split: str  # "train" | "test" | "distractor"


@dataclass
class City:
    name: str
    founded_year: int
    river: str
    region: str
    split: str


@dataclass
class Company:
    name: str
    founder: str
    founded_year: int
    hq_city: str
    industry: str
    split: str


@dataclass
class River:
    name: str  # e.g. "Sel River"
    length_km: int
    cities: list[str] = field(default_factory=list)
    split: str = "shared"


@dataclass
class World:
    """The generated world: entities, the corpus and the QA splits."""

    people: list[Person]
    cities: list[City]
    companies: list[Company]
    rivers: list[River]
    passages: list[dict[str, str]]  # {"id", "contents"}
    doc_id_of: dict[str, str]  # entity name -> id of its passage
    train_rows: list[dict[str, Any]]
    val_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]]

    def passage(self, doc_id: str) -> dict[str, str]:
        return self.passages[int(doc_id)]

    def counts(self) -> dict[str, int]:
        def real(xs):
            return sum(1 for x in xs if x.split != "distractor")

        return {
            "people": real(self.people), "cities": real(self.cities), "companies": real(self.companies),
            "rivers": len(self.rivers), "passages": len(self.passages),
            "distractor_passages": sum(1 for xs in (self.people, self.cities, self.companies)
                                       for x in xs if x.split == "distractor"),
            "train_questions": len(self.train_rows), "val_questions": len(self.val_rows),
            "test_questions": len(self.test_rows),
            "train_multi_hop": sum(1 for r in self.train_rows if r["metadata"]["hops"] == 2),
            "val_multi_hop": sum(1 for r in self.val_rows if r["metadata"]["hops"] == 2),
            "test_multi_hop": sum(1 for r in self.test_rows if r["metadata"]["hops"] == 2),
            "test_train_answer": sum(1 for r in self.test_rows if r["metadata"]["train_answer"]),
        }


# ----------------------------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------------------------


class _NameMaker:
    """Invented, globally unique names (no two entities share a word-identical name)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        return self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        for _ in range(1000):
            n = self.rng.randint(*syllables)
            w = "".join(self._syllable() for _ in range(n)).capitalize()
            if 4 <= len(w) <= 11 and w not in self.used:
                self.used.add(w)
                return w
        raise RuntimeError("name space exhausted; lower the entity counts")

    def claim(self, name: str) -> bool:
        """Reserve a full name; False if it is already taken."""
        if name in self.used:
            return False
        self.used.add(name)
        return True

    def similar(self, word: str) -> str:
        """A word one syllable away from ``word`` (for distractors)."""
        for _ in range(1000):
            cut = self.rng.randint(2, max(2, len(word) - 2))
            w = (word[:cut] + self._syllable())[: max(4, len(word) + self.rng.randint(-1, 1))].capitalize()
            if w != word and w not in self.used and len(w) >= 4:
                self.used.add(w)
                return w
        raise RuntimeError(f"cannot make a name similar to {word!r}")


# ----------------------------------------------------------------------------------------------------------------
# Passages
# ----------------------------------------------------------------------------------------------------------------


def _passage_text(entity: Person | City | Company | River) -> tuple[str, str]:
    """(title, text) of an entity's passage. Person passages never name a company, company passages never state the
    founder's birth data: the multi-hop questions really need the second passage."""
    if isinstance(entity, Person):
        a = _article(entity.occupation)
        return entity.name, (f"{entity.name} was {a} {entity.occupation} born in {entity.birth_year} in the city of "
                             f"{entity.birth_city}. {entity.name.split()[0]} worked as {a} {entity.occupation} for "
                             f"most of their life.")
    if isinstance(entity, City):
        return entity.name, (f"{entity.name} is a city in the {entity.region} region, founded in "
                             f"{entity.founded_year}. {entity.name} lies on the {entity.river}.")
    if isinstance(entity, Company):
        return entity.name, (f"{entity.name} is {_article(entity.industry)} {entity.industry} company founded in {entity.founded_year} by "
                             f"{entity.founder}. Its headquarters are in {entity.hq_city}.")
    if isinstance(entity, River):
        towns = ", ".join(entity.cities) if entity.cities else "no large city"
        return entity.name, f"The {entity.name} is a river {entity.length_km} km long. It flows through {towns}."
    raise TypeError(f"not an entity: {entity!r}")


# How each kind of passage starts after its title (``_passage_text``): the reader of a passage's entity kind.
_KIND_OPENINGS = {"river": "The {t} is a river", "city": "{t} is a city in", "company": "{t} is a",
                  "person": "{t} was a"}


def passage_title(contents: str) -> str:
    """The title of a ``_contents`` string (``"Title"\\ntext``), without its quotes."""
    return contents.split("\n", 1)[0].strip().strip('"')


def passage_kind(contents: str) -> str:
    """The kind of entity a corpus passage is about (``person`` / ``city`` / ``company`` / ``river``), read from the
    opening ``_passage_text`` gives each kind; ValueError for a passage this generator did not write."""
    title, text = passage_title(contents), contents.partition("\n")[2]
    for kind, opening in _KIND_OPENINGS.items():
        if text.startswith(opening.format(t=title)):
            return kind
    raise ValueError(f"not a passage of this world: {contents[:80]!r}")


def name_word_groups(passages: list[dict[str, str]]) -> dict[str, list[str]]:
    """The name words of the corpus' titles by role: ``person_first``, ``person_last``, ``city``, ``company``
    (the stem; suffixes like "Works" are not names), ``river`` (the stem before "River"). Each list sorted, no
    duplicates; a word is in the group of every role it plays (the generator keeps roles apart, so normally one)."""
    groups: dict[str, set[str]] = {k: set() for k in ("person_first", "person_last", "city", "company", "river")}
    for p in passages:
        kind = passage_kind(p["contents"])
        words = passage_title(p["contents"]).split()
        if kind == "person":
            groups["person_first"].add(words[0])
            groups["person_last"].update(words[1:])
        elif kind == "city":
            groups["city"].update(words)
        else:  # company "<stem> <suffix>", river "<stem> River"
            groups[kind].update(words[:-1])
    return {k: sorted(v) for k, v in groups.items()}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _contents(title: str, text: str) -> str:
    return f'"{title}"\n{text}'


# ----------------------------------------------------------------------------------------------------------------
# The generator
# ----------------------------------------------------------------------------------------------------------------


def _cities_and_rivers(rng: random.Random, names: _NameMaker, cfg: WorldConfig, shares: dict[str, float]
                       ) -> tuple[list[River], list[str], list[City]]:
    """The rivers, the regions and the (real) cities, each city labelled with its split."""
    rivers = [River(name=f"{names.word((1, 2))} River", length_km=rng.randint(40, 900))
              for _ in range(cfg.num_rivers)]
    regions = [names.word((2, 2)) for _ in range(max(2, cfg.num_cities // 5))]
    cities = [City(name=names.word(), founded_year=rng.randint(1000, 1700), river=rng.choice(rivers).name,
                   region=rng.choice(regions), split=lab)
              for lab in split_labels(rng, cfg.num_cities, shares)]
    return rivers, regions, cities


def _people(rng: random.Random, names: _NameMaker, cfg: WorldConfig, shares: dict[str, float],
            city_by_split: dict[str, list[str]]) -> list[Person]:
    """The (real) people, each born in a city of their own split."""
    people: list[Person] = []
    for lab in split_labels(rng, cfg.num_people, shares):
        while True:
            name = f"{names.word((1, 2))} {names.word()}"
            if names.claim(name):
                break
        people.append(Person(name=name, birth_year=rng.randint(1780, 1960), birth_city=rng.choice(city_by_split[lab]),
                             occupation=rng.choice(OCCUPATIONS), split=lab))
    return people


def _companies(rng: random.Random, names: _NameMaker, cfg: WorldConfig, shares: dict[str, float],
               people_by_split: dict[str, list[Person]], city_by_split: dict[str, list[str]]) -> list[Company]:
    """The (real) companies, each founded by a person of its split (a distinct one while the split has people who
    founded none: each founder is a fact of its own) and seated in a city of its split."""
    companies: list[Company] = []
    founders: dict[str, list[Person]] = {lab: [] for lab in people_by_split}
    for lab in split_labels(rng, cfg.num_companies, shares):
        if not founders[lab]:  # every person of the split founds one company before anyone founds a second
            founders[lab] = rng.sample(people_by_split[lab], len(people_by_split[lab]))
        founder = founders[lab].pop()
        name = f"{names.word()} {rng.choice(COMPANY_SUFFIXES)}"
        names.claim(name)
        companies.append(Company(name=name, founder=founder.name,
                                 founded_year=founder.birth_year + rng.randint(22, 60),
                                 hq_city=rng.choice(city_by_split[lab]), industry=rng.choice(INDUSTRIES), split=lab))
    return companies


def _distractor_company(rng: random.Random, names: _NameMaker, c: Company, real_cities: list[City]) -> Company:
    """A company named like ``c`` (its stem with another suffix, or a similar stem), with random attributes."""
    stem, suffix = c.name.split(" ", 1)
    if rng.random() < 0.5:
        name = f"{stem} {rng.choice([s for s in COMPANY_SUFFIXES if s != suffix])}"
        if not names.claim(name):
            name = f"{names.similar(stem)} {suffix}"
    else:
        name = f"{names.similar(stem)} {suffix}"
    names.claim(name)
    founder = f"{names.word((1, 2))} {names.word()}"
    names.claim(founder)
    return Company(name=name, founder=founder, founded_year=rng.randint(1800, 2000),
                   hq_city=rng.choice(real_cities).name, industry=rng.choice(INDUSTRIES), split="distractor")


def _add_distractors(rng: random.Random, names: _NameMaker, cfg: WorldConfig, people: list[Person],
                     cities: list[City], companies: list[Company], rivers: list[River], regions: list[str]) -> None:
    """Append to ``people``, ``cities`` and ``companies`` their distractors: similar names, random attributes,
    never subjects of questions (``distractors_per_entity`` per real entity)."""
    real_people, real_cities, real_companies = list(people), list(cities), list(companies)
    for _ in range(cfg.distractors_per_entity):
        for p in real_people:
            first, last = p.name.split(" ", 1)
            name = f"{first} {names.similar(last)}" if rng.random() < 0.5 else f"{names.similar(first)} {last}"
            names.claim(name)
            people.append(Person(name=name, birth_year=rng.randint(1780, 1960),
                                 birth_city=rng.choice(real_cities).name, occupation=rng.choice(OCCUPATIONS),
                                 split="distractor"))
        for c in real_cities:
            cities.append(City(name=names.similar(c.name), founded_year=rng.randint(1000, 1700),
                               river=rng.choice(rivers).name, region=rng.choice(regions), split="distractor"))
        for c in real_companies:
            companies.append(_distractor_company(rng, names, c, real_cities))


def _corpus(rng: random.Random, entities: list[Any]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """One passage per entity, in a seeded order; and each entity's doc id (name -> id)."""
    order = list(range(len(entities)))
    rng.shuffle(order)
    passages: list[dict[str, str]] = []
    doc_id_of: dict[str, str] = {}
    for idx in order:
        title, text = _passage_text(entities[idx])
        doc_id = str(len(passages))
        passages.append({"id": doc_id, "contents": _contents(title, text)})
        doc_id_of[entities[idx].name] = doc_id
    return passages, doc_id_of


def generate_world(cfg: WorldConfig) -> World:
    """Deterministically build the whole world (entities, corpus, QA splits) from ``cfg``."""
    validate_world(cfg)
    rng = random.Random(cfg.seed)
    names = _NameMaker(rng)
    shares = held_out_shares(cfg)
    splits = ("train", *HELD_OUT_SPLITS)

    rivers, regions, cities = _cities_and_rivers(rng, names, cfg, shares)
    city_by_split = {s: [c.name for c in cities if c.split == s] for s in splits}
    people = _people(rng, names, cfg, shares, city_by_split)
    people_by_split = {s: [p for p in people if p.split == s] for s in splits}
    companies = _companies(rng, names, cfg, shares, people_by_split, city_by_split)
    _add_distractors(rng, names, cfg, people, cities, companies, rivers, regions)
    for c in cities:
        if c.split != "distractor":
            next(r for r in rivers if r.name == c.river).cities.append(c.name)

    passages, doc_id_of = _corpus(rng, [*people, *cities, *companies, *rivers])
    parts = {"people": people, "cities": cities, "doc_id_of": doc_id_of, "companies": companies}
    rows = question_splits(rng, cfg, parts, passages, splits)
    return World(people=people, cities=cities, companies=companies, rivers=rivers, passages=passages,
                 doc_id_of=doc_id_of, train_rows=rows["train"], val_rows=rows["val"], test_rows=rows["test"])


# ----------------------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------------------


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def write_world_files(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write ``corpus.jsonl``, ``qa/train.jsonl``, ``qa/val.jsonl``, ``qa/test.jsonl`` under ``out_dir``; return
    their paths."""
    out_dir = Path(out_dir)
    paths = {"corpus": out_dir / "corpus.jsonl", "train": out_dir / "qa" / "train.jsonl",
             "val": out_dir / "qa" / "val.jsonl", "test": out_dir / "qa" / "test.jsonl"}
    write_jsonl(world.passages, paths["corpus"])
    write_jsonl(world.train_rows, paths["train"])
    write_jsonl(world.val_rows, paths["val"])
    write_jsonl(world.test_rows, paths["test"])
    return paths
