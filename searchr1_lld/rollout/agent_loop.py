"""The multi-turn Search-R1 agent loop with exact token bookkeeping.

Each QA row is repeated ``n`` times (``group_id`` = row index). Every turn, the still-active trajectories (and only
those) go to the engine in ONE ``backend.generate`` call; the engine samples until ``</search>``, ``</answer>``, eos
or ``max_tokens_per_turn``. Then each trajectory's turn is classified on the decoded text of the turn's generated
ids (Search-R1's rule: the first ``<(search|answer)> .. </\\1>`` in the turn):

- closed ``<answer> .. </answer>``           -> the trajectory ends (finish_reason ``answer``);
- closed ``<search> q </search>`` (q non-empty) -> q joins this turn's ONE batched ``retriever.search`` call; the
  observation ``format_observation(hits)`` is tokenised once and appended with mask 0;
- anything else (no closed tag, empty query, eos, per-turn length limit, empty turn) -> invalid action:
  ``INVALID_ACTION_MESSAGE`` (tokenised once per run) is appended with mask 0; no search; the turn is consumed.

Turn budget (the exact rule): turns ``0 .. max_turns - 1`` may search (each search or invalid action consumes one of
them, so ``valid_searches <= max_turns``); turn ``max_turns`` is the final turn and may only answer. A final turn
without a closed answer (a search, anything else) counts as an invalid action and ends the trajectory with
finish_reason ``length`` if that turn hit ``max_tokens_per_turn``, else ``max_turns``; nothing is appended after it.

Length budget: ``len(prompt_ids) + len(response_ids) <= max_total_length``. A turn's output is cut to the remaining
budget; a trajectory that fills the budget (or whose next observation would fill it, leaving no token to generate)
ends with ``truncated=True`` and finish_reason ``truncated`` unless that very turn closed an answer. An observation
that does not fit is not appended (a partial observation before the end would train nothing).

Observation (Search-R1's format, ``prompts.format_observation``): tokenised in one piece when it fits in
``max_obs_length`` tokens (then its ids are Search-R1's); otherwise the ``<information>`` body (documents) is cut so
that the whole block is ``max_obs_length`` tokens and the closing ``</information>\\n\\n`` tokens are kept intact
(Search-R1 cuts the block's ids, closing tag included).

Answer mask: the last ``<answer> .. </answer>`` of the final turn is found on the turn's *decoded text*
(``rewards.answer_char_span``, the reward's own pairing); its tokens are the ones whose decoded characters overlap
that span, located from decoded prefix lengths. No tag token ids are assumed, so BPE spellings such as
``['<', 'answer', '>']`` or a close tag merged into ``' </'`` / ``'>.'`` are covered. A closed answer found in the
text whose tokens cannot be located leaves the mask empty and is counted (``rollout/answer_span_miss_frac``).

Token exactness: response ids are the engine's sampled ids (cut after the stop token); only observations are
tokenised; model output is decoded for stop detection, query extraction, prediction and logging, never re-encoded.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Optional

from tqdm.auto import tqdm

from searchr1_lld import prompts as P
from searchr1_lld.algo.spans import action_span_list
from searchr1_lld.config import RolloutConfig
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rewards import answer_char_span, exact_match, extract_answer
from searchr1_lld.rollout.backends.base import GenerationBackend, GenerationOutput, eos_token_ids
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


def _decode(tokenizer: Tokenizer, ids: list[int]) -> str:
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
            cache[k] = _decode(tokenizer, ids[:k])
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
# The loop
# --------------------------------------------------------------------------------------------------------------------


class _State:
    """Mutable per-trajectory state while the loop runs."""

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.done = False
        self.last_turn_ids: list[int] = []


def _append(traj: Trajectory, ids: list[int], mask: int, logprobs: Optional[list[float]]) -> None:
    traj.response_ids.extend(ids)
    traj.response_mask.extend([mask] * len(ids))
    if traj.engine_logprobs is not None:
        if logprobs is None:
            traj.engine_logprobs = None  # one turn without log-probs makes the whole trajectory's unknown
        else:
            traj.engine_logprobs.extend(logprobs)


def _finish(state: _State, reason: str, truncated: bool = False) -> None:
    state.done = True
    state.traj.finish_reason = reason
    state.traj.truncated = state.traj.truncated or truncated


def run_agent_loop(
    rows: list[dict],
    *,
    backend: GenerationBackend,
    tokenizer: Tokenizer,
    retriever: Retriever,
    cfg: RolloutConfig,
    n: int = 1,
    greedy: bool = False,
    template: str = "tiny",
    chat_template: str = "never",
    progress: bool = False,
    timings: Optional[dict[str, float]] = None,
) -> list[Trajectory]:
    """Roll out ``n`` trajectories per row (rules in the module docstring); fills prediction and EM reward.

    ``template`` / ``chat_template``: the prompt (``data.prompt_template`` / ``data.chat_template``, prompts.py).

    ``timings`` (optional dict) receives ``generate_s``, ``retrieve_s``, ``total_s`` and ``generated_tokens`` of
    this call (for benchmarks and logging).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    clock = _Clock(start=time.perf_counter())
    run = _Run.start(tokenizer, cfg, greedy)
    states = _initial_states(rows, run, n, template, chat_template)
    bar = tqdm(total=cfg.max_turns + 1, desc="rollout turns", disable=not progress, leave=False)
    for turn in range(cfg.max_turns + 1):
        active = [s for s in states if not s.done]
        if not active:
            break
        searches = _generate_turn(active, backend, run, turn == cfg.max_turns, clock)
        if searches:
            _search_and_observe(searches, retriever, run, turn, clock)
        bar.update(1)
        bar.set_postfix(active=sum(not s.done for s in states))
    bar.close()
    for state in states:
        if not state.done:  # unreachable: the final turn always finishes; kept as a loud guard
            raise RuntimeError("agent loop ended with an unfinished trajectory")
        _finalize(state, tokenizer)
    if timings is not None:
        timings.update(clock.report(states))
    return [s.traj for s in states]


@dataclass(frozen=True)
class _Run:
    """What every turn of one :func:`run_agent_loop` call shares: the settings, the tokenizer and the ids
    tokenised once per call (eos ids, the invalid-action message, the observation tokeniser)."""

    cfg: RolloutConfig
    tokenizer: Tokenizer
    greedy: bool  # the call's ``greedy``, or a temperature of 0
    eos_ids: set[int]
    invalid_ids: list[int]
    observe: ObservationTokenizer

    @classmethod
    def start(cls, tokenizer: Tokenizer, cfg: RolloutConfig, greedy: bool) -> _Run:
        return cls(
            cfg=cfg,
            tokenizer=tokenizer,
            greedy=greedy or cfg.temperature == 0,
            eos_ids=eos_token_ids(tokenizer),
            invalid_ids=tokenizer.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False),
            observe=ObservationTokenizer(tokenizer, cfg.max_obs_length),
        )

    def fills_budget(self, traj: Trajectory, extra: int = 0) -> bool:
        """Whether the trajectory, with ``extra`` more tokens, reaches ``max_total_length`` (no token left)."""
        return len(traj.prompt_ids) + len(traj.response_ids) + extra >= self.cfg.max_total_length


@dataclass
class _Clock:
    """Seconds spent in the engine and the retriever during one call, from ``start`` (``time.perf_counter``)."""

    start: float
    generate_s: float = 0.0
    retrieve_s: float = 0.0

    def report(self, states: list[_State]) -> dict[str, float]:
        return dict(
            generate_s=self.generate_s,
            retrieve_s=self.retrieve_s,
            total_s=time.perf_counter() - self.start,
            generated_tokens=float(sum(sum(s.traj.response_mask) for s in states)),
        )


def _initial_states(rows: list[dict], run: _Run, n: int, template: str, chat_template: str) -> list[_State]:
    """``n`` fresh trajectories per row (``group_id`` = row index), the prompt tokenised once per row; one whose
    prompt leaves no room for a single token is finished as truncated right away."""
    states: list[_State] = []
    for group_id, row in enumerate(rows):
        prompt_ids = encode_prompt(run.tokenizer, row["question"], template, chat_template)
        for _ in range(n):
            state = _State(Trajectory(row=row, group_id=group_id, prompt_ids=list(prompt_ids)))
            if run.fills_budget(state.traj):
                _finish(state, "truncated", truncated=True)
            states.append(state)
    return states


def _generate_turn(active: list[_State], backend: GenerationBackend, run: _Run, final_turn: bool,
                   clock: _Clock) -> list[tuple[_State, str]]:
    """One engine call for every active trajectory, each turn applied (:func:`_apply_turn`). Returns the valid
    searches [(state, query)] of this turn, in trajectory order."""
    cfg = run.cfg
    contexts = [s.traj.prompt_ids + s.traj.response_ids for s in active]
    budgets = [cfg.max_total_length - len(c) for c in contexts]  # all >= 1 by the invariant of _apply_turn
    max_new = min(cfg.max_tokens_per_turn, max(budgets))
    t0 = time.perf_counter()
    outputs = backend.generate(
        contexts, max_new_tokens=max_new, stop_strings=list(P.STOP_STRINGS), temperature=cfg.temperature,
        top_p=cfg.top_p, greedy=run.greedy,
    )
    clock.generate_s += time.perf_counter() - t0
    if len(outputs) != len(active):
        raise RuntimeError(f"backend returned {len(outputs)} outputs for {len(active)} prompts")
    searches: list[tuple[_State, str]] = []
    for state, out, budget in zip(active, outputs, budgets):
        searches.extend(_apply_turn(state, out, budget, final_turn, run))
    return searches


def _search_and_observe(searches: list[tuple[_State, str]], retriever: Retriever, run: _Run, turn: int,
                        clock: _Clock) -> None:
    """This turn's ONE batched ``retriever.search`` call; each hit list is recorded and its observation appended
    (mask 0), or the trajectory finished as truncated when the observation would fill the length budget."""
    queries = [q for _, q in searches]
    t0 = time.perf_counter()
    try:
        results = retriever.search(queries, topk=run.cfg.topk)
    except Exception as err:  # propagate as a clear step failure, never an empty <information>
        err.add_note(f"rollout turn {turn}: retriever.search failed for a batch of {len(queries)} queries "
                     f"(first: {queries[0]!r})")
        raise
    clock.retrieve_s += time.perf_counter() - t0
    if len(results) != len(queries):
        raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
    for (state, query), hits in zip(searches, results):
        traj = state.traj
        traj.queries.append(query)
        traj.retrieved_ids.append([str(h["id"]) for h in hits])
        traj.valid_searches += 1
        obs_ids = run.observe(hits)
        if run.fills_budget(traj, len(obs_ids)):
            _finish(state, "truncated", truncated=True)
        else:
            _append(traj, obs_ids, 0, [0.0] * len(obs_ids))


def _take_turn_output(state: _State, out: GenerationOutput, budget: int) -> tuple[list[int], bool]:
    """Append one turn's generated ids (cut to the remaining ``budget``) with mask 1 and count the turn. Returns
    (the ids appended, whether the turn stopped at ``max_tokens_per_turn``)."""
    traj = state.traj
    ids = list(out.token_ids)
    logprobs = None if out.logprobs is None else list(out.logprobs)
    cut_by_budget = len(ids) > budget
    if cut_by_budget:
        ids = ids[:budget]
        logprobs = None if logprobs is None else logprobs[:budget]
    _append(traj, ids, 1, logprobs)
    state.last_turn_ids = ids
    traj.num_turns += 1
    if not ids:
        traj.empty_turns += 1
    hit_turn_limit = out.finish_reason == "length" and not cut_by_budget
    if hit_turn_limit:
        traj.length_stops += 1
    return ids, hit_turn_limit


def _apply_turn(state: _State, out: GenerationOutput, budget: int, final_turn: bool,
                run: _Run) -> list[tuple[_State, str]]:
    """Append one turn's generated tokens and decide what follows. Returns [(state, query)] for a valid search."""
    traj = state.traj
    ids, hit_turn_limit = _take_turn_output(state, out, budget)
    kind, query = parse_action(_decode(run.tokenizer, ids)) if ids else ("invalid", None)
    if kind != "answer" and ids and ids[-1] in run.eos_ids:
        traj.eos_stops += 1
    if kind == "answer":
        _finish(state, "answer")
        return []
    if run.fills_budget(traj):
        _finish(state, "truncated", truncated=True)
        return []
    if final_turn:
        traj.invalid_actions += 1
        _finish(state, "length" if hit_turn_limit else "max_turns")
        return []
    if kind == "search":
        return [(state, query)]  # type: ignore[list-item]
    traj.invalid_actions += 1
    if run.fills_budget(traj, len(run.invalid_ids)):
        _finish(state, "truncated", truncated=True)
    else:
        _append(traj, run.invalid_ids, 0, [0.0] * len(run.invalid_ids))
    return []


_warned_span_miss = False


def _finalize(state: _State, tokenizer: Tokenizer) -> None:
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
        turn_text = _decode(tokenizer, last)
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
    traj.response_text = _decode(tokenizer, traj.response_ids)
    traj.check()

