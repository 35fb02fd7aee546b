"""Warm-start trajectories of the synthetic world's policy: plans of mixed quality (correct searches + answers,
searches for the wrong entity, answers without searching, stopping after the first hop, malformed turns), rendered
exactly as the rollout builds them: ``render_prompt`` ids, then generated segments and ``format_observation`` /
``INVALID_ACTION_MESSAGE`` blocks tokenised *separately* and concatenated (:func:`tokenize_many`). Each trajectory's
entity names and years are consistently renamed at random (:class:`NameShuffler`), so the policy must *copy* queries
and answers from the context instead of memorising training entities.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from searchr1_lld.data.prompts import INVALID_ACTION_MESSAGE, doc_title_text, format_observation, render_prompt
from searchr1_lld.protocols import Tokenizer
from searchr1_lld.rollout.agent_loop import ObservationTokenizer
from searchr1_lld.world.config import WorldConfig
from searchr1_lld.world.generate import name_word_groups
from searchr1_lld.world.tokenizer import YEAR_PATTERN, corpus_years

SearchFn = Callable[[list[str], int], list[list[dict]]]  # retriever.search(queries, topk)


ANSWER_TYPE = {
    "person_birth_year": "year", "company_year": "year", "founder_birth_year": "year",
    "person_birth_city": "city", "company_hq": "city", "founder_birth_city": "city",
    "person_occupation": "occupation", "founder_occupation": "occupation",
    "company_founder": "person", "city_river": "river", "hq_river": "river", "birthplace_river": "river",
    "hq_founded_year": "year", "birthplace_founded_year": "year",
}

# kinds of warm-start trajectories; "correct" has probability cfg.warmstart_quality, the rest share the remainder.
# Every flawed kind that searches still searches for the question's subject (the policy must learn to copy it); the
# flaws are in what follows: a type-correct guess instead of the answer the passage states, stopping after the first
# hop of a multi-hop question, answering without a search, a malformed first turn (kept rare: format-valid >= 0.95).
FLAWED_KINDS = {"guess_after_search": 0.35, "one_hop_only": 0.35, "no_search": 0.2, "malformed": 0.1}


@dataclass
class Segment:
    """A piece of a trajectory: text and whether the policy generated it (True) or the environment did (False)."""

    text: str
    generated: bool
    hits: list[dict] | None = None  # observation segments: the retrieved docs (tokenised as the rollout does)


@dataclass
class TrajectoryPlan:
    """What a sampled warm-start trajectory does; ``queries`` are resolved against the retriever before rendering."""

    row: dict
    kind: str
    queries: list[str]
    answer: str | None
    malformed_turn: str | None = None


def _answer_pools(rows: list[dict]) -> dict[str, list[str]]:
    pools: dict[str, set[str]] = {}
    for r in rows:
        pools.setdefault(ANSWER_TYPE[r["metadata"]["family"]], set()).add(r["golden_answers"][0])
    return {k: sorted(v) for k, v in pools.items()}


def _wrong_answer(rng: random.Random, row: dict, pools: dict[str, list[str]]) -> str:
    pool = [a for a in pools[ANSWER_TYPE[row["metadata"]["family"]]] if a not in row["golden_answers"]]
    return rng.choice(pool) if pool else "unknown"


def row_sampler(rows: list[dict], by_family: bool) -> Callable[[random.Random], dict]:
    """A function drawing one of ``rows`` with the ``rng`` it is given: uniformly, or (``by_family``) a question
    family uniformly, then a row of it, so a family with few training rows is practised as often as any other."""
    if not by_family:
        return lambda rng: rng.choice(rows)
    families: dict[str, list[dict]] = {}
    for r in rows:
        families.setdefault(r["metadata"]["family"], []).append(r)
    groups = [families[f] for f in sorted(families)]
    return lambda rng: rng.choice(rng.choice(groups))


def plan_trajectories(rows: list[dict], n: int, quality: float, seed: int,
                      one_hop_share: float = 0.0, by_family: bool = False) -> list[TrajectoryPlan]:
    """Sample ``n`` trajectory plans over ``rows`` (share ``quality`` fully correct; rows drawn by ``row_sampler``).

    ``one_hop_share``: share of the multi-hop rows' plans that stop after the first hop (``one_hop_only``), drawn
    before the quality draw (so that many fewer multi-hop plans are correct): a warm start whose most likely move
    after the first ``<information>`` of a multi-hop question is to answer, i.e. a decision RL can flip (search
    again), as Search-R1's RL teaches a base model to use the search engine. 0 = the quality draw alone."""
    if not 0 <= one_hop_share <= 1:
        raise ValueError(f"one_hop_share must be in [0, 1] (got {one_hop_share})")
    rng = random.Random(seed)
    pools = _answer_pools(rows)
    kinds, weights = zip(*FLAWED_KINDS.items())
    draw_row = row_sampler(rows, by_family)
    plans = []
    for _ in range(n):
        row = draw_row(rng)
        meta = row["metadata"]
        gold = row["golden_answers"][0]
        hop_queries = [meta["subject"]] + ([meta["bridge"]] if meta["hops"] == 2 else [])
        if meta["hops"] == 2 and one_hop_share > 0 and rng.random() < one_hop_share:
            kind = "one_hop_only"
        else:
            kind = "correct" if rng.random() < quality else rng.choices(kinds, weights)[0]
        if kind == "correct":
            plans.append(TrajectoryPlan(row, kind, hop_queries, gold))
        elif kind == "guess_after_search":
            plans.append(TrajectoryPlan(row, kind, hop_queries, _wrong_answer(rng, row, pools)))
        elif kind == "no_search":
            plans.append(TrajectoryPlan(row, kind, [], _wrong_answer(rng, row, pools)))
        elif kind == "one_hop_only":
            answer = meta["bridge"] if meta["hops"] == 2 and rng.random() < 0.5 else _wrong_answer(rng, row, pools)
            plans.append(TrajectoryPlan(row, kind, [meta["subject"]], answer))
        else:  # malformed first turn, then the environment's correction, then a correct continuation
            bad = rng.choice([
                f"<think> look it up </think>\nsearch {meta['subject']}",
                f"<think> I know it </think>\nThe answer is {_wrong_answer(rng, row, pools)}.",
                f"<answer> {_wrong_answer(rng, row, pools)}",
            ])
            plans.append(TrajectoryPlan(row, kind, hop_queries, gold, malformed_turn=bad))
    return plans


# Short, formulaic reasoning: the tokens worth learning are the copied query and answer, not the prose.
THINK_FIRST = ["<think> look it up </think>\n"]
_THINK_BRIDGE = "<think> one more hop </think>\n"
_THINK_ANSWER = ["<think> found it </think>\n"]
_THINK_GUESS = "<think> I know it </think>\n"
ANSWER_THINKS = ("fixed", "quote")


def quote_think(answer: str, hits: list[dict]) -> str | None:
    """The answer's think as a quote: in the first passage of ``hits`` whose text (title line dropped) names
    ``answer``, from the last mention of the passage's title before the answer (its first word if none) up to and
    including the answer: ``<think> Mera Ost was a baker born in 1874 in the city of Koste </think>``,
    ``<think> Koste lies on the Drel River </think>``; None when no passage names it.

    Why: a quote is a span copy, the circuit a small transformer learns most reliably (it starts with the searched
    entity, which the policy already copies into its query, and each next word is the word that follows in the
    passage). The answer is then the last words of the think, a few positions back. A one-word think ("found it")
    leaves the answer a lookup across three passages, which the tiny model learnt type by type and by chance.
    Starting at the title's last mention keeps the quote short: quoted from the passage's start, a city's river
    came after 20 words of a template every city passage shares, and was not copied (docs/lab.md)."""
    for hit in hits:
        title, body = doc_title_text(hit["contents"])
        found = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", body)
        if found:
            start = max(body.rfind(title.strip('"'), 0, found.start()), 0)
            return f"<think> {body[start:found.end()]} </think>\n"
    return None


def answer_think(style: str, answer: str, hits: list[dict] | None, rng: random.Random | None = None) -> str:
    """The think line before ``<answer>``: ``quote`` (``quote_think``, when ``hits`` name the answer) or the fixed
    ``found it`` (drawn with ``rng`` from ``_THINK_ANSWER`` when given, else its first line); ``hits`` None =
    answered without searching (``I know it``)."""
    if style not in ANSWER_THINKS:
        raise ValueError(f"answer think must be one of {ANSWER_THINKS} (got {style!r})")
    if hits is None:
        return _THINK_GUESS
    fixed = rng.choice(_THINK_ANSWER) if rng is not None else _THINK_ANSWER[0]
    return (quote_think(answer, hits) if style == "quote" else None) or fixed


def bridge_think(style: str, bridge: str, hits: list[dict]) -> str:
    """The think line before the second hop's ``<search> bridge </search>``: ``quote`` (``quote_think``: the first
    hop's passage from its title up to the bridge entity, ``<think> Sadraes Works is a railway company founded in
    1794 by Mera Ost </think>``, when ``hits`` name it) or the fixed ``one more hop``.

    Why: with the fixed think the bridge is a lookup across three passages (the city after "headquarters are in" in
    the titled one), the circuit that formed on one CPU and not on another; quoted, the query repeats the think's
    last words, as the answer does after ``answer_think``'s quote (docs/lab.md)."""
    if style not in ANSWER_THINKS:
        raise ValueError(f"bridge think must be one of {ANSWER_THINKS} (got {style!r})")
    return (quote_think(bridge, hits) if style == "quote" else None) or _THINK_BRIDGE


def render_segments(plan: TrajectoryPlan, hits_of: dict[str, list[dict]], eos: str, rng: random.Random,
                    template: str = "tiny", tokenizer: Tokenizer | None = None, think: str = "fixed",
                    bridge: str = "fixed") -> list[Segment]:
    """The text pieces of one trajectory, exactly as the rollout would build them; ``think``: the answer's think
    line (``answer_think``; a guess after a search keeps ``found it``: it does not read the passages); ``bridge``:
    the second search's think line (``bridge_think``)."""
    segs = [Segment(render_prompt(plan.row["question"], template, tokenizer), generated=False)]
    if plan.malformed_turn is not None:
        segs.append(Segment(plan.malformed_turn + eos, generated=True))
        segs.append(Segment(INVALID_ACTION_MESSAGE, generated=False))
    for hop, query in enumerate(plan.queries):
        search_think = (rng.choice(THINK_FIRST) if hop == 0
                        else bridge_think(bridge, query, hits_of[plan.queries[hop - 1]]))
        segs.append(Segment(f"{search_think}<search> {query} </search>", generated=True))
        segs.append(Segment(format_observation(hits_of[query]), generated=False, hits=hits_of[query]))
    hits = hits_of[plan.queries[-1]] if plan.queries else None
    style = "fixed" if plan.kind == "guess_after_search" else think
    segs.append(Segment(f"{answer_think(style, plan.answer, hits, rng)}<answer> {plan.answer} </answer>{eos}",
                        generated=True))
    return segs


def tokenize_segments(segments: list[Segment], tokenizer, max_obs_length: int = 500) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask), built with the rollout's own tokenisation: the prompt through
    ``agent_loop.encode_prompt``, observations through ``agent_loop.ObservationTokenizer``, every other piece
    encoded on its own; mask 1 on generated tokens."""
    return tokenize_many([segments], tokenizer, max_obs_length)[0]


def tokenize_many(segment_lists: list[list[Segment]], tokenizer, max_obs_length: int = 500
                  ) -> list[tuple[list[int], list[int]]]:
    """``tokenize_segments`` of every trajectory in ``segment_lists``, each piece still encoded on its own but all
    pieces of a kind in one batched tokenizer call (the prompts with special tokens, every other piece without):
    the same ids as a call per piece, with less overhead (8,000 of the default world's 64,000 drills: 3.9 s against
    5.4 s). An observation longer than ``max_obs_length`` tokens is cut by
    ``ObservationTokenizer.fit``."""
    observe = ObservationTokenizer(tokenizer, max_obs_length)

    def is_prompt(k: int, seg: Segment) -> bool:
        return k == 0 and not seg.generated

    prompts, pieces = [], []  # in order of appearance: the prompts, every other piece (an observation as its block)
    for segments in segment_lists:
        for k, seg in enumerate(segments):
            if is_prompt(k, seg):
                prompts.append(seg.text)
            else:
                pieces.append(seg.text if seg.hits is None else format_observation(seg.hits))
    prompt_ids = iter(tokenizer(prompts, add_special_tokens=True)["input_ids"] if prompts else [])
    piece_ids = iter(zip(pieces, tokenizer(pieces, add_special_tokens=False)["input_ids"] if pieces else []))
    out = []
    for segments in segment_lists:
        ids: list[int] = []
        mask: list[int] = []
        for k, seg in enumerate(segments):
            if is_prompt(k, seg):
                piece = list(next(prompt_ids))
            else:
                text, piece = next(piece_ids)
                piece = observe.fit(text, piece) if seg.hits is not None else list(piece)
            ids += piece
            mask += [int(seg.generated)] * len(piece)
        out.append((ids, mask))
    return out


def build_warmstart_examples(rows: list[dict], search: SearchFn, tokenizer, cfg: WorldConfig, topk: int = 3,
                             seed: int | None = None, passages: list[dict] | None = None
                             ) -> list[tuple[list[int], list[int]]]:
    """Sample ``cfg.warmstart_trajectories`` plans, retrieve their queries in one batch, render and tokenise them.

    ``passages`` (the whole corpus): with name shuffling, every entity-name word of the corpus joins the renaming
    pool, test entities' included. Names are then pure symbols whose embeddings all get trained alike; without this
    a test entity's name tokens are never seen in training (their embeddings stay at init) and the policy cannot
    copy them. No fact leaks: each trajectory's names and years are renamed at random, so no real name ever appears
    next to its real facts."""
    seed = cfg.seed if seed is None else seed
    plans = plan_trajectories(rows, cfg.warmstart_trajectories, cfg.warmstart_quality, seed,
                              cfg.warmstart_one_hop_share, cfg.warmstart_family_balance)
    queries = sorted({q for p in plans for q in p.queries})
    results = search(queries, topk) if queries else []
    hits_of = dict(zip(queries, results))
    rng = random.Random(seed + 1)
    segments = [render_segments(p, hits_of, tokenizer.eos_token, rng, think=cfg.warmstart_answer_think,
                                bridge=cfg.warmstart_bridge_think)
                for p in plans]
    if cfg.warmstart_shuffle_names:
        renamer = NameShuffler(name_pool(rows, results, passages), years=year_pool(cfg, results, passages))
        segments = [renamer(segs, rng) for segs in segments]
    return tokenize_many(segments, tokenizer)


# ----------------------------------------------------------------------------------------------------------------
# Consistent renaming: copy, don't memorise
# ----------------------------------------------------------------------------------------------------------------

_FIXED_WORDS = {"River", "Industries", "Works", "Company", "Holdings", "Trading", "Foundry"}  # kept by NameShuffler

def name_pool(rows: list[dict], results: list[list[dict]], passages: list[dict] | None) -> dict[str, list[str]]:
    """Every entity-name word the renaming may use, by role (``generate.name_word_groups``): the titles of the
    retrieved passages and of the whole corpus; subject/bridge words no passage at hand names go to ``other``."""

    docs = {h["contents"]: h for hits in results for h in hits}
    docs.update({p["contents"]: p for p in passages or []})
    groups = name_word_groups(list(docs.values()))
    typed = {w for words in groups.values() for w in words}
    other = sorted({w for r in rows for key in ("subject", "bridge") for w in r["metadata"][key].split()} - typed)
    return {**groups, "other": other} if other else groups


def year_pool(cfg: WorldConfig, results: list[list[dict]], passages: list[dict] | None) -> list[str] | None:
    """The years the renaming maps onto: with ``cfg.tokenizer_year_tokens`` the years of the corpus (each one token),
    else None (any year 1000-1999)."""
    if not cfg.tokenizer_year_tokens:
        return None
    docs = passages if passages else [h for hits in results for h in hits]
    return corpus_years([d["contents"] for d in docs]) or None


class NameShuffler:
    """Rename a trajectory consistently: every entity-name word -> a random other name word *of the same role*
    (a city for a city, a person's last name for a last name, ...), every year -> another year of ``years`` (the
    corpus' years; without them, any year 1000-1999); one bijection per trajectory, applied to prompt, generated
    text and retrieved documents alike.

    A tiny model otherwise *memorises* the training entities (question -> query, entity -> fact) instead of
    learning to copy them from the context, and scores zero on the unseen test entities; after renaming, the only
    way to predict the query and the answer is to copy them from the question and the documents.

    Why by role: a name word's embedding then says what it names, as a real LM's does ("Paris" is a city), and the
    answer to "in which city ..." is the city-word in the right passage. Renamed across roles (one pool), a word
    is a city in one trajectory and a founder in the next, its type lives only in its context, and the tiny model
    rarely found the answer (measured on the default world, docs/lab.md: the whole build went from
    test EM 0.04 to 0.12 and from a gold passage retrieved 0.57 to 0.80 of the time, greedy, when the renaming
    kept roles). Every role's words, test entities' included,
    are in its group, so no fact leaks: the renaming is random per trajectory.

    ``groups``: role -> name words (a plain list is one group); fixed words (company suffixes, "River") are kept.
    """

    def __init__(self, groups: dict[str, list[str]] | list[str], years: list[str] | None = None):
        groups = {"names": groups} if isinstance(groups, list) else groups
        seen: set[str] = set()
        self.groups: list[list[str]] = []
        for words in groups.values():
            words = sorted({w for w in words if w not in _FIXED_WORDS} - seen)
            seen.update(words)
            if words:
                self.groups.append(words)
        if not seen:
            raise ValueError("no name words to shuffle")
        self.words = sorted(seen, key=lambda w: (-len(w), w))
        self.group_of = {w: k for k, words in enumerate(self.groups) for w in words}
        # a candidate word: a run of letters (names are invented letter words); only those in ``group_of`` change
        self.word_re = re.compile(r"\b([A-Za-z]+)\b")
        # years: with ``years`` (the corpus' years, one token each) a bijection onto those years, else any year
        # 1000-1999 (digit tokens)
        self.years = sorted(set(years)) if years else None
        self.year_set = set(self.years or ())
        self.year_re = re.compile(YEAR_PATTERN if self.years else r"\b(1\d{3})\b")

    def _mapping(self, texts: list[str], rng: random.Random) -> tuple[dict[str, str], dict[str, str]]:
        """One trajectory's bijections: each name word of ``texts`` -> a distinct word of its group, each pool year
        -> a distinct pool year (drawn only for the words and years the trajectory holds: the same law as a
        permutation of the whole pool, at a cost independent of the pool's size)."""
        present: list[set[str]] = [set() for _ in self.groups]
        found_years: set[str] = set()
        for text in texts:
            for w in self.word_re.findall(text):
                k = self.group_of.get(w)
                if k is not None:
                    present[k].add(w)
            found_years.update(y for y in self.year_re.findall(text) if y in self.year_set)
        names: dict[str, str] = {}
        for k, words in enumerate(present):
            ordered = sorted(words)
            names.update(zip(ordered, rng.sample(self.groups[k], len(ordered))))
        ordered_years = sorted(found_years)
        years = dict(zip(ordered_years, rng.sample(self.years, len(ordered_years)))) if ordered_years else {}
        return names, years

    def __call__(self, segments: list[Segment], rng: random.Random) -> list[Segment]:
        texts = [seg.text for seg in segments] + [h["contents"] for seg in segments for h in seg.hits or []]
        names, years = self._mapping(texts, rng)

        def new_year() -> str:
            return rng.choice(self.years) if self.years else str(rng.randint(1000, 1999))

        def rename(text: str) -> str:
            text = self.word_re.sub(lambda m: names.get(m.group(1), m.group(1)), text)
            return self.year_re.sub(lambda m: years.setdefault(m.group(1), new_year()), text)

        out = []
        for seg in segments:
            hits = None if seg.hits is None else [{**h, "contents": rename(h["contents"])} for h in seg.hits]
            out.append(Segment(rename(seg.text), seg.generated, hits))
        return out


