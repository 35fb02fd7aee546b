"""Copy drills of the warm start: one prompt (and the observation its step would see) and the one generated segment
that copies a query or an answer out of the context; held-out probes of the same kind (:func:`build_drill_probes`,
scored by ``warm_start.copy_accuracy``) measure whether the copy circuit formed.
"""

from __future__ import annotations

import random

from searchr1_lld.data.prompts import format_observation, render_prompt
from searchr1_lld.world.config import WorldConfig
from searchr1_lld.world.questions import contains_phrase
from searchr1_lld.world.trajectories import (THINK_FIRST, NameShuffler, SearchFn, Segment, answer_think, bridge_think,
                                             name_pool, row_sampler, tokenize_many, year_pool)

COPY_DRILL_KINDS = ("subject_query", "bridge_query", "answer")


def _drill_segments(row: dict, kind: str, hits_of: dict[str, list[dict]], eos: str,
                    full_prompt: bool = True, think: str = "fixed", bridge: str = "fixed") -> list[Segment] | None:
    """One copy drill: the prompt, the observation the step would see, and the one generated segment that copies.

    ``subject_query``: question -> ``<search> subject </search>``; ``bridge_query`` (multi-hop): question + the
    subject's search and hits -> ``<search> bridge </search>``; ``answer``: question + the last hop's search and
    hits -> the answer's think (``answer_think`` in the style ``think`` names: the quote that ends with the gold
    answer, or ``found it``) then ``<answer> gold </answer>``; the bridge query's think is ``bridge_think`` in the
    style ``bridge`` names. The search before an observation is context, as in a
    rollout: it names the entity whose passage holds the target (without it, which of the three passages to read is
    a guess). The context starts with the rollout's prompt (``full_prompt``) or with just ``Question: ...`` (the
    curriculum's first stage). None when the observation does not contain what is to be copied (a drill must never
    teach to produce a name that is not in the context)."""
    meta = row["metadata"]
    question = Segment(render_prompt(row["question"], "tiny") if full_prompt else f"Question: {row['question']}\n",
                       generated=False)
    if kind == "subject_query":
        return [question, Segment(f"{THINK_FIRST[0]}<search> {meta['subject']} </search>", generated=True)]
    subject_query = Segment(f"{THINK_FIRST[0]}<search> {meta['subject']} </search>", generated=False)
    if kind == "bridge_query":
        hits = hits_of[meta["subject"]]
        if not any(contains_phrase(h["contents"], meta["bridge"]) for h in hits):
            return None
        return [question, subject_query, Segment(format_observation(hits), generated=False, hits=hits),
                Segment(f"{bridge_think(bridge, meta['bridge'], hits)}<search> {meta['bridge']} </search>",
                        generated=True)]
    last_query = (Segment(f"{bridge_think(bridge, meta['bridge'], hits_of[meta['subject']])}"
                          f"<search> {meta['bridge']} </search>", generated=False)
                  if meta["hops"] == 2 else subject_query)
    hits = hits_of[meta["bridge"] if meta["hops"] == 2 else meta["subject"]]
    gold = next((g for g in row["golden_answers"] if any(contains_phrase(h["contents"], g) for h in hits)), None)
    if gold is None:
        return None
    return [question, last_query, Segment(format_observation(hits), generated=False, hits=hits),
            Segment(f"{answer_think(think, gold, hits)}<answer> {gold} </answer>{eos}",
                    generated=True)]


def build_copy_drills(rows: list[dict], search: SearchFn, tokenizer, cfg: WorldConfig, topk: int = 3,
                      seed: int | None = None, passages: list[dict] | None = None
                      ) -> dict[str, list[tuple[list[int], list[int]]]]:
    """``cfg.warmstart_drills`` copy exercises (``_drill_segments``), names shuffled like the trajectories, as a
    curriculum of stages in order: ``answer`` (only when ``cfg.warmstart_drill_answer_first`` > 0: that share of
    the drills, answer drills only, ``Question: ...`` context), ``short`` (every kind, ``Question: ...`` context),
    ``full`` (the last ``cfg.warmstart_drill_prompt_share`` of the drills, every kind, starting from the rollout's
    whole prompt).

    Why: a freshly initialised transformer learns to copy only after a phase change (measured on the default world,
    ``docs/lab.md``: a question -> subject-query drill at lr 1e-3 goes from 0.00 to 1.00 first-token
    accuracy between steps 400 and 600; at lr 1e-2 it never does; 600 steps of whole trajectories at 1e-3 never
    get there either, the copy targets are 1% of their tokens). Drills are ~50-150 tokens, a third of them copy
    targets, so the phase change happens within the world's build budget; the trajectory phase then teaches the
    protocol on top of a policy that already copies. Why two stages: with the ~100-token instruction in front the
    phase change did not come within 1,500 steps; with the short context it comes, but then transfers poorly to the
    real prompt (first subject token 0.2) until drills on the real prompt follow. Kinds are drawn uniformly among
    those the row has (``bridge_query`` only for multi-hop rows); drills whose observation lacks the target are
    redrawn.

    The answer stage is an option (off by default): finding the answer in one of three passages forms in its own
    phase change, late in the default build (step ~2,300 of 2,500), and answer drills alone reached it by step ~500
    in one probe; but put first in real builds it did not bring the phase change forward (docs/lab.md).
    """
    if cfg.warmstart_drills <= 0:
        return {}
    for key in ("warmstart_drill_prompt_share", "warmstart_drill_answer_first"):
        if not 0 <= getattr(cfg, key) <= 1:
            raise ValueError(f"{key} must be in [0, 1] (got {getattr(cfg, key)})")
    if cfg.warmstart_drill_prompt_share + cfg.warmstart_drill_answer_first > 1:
        raise ValueError("warmstart_drill_prompt_share + warmstart_drill_answer_first must be <= 1 (shares of one "
                         f"drill budget; got {cfg.warmstart_drill_prompt_share} + {cfg.warmstart_drill_answer_first})")
    seed = cfg.seed if seed is None else seed
    draw = _drill_drawer(rows, search, tokenizer, cfg, topk, passages, random.Random(seed + 3))
    n_full = round(cfg.warmstart_drills * cfg.warmstart_drill_prompt_share)
    n_answer = round(cfg.warmstart_drills * cfg.warmstart_drill_answer_first)
    stages = {"answer": [draw(full_prompt=False, kind="answer") for _ in range(n_answer)],
              "short": [draw(full_prompt=False) for _ in range(cfg.warmstart_drills - n_full - n_answer)],
              "full": [draw(full_prompt=True) for _ in range(n_full)]}
    return {name: tokenize_many(drills, tokenizer) for name, drills in stages.items() if drills}


def build_practice_drills(rows: list[dict], search: SearchFn, tokenizer, cfg: WorldConfig, n: int, topk: int = 3,
                          seed: int | None = None, passages: list[dict] | None = None
                          ) -> list[tuple[list[int], list[int]]]:
    """``n`` whole-prompt answer drills for the trajectory phase (``cfg.warmstart_traj_drill_weight``): the copy
    that phase erodes is the answer's (the subject query's stays at 1.0), and a bridge-query drill would teach the
    second hop the warm start leaves to RL. Drawn with their own seed, names shuffled as in the trajectories."""
    seed = cfg.seed if seed is None else seed
    draw = _drill_drawer(rows, search, tokenizer, cfg, topk, passages, random.Random(seed + 13))
    return tokenize_many([draw(full_prompt=True, kind="answer") for _ in range(n)], tokenizer)


def build_drill_probes(rows: list[dict], search: SearchFn, tokenizer, cfg: WorldConfig, n_per_kind: int,
                       topk: int = 3, seed: int | None = None, passages: list[dict] | None = None
                       ) -> dict[str, dict[str, list[tuple[list[int], list[int]]]]]:
    """Held-out copy drills to measure the drill phase by: ``{context: {kind: [(ids, mask)] * n_per_kind}}`` for
    context ``short`` / ``full`` (the two curriculum stages) and every kind of ``COPY_DRILL_KINDS``; drawn with
    their own seed, so their (shuffled) names differ from the training drills'."""
    seed = cfg.seed if seed is None else seed
    draw = _drill_drawer(rows, search, tokenizer, cfg, topk, passages, random.Random(seed + 11))
    return {ctx: {kind: tokenize_many([draw(full_prompt=ctx == "full", kind=kind) for _ in range(n_per_kind)],
                                      tokenizer)
                  for kind in COPY_DRILL_KINDS} for ctx in ("short", "full")}


def _drill_drawer(rows, search: SearchFn, tokenizer, cfg: WorldConfig, topk: int, passages, rng: random.Random):
    """A function drawing one copy drill's segments (``_drill_segments``, names shuffled as in the trajectories):
    a random row (``row_sampler``: by family with ``cfg.warmstart_family_balance``), a random kind among those the
    row has (``bridge_query`` only for multi-hop rows; ``answer`` with probability
    ``cfg.warmstart_drill_answer_share`` when it is > 0) or the ``kind`` asked for; drills whose observation lacks the
    target are redrawn."""
    queries = sorted({r["metadata"][k] for r in rows for k in ("subject", "bridge") if r["metadata"][k]})
    hits_of = dict(zip(queries, search(queries, topk)))
    results = list(hits_of.values())
    renamer = (NameShuffler(name_pool(rows, results, passages), years=year_pool(cfg, results, passages))
               if cfg.warmstart_shuffle_names else None)
    draw_any = row_sampler(rows, cfg.warmstart_family_balance)
    draw_multi = row_sampler([r for r in rows if r["metadata"]["hops"] == 2], cfg.warmstart_family_balance)

    def draw(full_prompt: bool, kind: str | None = None) -> list[Segment]:
        for _ in range(1000):
            row = (draw_multi if kind == "bridge_query" else draw_any)(rng)
            kinds = COPY_DRILL_KINDS if row["metadata"]["hops"] == 2 else ("subject_query", "answer")
            pick = kind
            if pick is None and cfg.warmstart_drill_answer_share > 0:
                pick = "answer" if rng.random() < cfg.warmstart_drill_answer_share else rng.choice(kinds[:-1])
            segs = _drill_segments(row, pick or rng.choice(kinds), hits_of, tokenizer.eos_token,
                                   full_prompt=full_prompt, think=cfg.warmstart_answer_think,
                                   bridge=cfg.warmstart_bridge_think)
            if segs is not None:
                return renamer(segs, rng) if renamer else segs
        raise ValueError("cannot build copy drills: the retriever almost never returns the passages the questions "
                         "need (check the world's index)")
    return draw
