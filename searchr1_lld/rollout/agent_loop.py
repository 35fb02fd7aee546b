"""The multi-turn Search-R1 agent loop with exact token bookkeeping.

Each QA row is repeated ``n`` times (``group_id`` = row index). Two schedulers apply the same per-trajectory rules
(``turn_rules.py``), chosen by ``rollout.scheduler``:

- turn-batched (:func:`run_agent_loop` here; HF, the scripted backend, and the reference): every turn, the still-active
  trajectories (and only those) go to the engine in ONE ``backend.generate`` call, and that turn's valid searches in
  ONE ``retriever.search`` call once every trajectory's turn has ended;
- continuous (``continuous.py``; the default with vLLM): each trajectory's next turn enters the engine as soon as its
  observation is ready, trajectories finish in any order, and the searches that become ready while no retrieval is
  running go to the retriever as one batch, while the engine keeps decoding the others.

Each turn the engine samples until ``</search>``, ``</answer>``, eos or ``max_tokens_per_turn``. Then each
trajectory's turn is classified on the decoded text of the turn's generated ids (Search-R1's rule: the first
``<(search|answer)> .. </\\1>`` in the turn):

- closed ``<answer> .. </answer>``           -> the trajectory ends (finish_reason ``answer``);
- closed ``<search> q </search>`` (q non-empty) -> q joins a batched ``retriever.search`` call; the
  observation ``format_observation(hits)`` is tokenised once and appended with mask 0;
- anything else (no closed tag, empty query, eos, per-turn length limit, empty turn) -> invalid action:
  ``INVALID_ACTION_MESSAGE`` (tokenised once per run) is appended with mask 0; no search; the turn is consumed.

Turn budget (the exact rule): turns ``0 .. max_turns - 1`` may search (each search or invalid action consumes one of
them, so ``valid_searches <= max_turns``); turn ``max_turns`` is the final turn and may only answer. A final turn
without a closed answer (a search, anything else) counts as an invalid action and ends the trajectory with
finish_reason ``length`` if that turn hit ``max_tokens_per_turn``, else ``max_turns``; nothing is appended after it.

Length budget: ``len(prompt_ids) + len(response_ids) <= max_total_length``. A turn's output is cut to the remaining
budget (the continuous scheduler asks the engine for no more than the budget: the same ids); a trajectory that fills
the budget (or whose next observation would fill it, leaving no token to generate) ends with ``truncated=True`` and
finish_reason ``truncated`` unless that very turn closed an answer. An observation that does not fit is not appended
(a partial observation before the end would train nothing).

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

import time
from typing import Optional

from tqdm.auto import tqdm

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.rollout.continuous import run_continuous, uses_continuous_scheduler
from searchr1_lld.rollout.turn_rules import (ObservationTokenizer, RolloutClock, RolloutRun, TrajectoryState,
                                             answer_token_span, apply_turn, encode_prompt, finalize_trajectory,
                                             initial_states, parse_action, record_search, search_batch)
from searchr1_lld.rollout.types import Trajectory

__all__ = ["ObservationTokenizer", "answer_token_span", "encode_prompt", "parse_action", "run_agent_loop"]


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
    seed: Optional[int] = None,
) -> list[Trajectory]:
    """Roll out ``n`` trajectories per row (rules in the module docstring); fills prediction and EM reward. The
    scheduler is ``cfg.scheduler``'s (:func:`~searchr1_lld.rollout.continuous.uses_continuous_scheduler`): the
    continuous one (:func:`~searchr1_lld.rollout.continuous.run_continuous`, same arguments) or the turn-batched
    loop below.

    ``template`` / ``chat_template``: the prompt (``data.prompt_template`` / ``data.chat_template``, prompts.py).

    ``seed``: every sampled request carries its own seed, derived from ``seed``, the trajectory's index and its turn
    (turn_rules.request_seed), so the same call samples the same tokens from the same logits whatever order the
    engine runs its requests in; None: the engine's own generator.

    ``timings`` (optional dict) receives ``generate_s``, ``retrieve_s``, ``retrieve_wait_s``, ``total_s``,
    ``generated_tokens`` and ``decode_iterations`` of this call (for benchmarks and logging; turn-batched: the sum
    over turns of the longest output of the turn, the engine iterations of a turn whose requests all run together).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if uses_continuous_scheduler(cfg, backend):
        return run_continuous(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=n,
                              greedy=greedy, template=template, chat_template=chat_template, progress=progress,
                              timings=timings, seed=seed)
    clock = RolloutClock(start=time.perf_counter())
    run = RolloutRun.start(tokenizer, cfg, greedy, eos_ids=getattr(backend, "eos_ids", None), seed=seed)
    states = initial_states(rows, run, n, template, chat_template)
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
        finalize_trajectory(state, tokenizer)
    if timings is not None:
        timings.update(clock.report(states))
    return [s.traj for s in states]


def _generate_turn(active: list[TrajectoryState], backend: GenerationBackend, run: RolloutRun, final_turn: bool,
                   clock: RolloutClock) -> list[tuple[TrajectoryState, str]]:
    """One engine call for every active trajectory, each turn applied (:func:`apply_turn`). Returns the valid
    searches [(state, query)] of this turn, in trajectory order."""
    cfg = run.cfg
    contexts = [s.context() for s in active]
    budgets = [run.budget(s.traj) for s in active]  # all >= 1 by the invariant of apply_turn
    max_new = min(cfg.max_tokens_per_turn, max(budgets))
    seeds = {} if run.seed is None or run.greedy else {"seeds": [run.seed_of(s) for s in active]}
    t0 = time.perf_counter()
    outputs = backend.generate(
        contexts, max_new_tokens=max_new, stop_strings=list(P.STOP_STRINGS), temperature=cfg.temperature,
        top_p=cfg.top_p, greedy=run.greedy, **seeds,
    )
    clock.generate_s += time.perf_counter() - t0
    clock.decode_iterations += max((len(out.token_ids) for out in outputs), default=0)
    if len(outputs) != len(active):
        raise RuntimeError(f"backend returned {len(outputs)} outputs for {len(active)} prompts")
    searches: list[tuple[TrajectoryState, str]] = []
    for state, out, budget in zip(active, outputs, budgets):
        searches.extend(apply_turn(state, out, budget, final_turn, run))
    return searches


def _search_and_observe(searches: list[tuple[TrajectoryState, str]], retriever: Retriever, run: RolloutRun, turn: int,
                        clock: RolloutClock) -> None:
    """This turn's ONE batched ``retriever.search`` call (the engine waits for it), each search recorded
    (:func:`record_search`)."""
    t0 = time.perf_counter()
    results = search_batch(retriever, [q for _, q in searches], run, where=f"rollout turn {turn}")
    clock.retrieve_s += time.perf_counter() - t0
    clock.retrieve_wait_s += time.perf_counter() - t0
    for (state, query), hits in zip(searches, results):
        record_search(state, query, hits, run)
