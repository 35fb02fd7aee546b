"""The tiny policy of the synthetic world: a BPE tokenizer and a warm-started Qwen2 causal LM of a few million params.

Tokenizer
    Byte-level BPE trained with ``tokenizers`` on the world's corpus and rendered prompts/observations, with *Qwen's
    own* pre-tokenisation (regex split, byte-level without its own regex, NFC) so that ``AutoTokenizer`` -- which
    rebuilds a ``Qwen2Tokenizer`` from vocab + merges with exactly that pipeline -- gives identical ids after reload.
    The 8 tags of ``prompts.TAG_TOKENS`` are single *added, non-special* tokens (``skip_special_tokens`` keeps them);
    ``<|endoftext|>`` is eos, ``<|pad|>`` is pad.

Model
    ``Qwen2ForCausalLM`` from ``Qwen2Config`` (sizes in ``WorldConfig``), warm-started by a short supervised phase on
    sampled trajectories of mixed quality (correct searches + answers, searches for the wrong entity, answers without
    searching, stopping after the first hop, malformed turns), rendered exactly as the rollout builds them:
    ``render_prompt`` ids, then generated segments and ``format_observation`` / ``INVALID_ACTION_MESSAGE`` blocks
    tokenised *separately* and concatenated. The loss weights generated tokens 1 and prompt/observation tokens
    ``warmstart_env_loss_weight`` (a little "pretraining" on copy-rich text). Each trajectory's entity names and
    years are consistently renamed at random (``NameShuffler``) so the model must *copy* queries and answers from
    the context instead of memorising training entities; every entity-name word is one token (the tokenizer sees
    each many times), so copying a name is copying one or two tokens; every year of the corpus is one added token
    (``WorldConfig.tokenizer_year_tokens``), so copying a year is copying one token too.
    Like a real base model it then follows the protocol often but not always, and answers correctly only sometimes.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from data.world import contains_phrase, passage_title
from searchr1_lld.config import WorldConfig
from searchr1_lld.prompts import (
    INVALID_ACTION_MESSAGE,
    TAG_TOKENS,
    doc_title_text,
    format_observation,
    render_prompt,
)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

SearchFn = Callable[[list[str], int], list[list[dict]]]  # retriever.search(queries, topk)

# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: str | Path | None = None,
                    year_tokens: list[str] | tuple[str, ...] = ()):
    """Train the byte-level BPE tokenizer on ``texts``; return it as a ``Qwen2Tokenizer`` (saved to ``out_dir``).

    ``vocab_size``: BPE tokens + the tags. ``year_tokens`` (``corpus_years``) are added on top, each with its
    leading space (``" 1874"``, as a name word is ``" Mouxra"``), as single added non-special tokens like the tags:
    Qwen's pre-tokenisation splits numbers into digits, so a year would otherwise be a four-token copy for the tiny
    policy, a different and much less reliable circuit than a name's one-token copy (docs/lab/warm_start.md).

    Pre-tokenisation is Qwen2's (``PRETOKENIZE_REGEX`` split + ByteLevel(use_regex=False) + NFC): the class
    ``AutoTokenizer`` picks for this directory rebuilds exactly this pipeline, so ids survive save/load.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    if vocab_size < 256 + 2 + len(TAG_TOKENS):
        raise ValueError(f"tokenizer_vocab_size must be >= {256 + 2 + len(TAG_TOKENS)} (byte alphabet + specials)")
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TAG_TOKENS), special_tokens=[EOS_TOKEN, PAD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tok.add_tokens([AddedToken(" " + y, special=False, normalized=False) for y in year_tokens])
    hf_tok = Qwen2Tokenizer(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None)
    check_tokenizer(hf_tok)
    if out_dir is not None:
        hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def check_tokenizer(tokenizer) -> None:
    """Raise if a tag is not one non-special token or eos/pad are missing."""
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("tokenizer needs an eos and a pad token")
    for tag in TAG_TOKENS:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tag {tag!r} is not a single token: {ids}")
        if tag in tokenizer.all_special_tokens:
            raise ValueError(f"tag {tag!r} must be a non-special added token (skip_special_tokens would drop it)")


def tokenizer_training_texts(passages: list[dict], rows: list[dict]) -> list[str]:
    """Corpus passages, rendered prompts and observation blocks: the text the tokenizer will see in rollouts."""
    texts = [p["contents"] for p in passages]
    texts += [render_prompt(r["question"]) for r in rows]
    texts += [format_observation(passages[i:i + 3]) for i in range(0, len(passages), 3)]
    texts.append(INVALID_ACTION_MESSAGE)
    texts += [f"<think> look it up </think>\n<search> {r['metadata']['subject']} </search>" for r in rows]
    # every word of every entity name (the passage titles), many times over, with and without a leading space:
    # BPE then merges each whole name word into ONE token, so copying a name is copying one token per word
    from data.world import COMPANY_SUFFIXES, INDUSTRIES, OCCUPATIONS

    name_words = sorted({w for p in passages for w in passage_title(p["contents"]).split()}
                        | set(OCCUPATIONS) | set(INDUSTRIES) | set(COMPANY_SUFFIXES))
    texts += [" ".join([w] * NAME_WORD_REPEATS) for w in name_words]
    texts += [w for w in name_words for _ in range(NAME_WORD_REPEATS // 4)]
    return texts


YEAR_PATTERN = r"\b([12]\d{3})\b"  # a four-digit year of the world (1000-2008) as a whole word


def corpus_years(texts: list[str]) -> list[str]:
    """The distinct four-digit years ``YEAR_PATTERN`` finds in ``texts`` (e.g. the corpus passages), sorted."""
    pattern = re.compile(YEAR_PATTERN)
    return sorted({m for t in texts for m in pattern.findall(t)})


_FIXED_WORDS = {"River", "Industries", "Works", "Company", "Holdings", "Trading", "Foundry"}  # kept by NameShuffler
NAME_WORD_REPEATS = 64  # occurrences of each name word in the tokenizer's training text


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def make_model(cfg: WorldConfig, tokenizer, max_positions: int = 4096, seed: int | None = None):
    """A fresh ``Qwen2ForCausalLM`` sized by ``cfg`` for ``tokenizer`` (tied embeddings, fp32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.model_hidden_size % cfg.model_heads:
        raise ValueError("model_hidden_size must be divisible by model_heads")
    if cfg.model_heads % cfg.model_kv_heads:
        raise ValueError("model_heads must be divisible by model_kv_heads")
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.model_hidden_size, intermediate_size=cfg.model_intermediate_size,
        num_hidden_layers=cfg.model_layers, num_attention_heads=cfg.model_heads,
        num_key_value_heads=cfg.model_kv_heads, max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0, use_cache=True,
    )
    torch.manual_seed(cfg.seed if seed is None else seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# Warm-start trajectories
# ----------------------------------------------------------------------------------------------------------------

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


def plan_trajectories(rows: list[dict], n: int, quality: float, seed: int,
                      one_hop_share: float = 0.0) -> list[TrajectoryPlan]:
    """Sample ``n`` trajectory plans over ``rows`` (share ``quality`` fully correct).

    ``one_hop_share``: share of the multi-hop rows' plans that stop after the first hop (``one_hop_only``), drawn
    before the quality draw (so that many fewer multi-hop plans are correct): a warm start whose most likely move
    after the first ``<information>`` of a multi-hop question is to answer, i.e. a decision RL can flip (search
    again), as Search-R1's RL teaches a base model to use the search engine. 0 = the quality draw alone."""
    if not 0 <= one_hop_share <= 1:
        raise ValueError(f"one_hop_share must be in [0, 1] (got {one_hop_share})")
    rng = random.Random(seed)
    pools = _answer_pools(rows)
    kinds, weights = zip(*FLAWED_KINDS.items())
    plans = []
    for _ in range(n):
        row = rng.choice(rows)
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
_THINK_FIRST = ["<think> look it up </think>\n"]
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
    came after 20 words of a template every city passage shares, and was not copied (docs/lab/warm_start.md,
    session 10)."""
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
    last words, as the answer does after ``answer_think``'s quote (docs/lab/warm_start.md, session 18)."""
    if style not in ANSWER_THINKS:
        raise ValueError(f"bridge think must be one of {ANSWER_THINKS} (got {style!r})")
    return (quote_think(bridge, hits) if style == "quote" else None) or _THINK_BRIDGE


def render_segments(plan: TrajectoryPlan, hits_of: dict[str, list[dict]], eos: str, rng: random.Random,
                    template: str = "tiny", tokenizer: Any = None, think: str = "fixed",
                    bridge: str = "fixed") -> list[Segment]:
    """The text pieces of one trajectory, exactly as the rollout would build them; ``think``: the answer's think
    line (``answer_think``; a guess after a search keeps ``found it``: it does not read the passages); ``bridge``:
    the second search's think line (``bridge_think``)."""
    segs = [Segment(render_prompt(plan.row["question"], template, tokenizer), generated=False)]
    if plan.malformed_turn is not None:
        segs.append(Segment(plan.malformed_turn + eos, generated=True))
        segs.append(Segment(INVALID_ACTION_MESSAGE, generated=False))
    for hop, query in enumerate(plan.queries):
        search_think = (rng.choice(_THINK_FIRST) if hop == 0
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
    5.4 s, docs/lab/warm_start.md, session 24). An observation longer than ``max_obs_length`` tokens is cut by
    ``ObservationTokenizer.fit``."""
    from searchr1_lld.rollout.agent_loop import ObservationTokenizer

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
                              cfg.warmstart_one_hop_share)
    queries = sorted({q for p in plans for q in p.queries})
    results = search(queries, topk) if queries else []
    hits_of = dict(zip(queries, results))
    rng = random.Random(seed + 1)
    segments = [render_segments(p, hits_of, tokenizer.eos_token, rng, think=cfg.warmstart_answer_think,
                                bridge=cfg.warmstart_bridge_think)
                for p in plans]
    if cfg.warmstart_shuffle_names:
        renamer = NameShuffler(_name_pool(rows, results, passages), years=_year_pool(cfg, results, passages))
        segments = [renamer(segs, rng) for segs in segments]
    return tokenize_many(segments, tokenizer)


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
        return [question, Segment(f"{_THINK_FIRST[0]}<search> {meta['subject']} </search>", generated=True)]
    subject_query = Segment(f"{_THINK_FIRST[0]}<search> {meta['subject']} </search>", generated=False)
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
    ``docs/lab/warm_start.md``: a question -> subject-query drill at lr 1e-3 goes from 0.00 to 1.00 first-token
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
    in one probe; but put first in real builds it did not bring the phase change forward (docs/lab/warm_start.md,
    session 5).
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
    a random row, a random kind among those the row has (``bridge_query`` only for multi-hop rows; ``answer`` with
    probability ``cfg.warmstart_drill_answer_share`` when it is > 0) or the ``kind`` asked for; drills whose
    observation lacks the target are redrawn."""
    queries = sorted({r["metadata"][k] for r in rows for k in ("subject", "bridge") if r["metadata"][k]})
    hits_of = dict(zip(queries, search(queries, topk)))
    results = list(hits_of.values())
    renamer = (NameShuffler(_name_pool(rows, results, passages), years=_year_pool(cfg, results, passages))
               if cfg.warmstart_shuffle_names else None)
    multi = [r for r in rows if r["metadata"]["hops"] == 2]

    def draw(full_prompt: bool, kind: str | None = None) -> list[Segment]:
        for _ in range(1000):
            row = rng.choice(multi if kind == "bridge_query" else rows)
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


@torch.no_grad()
def copy_accuracy(model, probes: dict[str, list[tuple[list[int], list[int]]]], pad_id: int,
                  batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced copy accuracy per drill kind: the share of probe drills whose generated segment (the think
    line and the copied query or answer) the model predicts token for token (argmax at every generated position)."""
    was_training = model.training
    model.eval()
    acc = {}
    for kind, examples in probes.items():
        if not examples:
            continue
        right = 0
        for ids, attn, lmask in _batches(examples, batch_size, pad_id, random.Random(0)):
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            target, scored = ids[:, 1:], lmask[:, 1:] > 0
            wrong = (logits.argmax(-1) != target) & scored
            right += int((~wrong.any(dim=1)).sum())
        acc[kind] = right / len(examples)
    model.train(was_training)
    return acc


def _name_pool(rows: list[dict], results: list[list[dict]], passages: list[dict] | None) -> dict[str, list[str]]:
    """Every entity-name word the renaming may use, by role (``data.world.name_word_groups``): the titles of the
    retrieved passages and of the whole corpus; subject/bridge words no passage at hand names go to ``other``."""
    from data.world import name_word_groups

    docs = {h["contents"]: h for hits in results for h in hits}
    docs.update({p["contents"]: p for p in passages or []})
    groups = name_word_groups(list(docs.values()))
    typed = {w for words in groups.values() for w in words}
    other = sorted({w for r in rows for key in ("subject", "bridge") for w in r["metadata"][key].split()} - typed)
    return {**groups, "other": other} if other else groups


def _year_pool(cfg: WorldConfig, results: list[list[dict]], passages: list[dict] | None) -> list[str] | None:
    """The years the renaming maps onto: with ``cfg.tokenizer_year_tokens`` the years of the corpus (each one token),
    else None (any year 1000-1999)."""
    if not cfg.tokenizer_year_tokens:
        return None
    docs = passages if passages else [h for hits in results for h in hits]
    return corpus_years([d["contents"] for d in docs]) or None


def permutation(rng: random.Random, items: list[str]) -> list[str]:
    """``rng.sample(items, len(items))``: the same permutation from the same draws, ~3x faster.

    CPython's ``Random.sample`` takes its pool branch when k = n: item ``i`` of the result is drawn uniformly from
    the ``n - i`` items not yet taken (``getrandbits`` of the bit length, rejected until below ``n - i``), and the
    last untaken item fills the gap. The warm start renames every name group per drill (64,000 drills, ~70 words a
    group): inlining the draw saves ~10 s of the default world's build and keeps its drills, hence the world, as
    they were (tests/test_data_policy.py checks the equality against ``Random.sample``).
    """
    pool = list(items)
    n = len(pool)
    getrandbits = rng.getrandbits
    out = [None] * n
    for i in range(n):
        left = n - i
        bits = left.bit_length()
        j = getrandbits(bits)
        while j >= left:
            j = getrandbits(bits)
        out[i] = pool[j]
        pool[j] = pool[left - 1]
    return out


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
    rarely found the answer (measured on the default world, docs/lab/warm_start.md: the whole build went from
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
        self.name_re = re.compile(r"\b(" + "|".join(map(re.escape, self.words)) + r")\b")
        # years: with ``years`` (the corpus' years, one token each) a bijection onto those years, else any year
        # 1000-1999 (digit tokens)
        self.years = sorted(set(years)) if years else None
        self.year_re = re.compile(YEAR_PATTERN if self.years else r"\b(1\d{3})\b")

    def __call__(self, segments: list[Segment], rng: random.Random) -> list[Segment]:
        names: dict[str, str] = {}
        for words in self.groups:
            names.update(zip(words, permutation(rng, words)))
        years: dict[str, str] = {}
        if self.years:
            years.update(zip(self.years, permutation(rng, self.years)))

        def new_year() -> str:
            return rng.choice(self.years) if self.years else str(rng.randint(1000, 1999))

        def rename(text: str) -> str:
            text = self.name_re.sub(lambda m: names[m.group(1)], text)
            return self.year_re.sub(lambda m: years.setdefault(m.group(1), new_year()), text)

        out = []
        for seg in segments:
            hits = None if seg.hits is None else [{**h, "contents": rename(h["contents"])} for h in seg.hits]
            out.append(Segment(rename(seg.text), seg.generated, hits))
        return out


# ----------------------------------------------------------------------------------------------------------------
# Supervised warm start
# ----------------------------------------------------------------------------------------------------------------


def masked_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over target tokens with ``loss_mask == 1``.

    logits [B, T, V], input_ids [B, T], loss_mask [B, T] (1 where token t is a generated token to learn).
    loss = sum_{b, t>=1} mask[b,t] * -log softmax(logits[b,t-1])[ids[b,t]] / sum mask[b, 1:]
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].float()
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


def generated_token_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         loss_mask: torch.Tensor) -> torch.Tensor:
    """Weighted next-token cross-entropy; the LM head runs only on the positions whose target has a weight > 0.

    ``loss_mask`` [B, T] holds per-token *weights* (``_batches``: 1 on generated tokens, ``warmstart_env_loss_weight``
    on prompt/observation tokens, 0 on padding): loss = sum_t w[t+1] * nll[t] / sum_t w[t+1]. With a 0/1 mask this is
    ``masked_lm_loss(model(input_ids).logits, input_ids, loss_mask)``; the LM head then skips the unmasked positions
    (with env weight > 0 nearly every position has a weight, and the saving is only the padding).
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    weights = loss_mask[:, 1:].float()  # [B, T-1]: position t predicts token t+1 with this weight
    select = weights > 0
    logits = model.lm_head(hidden[:, :-1][select])  # [N, V]
    nll = torch.nn.functional.cross_entropy(logits.float(), input_ids[:, 1:][select], reduction="none")  # [N]
    return (nll * weights[select]).sum() / weights[select].sum().clamp_min(1e-8)


def _batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rng: random.Random,
             env_weight: float = 0.0):
    """Length-bucketed padded batches (input_ids, attention_mask, loss_weight) in a random order.

    loss_weight [B, T] float: 1 on generated tokens, ``env_weight`` on prompt/observation tokens, 0 on padding."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        width = max(len(examples[i][0]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        lmask = torch.zeros((len(chunk), width), dtype=torch.float)
        for row, i in enumerate(chunk):
            x, m = examples[i]
            ids[row, : len(x)] = torch.tensor(x)
            attn[row, : len(x)] = 1
            gen = torch.tensor(m, dtype=torch.float)
            lmask[row, : len(x)] = gen + env_weight * (1.0 - gen)
        yield ids, attn, lmask


def _train_phase(model, opt, batches, steps: int, lr_at: Callable[[int], float], bar) -> list[float]:
    """Run ``steps`` AdamW steps of ``generated_token_loss`` over ``batches`` (lr from ``lr_at(step)``); losses."""
    losses: list[float] = []
    for step, (ids, attn, lmask) in enumerate(batches):
        if step >= steps:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = generated_token_loss(model, ids, attn, lmask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def warm_start(model, examples: list[tuple[list[int], list[int]]], cfg: WorldConfig, *, pad_id: int,
               batch_size: int = 16, progress: bool = True,
               drills: list[list[tuple[list[int], list[int]]]] = (),
               probes: dict[str, dict[str, list[tuple[list[int], list[int]]]]] | None = None) -> dict[str, Any]:
    """Supervised phase: copy drills (``build_copy_drills``) at lr ``cfg.warmstart_drill_lr``, then whole
    trajectories at peak lr ``cfg.warmstart_lr`` (lower: a high lr there undoes the copying), one AdamW.

    Drill phase: the curriculum's stages in order (``build_copy_drills``), batches of
    ``cfg.warmstart_drill_batch_size``, linear warmup over the first 10% of the drill-step budget (all drills once),
    then constant. With ``probes`` (``build_drill_probes``) and ``cfg.warmstart_drill_check_every`` > 0 a stage
    ends on evidence: every that many steps the teacher-forced copy accuracy (``copy_accuracy``) on the stage's
    held-out probes (short / full context) is measured, and the stage ends once its targets are met: ``answer``
    the answer accuracy ``cfg.warmstart_drill_answer_target``, ``short`` the subject-query accuracy
    ``cfg.warmstart_drill_subject_target`` (the stage is there to form the query copy circuit), the last stage
    (``full``) both, and the bridge-query accuracy ``cfg.warmstart_drill_bridge_target`` when it is > 0. Every stage
    but the last may use its own drills once; the last stage gets what is left of the budget, cycling over its
    drills.
    (The copy circuit forms in a phase change whose step varies from run to run: a fixed count stopped some builds
    before it, docs/lab/warm_start.md.)
    Trajectory phase: ``cfg.warmstart_epochs`` epochs of batches of ``batch_size``, cosine decay to 0 (with its own
    warmup when there are no drills). The loss is the LM loss on generated tokens (weight 1) plus, at weight
    ``cfg.warmstart_env_loss_weight``, on the prompt and observation tokens of the trajectories (a little
    "pretraining" on copy-rich text; drills weight only their generated segment).
    Returns ``{"first_loss", "final_loss", "steps", "tokens", "drill_steps", "drill_final_loss", "drill_stop",
    "drill_checks"}`` (final = mean of the last 10% of the trajectory phase; ``drill_stop``: stage name ->
    ``targets met`` / ``budget used``; ``drill_checks``: every measurement,
    ``{step, stage, context, <kind>: accuracy}``).
    """
    from tqdm.auto import tqdm

    if not examples:
        raise ValueError("no warm-start examples")
    rng = random.Random(cfg.seed + 2)
    lr = cfg.warmstart_lr
    drill_bs = cfg.warmstart_drill_batch_size
    drills = {name: stage for name, stage in (drills or {}).items() if stage}
    budget = sum(math.ceil(len(stage) / drill_bs) for stage in drills.values())
    traj_steps = math.ceil(len(examples) / batch_size) * cfg.warmstart_epochs
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    bar = tqdm(total=budget + traj_steps, desc="warm start", disable=not progress, leave=False)
    drill_losses: list[float] = []
    checks: list[dict[str, Any]] = []
    stops: dict[str, str] = {}
    warmup = max(1, budget // 10)
    check_every = cfg.warmstart_drill_check_every if probes else 0
    for si, (name, stage) in enumerate(drills.items()):
        last = si == len(drills) - 1
        context = "full" if name == "full" else "short"
        targets = {"subject_query": cfg.warmstart_drill_subject_target} if name != "answer" else {}
        if name == "answer" or last:
            targets["answer"] = cfg.warmstart_drill_answer_target
        if last and cfg.warmstart_drill_bridge_target > 0:
            targets["bridge_query"] = cfg.warmstart_drill_bridge_target
        stage_budget = (budget - len(drill_losses)) if last else math.ceil(len(stage) / drill_bs)
        batches = _cycle(lambda: _batches(stage, drill_bs, pad_id, rng))
        done, stop = 0, "budget used"
        while done < stage_budget:
            n = min(check_every or stage_budget, stage_budget - done)
            start = len(drill_losses)
            drill_losses += _train_phase(model, opt, batches, n,
                                         lambda s: cfg.warmstart_drill_lr * min(1.0, (start + s + 1) / warmup), bar)
            done += n
            if check_every:
                acc = copy_accuracy(model, probes[context], pad_id)
                checks.append({"step": len(drill_losses), "stage": name, "context": context, **acc})
                bar.set_postfix(**{k[:7]: f"{v:.2f}" for k, v in acc.items()})
                if all(acc.get(kind, 0.0) >= target for kind, target in targets.items()):
                    stop = "targets met"
                    break
        stops[name] = stop
    bar.total = len(drill_losses) + traj_steps
    bar.refresh()
    warmup = 0 if drills else max(1, traj_steps // 10)

    def traj_lr(s: int) -> float:
        return lr * min(1.0, (s + 1) / warmup if warmup else 1.0) * 0.5 * (1 + math.cos(math.pi * s / traj_steps))

    def traj_batches():
        for _ in range(cfg.warmstart_epochs):
            yield from _batches(examples, batch_size, pad_id, rng, cfg.warmstart_env_loss_weight)

    losses = _train_phase(model, opt, traj_batches(), traj_steps, traj_lr, bar)
    bar.close()
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    drill_tail = drill_losses[-max(1, len(drill_losses) // 10):]
    return {"first_loss": losses[0], "final_loss": sum(tail) / len(tail), "steps": len(losses),
            "tokens": sum(len(x) for x, _ in examples) * cfg.warmstart_epochs,
            "drill_steps": len(drill_losses),
            "drill_final_loss": sum(drill_tail) / len(drill_tail) if drill_losses else float("nan"),
            "drill_stop": stops, "drill_checks": checks}


def _cycle(make_iter: Callable[[], Any]):
    """Endless iteration: ``make_iter()`` again each time it is exhausted (a new random batch order per pass)."""
    while True:
        yield from make_iter()


def _same_call_once(search: SearchFn) -> SearchFn:
    """``search`` that retrieves each distinct (queries, topk) call once and returns its earlier result again (the
    same call, so the same hits as retrieving anew)."""
    done: dict[tuple[tuple[str, ...], int], list[list[dict]]] = {}

    def cached(queries: list[str], topk: int) -> list[list[dict]]:
        key = (tuple(queries), topk)
        if key not in done:
            done[key] = search(queries, topk)
        return done[key]
    return cached


def build_tiny_policy(out_dir: str | Path, passages: list[dict], train_rows: list[dict], search: SearchFn,
                      cfg: WorldConfig, *, progress: bool = True) -> dict[str, Any]:
    """Train the tokenizer (``out_dir/tokenizer``) and the warm-started model (``out_dir/model``); return stats."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    tok_dir, model_dir = out_dir / "tokenizer", out_dir / "model"
    years = corpus_years([p["contents"] for p in passages]) if cfg.tokenizer_year_tokens else []
    tokenizer = train_tokenizer(tokenizer_training_texts(passages, train_rows), cfg.tokenizer_vocab_size, tok_dir,
                                year_tokens=years)
    model = make_model(cfg, tokenizer)
    search = _same_call_once(search)  # the drills and their probes retrieve the same queries
    with tqdm(total=1, desc="warm-start data", disable=not progress, leave=False) as bar:
        examples = build_warmstart_examples(train_rows, search, tokenizer, cfg, passages=passages)
        drills = build_copy_drills(train_rows, search, tokenizer, cfg, passages=passages)
        probes = (build_drill_probes(train_rows, search, tokenizer, cfg, cfg.warmstart_drill_probes, passages=passages)
                  if drills and cfg.warmstart_drill_check_every > 0 else None)
        bar.update(1)
    stats = warm_start(model, examples, cfg, pad_id=tokenizer.pad_token_id, batch_size=cfg.warmstart_batch_size,
                       progress=progress, drills=drills, probes=probes)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))  # the model dir is self-contained too
    lengths = [len(x) for x, _ in examples]
    return {
        **stats,
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "examples": len(examples),
        "drills": sum(len(stage) for stage in drills.values()),
        "mean_example_tokens": sum(lengths) / len(lengths),
        "max_example_tokens": max(lengths),
    }


# ----------------------------------------------------------------------------------------------------------------
# Warm-start measurement (through the real rollout)
# ----------------------------------------------------------------------------------------------------------------


def is_format_valid(traj) -> bool:
    """A trajectory follows the protocol: it ends with a closed answer and had no invalid action."""
    return traj.finish_reason == "answer" and traj.invalid_actions == 0


def first_query_names_subject(traj) -> bool:
    """The first search names the question's subject: every word of ``metadata.subject`` is in the first query."""
    from searchr1_lld.rewards import normalize_answer

    if not traj.queries:
        return False
    words = set(normalize_answer(traj.queries[0]).split())
    return set(normalize_answer(traj.row["metadata"]["subject"]).split()) <= words


def answer_provenance(retrieved_ids: list[list[str]], golden_answers: list[str], prediction: str, correct: bool,
                      contents_of: dict[str, str]) -> dict[str, bool]:
    """Where one answer came from, judged from the passages retrieved in any turn (``contents_of``: doc id -> text):

    - ``gold_retrieved``: a retrieved passage contains a gold answer;
    - ``copied``: that, and the answer is right and is in such a passage (copied out of ``<information>``);
    - ``in_passages``: the answer (non-empty) is in some retrieved passage, right or wrong;
    - ``right_without_gold``: the answer is right although no retrieved passage contained a gold answer (recalled
      from training, or guessed).
    """
    passages = [contents_of[d] for d in sorted({d for turn in retrieved_ids for d in turn})]
    gold = [p for p in passages if any(contains_phrase(p, g) for g in golden_answers)]
    said = bool(prediction)
    return {"gold_retrieved": bool(gold),
            "copied": bool(gold) and correct and said and any(contains_phrase(p, prediction) for p in gold),
            "in_passages": said and any(contains_phrase(p, prediction) for p in passages),
            "right_without_gold": correct and not gold}


def provenance_rates(flags: list[dict[str, bool]]) -> dict[str, float]:
    """Rates over :func:`answer_provenance` flags of several answers: ``gold_retrieved_rate``,
    ``answer_copied_rate`` (among those that retrieved a gold passage; NaN when none did),
    ``answer_in_passages_rate`` and ``right_without_gold_rate`` (both over all answers)."""
    n = max(len(flags), 1)
    with_gold = [f for f in flags if f["gold_retrieved"]]
    return {"gold_retrieved_rate": len(with_gold) / n,
            "answer_copied_rate": sum(f["copied"] for f in with_gold) / len(with_gold) if with_gold else float("nan"),
            "answer_in_passages_rate": sum(f["in_passages"] for f in flags) / n,
            "right_without_gold_rate": sum(f["right_without_gold"] for f in flags) / n}


def summarize_trajectories(trajs: list, contents_of: dict[str, str] | None = None) -> dict[str, float]:
    """EM, format-valid rate, answer rate, mean valid searches of a list of trajectories, the share whose first query
    names the question's subject (``first_query_subject_rate``), and, with the corpus (``contents_of``: doc id ->
    contents), where the answers came from (:func:`provenance_rates`: ``gold_retrieved_rate``,
    ``answer_copied_rate``, ``answer_in_passages_rate``, ``right_without_gold_rate``).
    """
    n = max(len(trajs), 1)
    out = {
        "em": sum(t.reward for t in trajs) / n,
        "format_valid_rate": sum(is_format_valid(t) for t in trajs) / n,
        "answer_rate": sum(t.finish_reason == "answer" for t in trajs) / n,
        "mean_valid_searches": sum(t.valid_searches for t in trajs) / n,
        "first_query_subject_rate": sum(first_query_names_subject(t) for t in trajs) / n,
        "num": len(trajs),
    }
    if contents_of is not None:
        out.update(provenance_rates([answer_provenance(t.retrieved_ids, t.row["golden_answers"], t.prediction,
                                                       t.reward > 0.5, contents_of) for t in trajs]))
    return out


def measure_warm_start(world_dir: str | Path, *, retriever: Any = None, limit: int = 0, sample_n: int = 1,
                       seed: int = 0, progress: bool = False, rollout_cfg: Any = None) -> dict[str, Any]:
    """Roll the world's warm-started policy out on its test split with the world's real retriever.

    Returns ``{"greedy": summary, "sampled": summary, "by_hops": {1: em, 2: em}, ...}``: greedy decoding (how the
    evaluator scores) and temperature-1 sampling (what GRPO sees). Summary fields: see ``summarize_trajectories``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data.world import read_jsonl
    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.config import RolloutConfig
    from searchr1_lld.rollout.agent_loop import run_agent_loop
    from searchr1_lld.rollout.backends.hf import HFBackend

    world_dir = Path(world_dir)
    rows = read_jsonl(world_dir / "qa" / "test.jsonl")
    if limit:
        rows = rows[:limit]
    tokenizer = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(world_dir / "model"))
    model.eval()
    retriever = retriever or InProcessRetriever(world_dir / "index")
    cfg = rollout_cfg or RolloutConfig(temperature=1.0, top_p=1.0, max_turns=4, topk=3, max_tokens_per_turn=64)
    backend = HFBackend(model, tokenizer, batch_size=cfg.generation_batch_size, seed=seed)
    greedy = run_agent_loop(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=1,
                            greedy=True, progress=progress)
    sampled = run_agent_loop(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=sample_n,
                             greedy=False, progress=progress)
    contents_of = {p["id"]: p["contents"] for p in read_jsonl(world_dir / "corpus.jsonl")}
    by_hops: dict[str, float] = {}
    sampled_by_hops: dict[str, float] = {}
    for hops in (1, 2):
        sel = [t for t in greedy if t.row["metadata"]["hops"] == hops]
        if sel:
            by_hops[str(hops)] = sum(t.reward for t in sel) / len(sel)
        sel = [t for t in sampled if t.row["metadata"]["hops"] == hops]
        if sel:
            sampled_by_hops[str(hops)] = sum(t.reward for t in sel) / len(sel)
    return {"greedy": summarize_trajectories(greedy, contents_of), "sampled": summarize_trajectories(sampled, contents_of),
            "greedy_em_by_hops": by_hops, "sampled_em_by_hops": sampled_by_hops,
            "max_tokens_per_turn": cfg.max_tokens_per_turn, "max_turns": cfg.max_turns, "sample_n": sample_n,
            "test_questions": len(rows)}
