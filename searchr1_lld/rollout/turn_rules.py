"""The per-trajectory rules of a rollout, shared by both schedulers (agent_loop.py: the rules in full; the turn-
batched loop there and the continuous scheduler in continuous.py apply them turn by turn, trajectory by trajectory).

A trajectory's state moves only through these functions: :func:`initial_states` (prompts), :func:`apply_turn` (one
turn's engine output: what follows, search, invalid action or the end), :func:`record_search` (a search's hits and
their observation) and :func:`finalize_trajectory` (masks, spans, prediction, reward). Whatever the order in which a
scheduler calls them for different trajectories, each trajectory gets the same tokens for the same engine outputs.
"""

from __future__ import annotations

import hashlib
import re
import time
import warnings
from dataclasses import dataclass
from typing import Optional

from searchr1_lld.data import prompts as P
from searchr1_lld.algo.spans import action_span_list
from searchr1_lld.config import RolloutConfig
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rewards import answer_char_span, exact_match, extract_answer
from searchr1_lld.rollout.backends.base import GenerationOutput, eos_token_ids
from searchr1_lld.rollout.types import Trajectory

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


# --------------------------------------------------------------------------------------------------------------------
# Pure helpers (no engine, no retriever)
# --------------------------------------------------------------------------------------------------------------------


def parse_action(turn_text: str) -> tuple[str, Optional[str]]:
    """Classify one turn's generated text: ("answer", content) | ("search", query) | ("invalid", None).

    The first closed ``<search>..</search>`` or ``<answer>..</answer>`` decides (Search-R1); an empty query is invalid.
    """
    m = _ACTION.search(turn_text)
    if m is None:
        return "invalid", None
    kind, content = m.group(1), m.group(2).strip()
    if kind == "search" and not content:
        return "invalid", None
    return kind, content


def decode_ids(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass
class ObservationTokenizer:
    """Tokenises observation blocks once: whole when they fit, else documents cut so the block has max_obs_length
    tokens with the closing tag kept."""

    tokenizer: Tokenizer
    max_obs_length: int

    def __post_init__(self) -> None:
        self._tail_cache: dict[str, list[int]] = {}

    def _tail_ids(self, tail: str) -> list[int]:
        ids = self._tail_cache.get(tail)
        if ids is None:
            ids = self.tokenizer.encode(tail, add_special_tokens=False)
            if len(ids) >= self.max_obs_length:
                raise ValueError(
                    f"rollout.max_obs_length={self.max_obs_length} leaves no room for documents: the closing "
                    f"{tail!r} alone is {len(ids)} tokens"
                )
            self._tail_cache[tail] = ids
        return ids

    def __call__(self, hits: list[dict]) -> list[int]:
        text = P.format_observation(hits)
        return self.fit(text, self.tokenizer.encode(text, add_special_tokens=False))

    def fit(self, text: str, ids: list[int]) -> list[int]:
        """The block's ids from ``ids``, the encoding of the whole block ``text``: as they are when they fit, else
        the documents cut and the closing tag kept."""
        if len(ids) <= self.max_obs_length:
            return list(ids)
        cut = text.rfind(P.INFO_CLOSE)
        if cut < 0:
            raise ValueError("format_observation produced no closing tag")
        body, tail = text[:cut], text[cut:]
        tail_ids = self._tail_ids(tail)
        body_ids = self.tokenizer.encode(body, add_special_tokens=False)
        return body_ids[: self.max_obs_length - len(tail_ids)] + tail_ids


def encode_prompt(tokenizer: Tokenizer, question: str, template: str, chat_template: str = "never") -> list[int]:
    """Prompt ids: the rendered prompt (``prompts.render_prompt``) tokenised without added special tokens, as
    Search-R1 tokenises it (a chat template carries its own special tokens)."""
    text = P.render_prompt(question, template, tokenizer, chat_template)
    return list(tokenizer.encode(text, add_special_tokens=False))


def answer_token_span(tokenizer: Tokenizer, ids: list[int], text: str) -> tuple[int, int] | None:
    """Half-open token span of the last closed ``<answer>..</answer>`` in ``text = decode(ids)``, or None.

    With ``L(k) = len(decode(ids[:k]))`` (non-decreasing in k), the span's characters ``[a, b)`` are covered by the
    tokens ``s .. e-1`` where ``s = max{k : L(k) <= a}`` and ``e = min{k : L(k) >= b}``: exactly the tokens whose
    decoded characters overlap ``[a, b)``. Found by binary search (O(log n) decodes). None when the text has no
    closed answer, or when the prefix decode does not reproduce the span (then the caller counts a miss).
    """
    span = answer_char_span(text)
    if span is None:
        return None
    a, b = span
    n = len(ids)
    cache: dict[int, str] = {0: ""}

    def prefix(k: int) -> str:
        if k not in cache:
            cache[k] = decode_ids(tokenizer, ids[:k])
        return cache[k]

    lo, hi = 0, n  # s = max k with L(k) <= a
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(prefix(mid)) <= a:
            lo = mid
        else:
            hi = mid - 1
    s = lo
    lo, hi = s, n  # e = min k with L(k) >= b
    while lo < hi:
        mid = (lo + hi) // 2
        if len(prefix(mid)) >= b:
            hi = mid
        else:
            lo = mid + 1
    e = lo
    if e <= s or prefix(e)[a:b] != text[a:b]:
        return None
    return s, e


# --------------------------------------------------------------------------------------------------------------------
# A trajectory's state and its turn rules
# --------------------------------------------------------------------------------------------------------------------


def request_seed(rollout_seed: int, trajectory: int, turn: int) -> int:
    """The sampling seed of one engine request: trajectory ``trajectory`` (its index in the rollout call), turn
    ``turn`` (turns taken before it), in a rollout seeded ``rollout_seed``; 63 bits of a BLAKE2b hash of the three,
    so the requests of a rollout, and of any two rollouts with different seeds, draw independent streams."""
    digest = hashlib.blake2b(f"{int(rollout_seed)}:{int(trajectory)}:{int(turn)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class TrajectoryState:
    """Mutable per-trajectory state while a scheduler runs; ``index``: its place in the rollout call."""

    def __init__(self, traj: Trajectory, index: int = 0) -> None:
        self.traj = traj
        self.index = index
        self.done = False
        self.last_turn_ids: list[int] = []

    def context(self) -> list[int]:
        """What the engine continues for the next turn: prompt ids + response ids so far."""
        return self.traj.prompt_ids + self.traj.response_ids


def append_tokens(traj: Trajectory, ids: list[int], mask: int, logprobs: Optional[list[float]]) -> None:
    traj.response_ids.extend(ids)
    traj.response_mask.extend([mask] * len(ids))
    if traj.engine_logprobs is not None:
        if logprobs is None:
            traj.engine_logprobs = None  # one turn without log-probs makes the whole trajectory's unknown
        else:
            traj.engine_logprobs.extend(logprobs)


def finish(state: TrajectoryState, reason: str, truncated: bool = False) -> None:
    state.done = True
    state.traj.finish_reason = reason
    state.traj.truncated = state.traj.truncated or truncated


@dataclass(frozen=True)
class RolloutRun:
    """What every turn of one rollout call shares: the settings, the tokenizer and the ids
    tokenised once per call (the ids the engine stops on, the invalid-action message, the observation tokeniser),
    and the call's sampling seed."""

    cfg: RolloutConfig
    tokenizer: Tokenizer
    greedy: bool  # the call's ``greedy``, or a temperature of 0
    eos_ids: set[int]
    invalid_ids: list[int]
    observe: ObservationTokenizer
    seed: Optional[int] = None  # each request's seed derives from it (request_seed); None: the engine's generator

    @classmethod
    def start(cls, tokenizer: Tokenizer, cfg: RolloutConfig, greedy: bool, *, eos_ids: Optional[set[int]] = None,
              seed: Optional[int] = None) -> RolloutRun:
        """``eos_ids``: what the engine stops on (its ``eos_ids``; None: the tokenizer's eos)."""
        return cls(
            cfg=cfg,
            tokenizer=tokenizer,
            greedy=greedy or cfg.temperature == 0,
            eos_ids=set(eos_ids) if eos_ids else eos_token_ids(tokenizer),
            invalid_ids=tokenizer.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False),
            observe=ObservationTokenizer(tokenizer, cfg.max_obs_length),
            seed=seed,
        )

    def seed_of(self, state: TrajectoryState) -> Optional[int]:
        """The seed of the trajectory's next request (None: unseeded, or greedy)."""
        if self.seed is None or self.greedy:
            return None
        return request_seed(self.seed, state.index, state.traj.num_turns)

    def fills_budget(self, traj: Trajectory, extra: int = 0) -> bool:
        """Whether the trajectory, with ``extra`` more tokens, reaches ``max_total_length`` (no token left)."""
        return len(traj.prompt_ids) + len(traj.response_ids) + extra >= self.cfg.max_total_length

    def budget(self, traj: Trajectory) -> int:
        """Tokens the trajectory may still generate (>= 1 for an unfinished one: :func:`apply_turn` keeps it so)."""
        return self.cfg.max_total_length - len(traj.prompt_ids) - len(traj.response_ids)

    def is_final_turn(self, traj: Trajectory) -> bool:
        """Whether the trajectory's next turn is turn ``max_turns``, the one that may only answer (every turn so far
        was a search or an invalid action, so the turns taken are the turn's index)."""
        return traj.num_turns == self.cfg.max_turns


@dataclass
class RolloutClock:
    """Seconds spent in the engine and the retriever during one call, from ``start`` (``time.perf_counter``), and
    the engine's decode iterations (forward passes that sample one token for each running request).

    ``retrieve_wait_s``: the part of the retrieval time in which the engine had nothing to run (the turn-batched
    loop waits for every search; the continuous scheduler only when no request is left in the engine)."""

    start: float
    generate_s: float = 0.0
    retrieve_s: float = 0.0
    retrieve_wait_s: float = 0.0
    decode_iterations: int = 0

    def report(self, states: list[TrajectoryState]) -> dict[str, float]:
        return dict(
            generate_s=self.generate_s,
            retrieve_s=self.retrieve_s,
            retrieve_wait_s=self.retrieve_wait_s,
            decode_iterations=float(self.decode_iterations),
            total_s=time.perf_counter() - self.start,
            generated_tokens=float(sum(sum(s.traj.response_mask) for s in states)),
        )


def initial_states(rows: list[dict], run: RolloutRun, n: int, template: str,
                   chat_template: str) -> list[TrajectoryState]:
    """``n`` fresh trajectories per row (``group_id`` = row index), the prompt tokenised once per row; one whose
    prompt leaves no room for a single token is finished as truncated right away."""
    states: list[TrajectoryState] = []
    for group_id, row in enumerate(rows):
        prompt_ids = encode_prompt(run.tokenizer, row["question"], template, chat_template)
        for _ in range(n):
            state = TrajectoryState(Trajectory(row=row, group_id=group_id, prompt_ids=list(prompt_ids)), len(states))
            if run.fills_budget(state.traj):
                finish(state, "truncated", truncated=True)
            states.append(state)
    return states


def take_turn_output(state: TrajectoryState, out: GenerationOutput, budget: int,
                     turn_limit: int) -> tuple[list[int], bool]:
    """Append one turn's generated ids (cut to the remaining ``budget``) with mask 1 and count the turn. Returns
    (the ids appended, whether the turn stopped at ``turn_limit`` = ``max_tokens_per_turn``: a "length" finish
    with that many tokens; an engine stopped earlier by a smaller per-request limit, the budget, did not)."""
    traj = state.traj
    ids = list(out.token_ids)
    logprobs = None if out.logprobs is None else list(out.logprobs)
    cut_by_budget = len(ids) > budget
    if cut_by_budget:
        ids = ids[:budget]
        logprobs = None if logprobs is None else logprobs[:budget]
    append_tokens(traj, ids, 1, logprobs)
    state.last_turn_ids = ids
    traj.num_turns += 1
    if not ids:
        traj.empty_turns += 1
    hit_turn_limit = out.finish_reason == "length" and not cut_by_budget and len(ids) >= turn_limit
    if hit_turn_limit:
        traj.length_stops += 1
    return ids, hit_turn_limit


def apply_turn(state: TrajectoryState, out: GenerationOutput, budget: int, final_turn: bool,
               run: RolloutRun) -> list[tuple[TrajectoryState, str]]:
    """Append one turn's generated tokens and decide what follows. Returns [(state, query)] for a valid search."""
    traj = state.traj
    ids, hit_turn_limit = take_turn_output(state, out, budget, run.cfg.max_tokens_per_turn)
    kind, query = parse_action(decode_ids(run.tokenizer, ids)) if ids else ("invalid", None)
    if kind != "answer" and ids and ids[-1] in run.eos_ids:
        traj.eos_stops += 1
    if kind == "answer":
        finish(state, "answer")
        return []
    if run.fills_budget(traj):
        finish(state, "truncated", truncated=True)
        return []
    if final_turn:
        traj.invalid_actions += 1
        finish(state, "length" if hit_turn_limit else "max_turns")
        return []
    if kind == "search":
        return [(state, query)]  # type: ignore[list-item]
    traj.invalid_actions += 1
    if run.fills_budget(traj, len(run.invalid_ids)):
        finish(state, "truncated", truncated=True)
    else:
        append_tokens(traj, run.invalid_ids, 0, [0.0] * len(run.invalid_ids))
    return []


def search_batch(retriever: Retriever, queries: list[str], run: RolloutRun, where: str) -> list[list[dict]]:
    """One batched ``retriever.search`` call: a hit list per query, or the retriever's error with a note saying
    ``where`` and which batch (a failed search fails the step, never an empty ``<information>``)."""
    try:
        results = retriever.search(queries, topk=run.cfg.topk)
    except Exception as err:
        err.add_note(f"{where}: retriever.search failed for a batch of {len(queries)} queries (first: {queries[0]!r})")
        raise
    if len(results) != len(queries):
        raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
    return results


def record_search(state: TrajectoryState, query: str, hits: list[dict], run: RolloutRun) -> None:
    """A search's hits recorded and its observation appended (mask 0), or the trajectory finished as truncated
    when the observation would fill the length budget."""
    traj = state.traj
    traj.queries.append(query)
    traj.retrieved_ids.append([str(h["id"]) for h in hits])
    traj.valid_searches += 1
    obs_ids = run.observe(hits)
    if run.fills_budget(traj, len(obs_ids)):
        finish(state, "truncated", truncated=True)
    else:
        append_tokens(traj, obs_ids, 0, [0.0] * len(obs_ids))


_warned_span_miss = False


def finalize_trajectory(state: TrajectoryState, tokenizer: Tokenizer) -> None:
    """Masks, spans, prediction (from the final turn's text) and the EM reward.

    The answer span is searched in the final turn's generated ids only (the turn that closed the answer and ended
    the trajectory), so an unclosed ``<answer>`` in an earlier turn cannot pair across an observation.
    """
    global _warned_span_miss
    traj = state.traj
    traj.answer_mask = [0] * len(traj.response_ids)
    if traj.finish_reason == "answer":
        last = state.last_turn_ids
        offset = len(traj.response_ids) - len(last)  # nothing is appended after an answer
        turn_text = decode_ids(tokenizer, last)
        traj.prediction = extract_answer(turn_text)
        span = answer_token_span(tokenizer, last, turn_text)
        if span is not None:
            for j in range(offset + span[0], offset + span[1]):
                traj.answer_mask[j] = 1
        elif traj.prediction is not None and not _warned_span_miss:
            warnings.warn("a closed answer in the text could not be located in its tokens; its answer_mask is empty "
                          "(counted in rollout/answer_span_miss_frac)")
            _warned_span_miss = True
    traj.action_spans = action_span_list(traj.response_mask)
    traj.reward = exact_match(traj.prediction, traj.row.get("golden_answers", []))
    traj.response_text = decode_ids(tokenizer, traj.response_ids)
    traj.check()

