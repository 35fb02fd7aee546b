"""The continuous scheduler against the turn-batched loop on scripted engines: the same trajectories for the same
engine outputs while requests finish out of order, budgets and finish reasons, search batching, failures.

The scripted policies answer each context with a sequence chosen by a seeded draw from the context itself, so both
schedulers see the same outputs exactly when they build the same contexts (a scheduler that appended one token
differently would change every later draw). The scripted stream finishes a request of k tokens k steps after it
entered, so turns of different lengths finish in different engine iterations.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.rollout import run_agent_loop
from searchr1_lld.rollout.agent_loop import encode_prompt
from scripted_backends import ScriptedBackend, ScriptedStreamBackend
from searchr1_lld.rollout.continuous import run_continuous, uses_continuous_scheduler
from test_rollout_support import DictRetriever, enc, make_tokenizer, row

CFG = RolloutConfig(max_turns=3, max_tokens_per_turn=24, max_obs_length=60, max_total_length=400, topk=2)
TURNS = dataclasses.replace(CFG, scheduler="turns")
CONTINUOUS = dataclasses.replace(CFG, scheduler="continuous")
STEP_S = 0.001  # a scripted engine iteration sleeps this long (the retriever's thread runs meanwhile, as beside a GPU)


def outputs_to_draw_from() -> list[list[int]]:
    """Searches and answers of different lengths, invalid text, an empty query, a turn past max_tokens_per_turn,
    eos, an empty turn."""
    tok = make_tokenizer()
    think = ["<think> " + "the lake " * k + "</think> " for k in range(4)]
    return ([enc(t + "<search> Lake Varo </search>") for t in think]
            + [enc(t + "<search> Brelm Tower </search>") for t in think[:2]]
            + [enc(t + "<answer> Ostria </answer>") for t in think]
            + [enc("I am not sure about this one at all, let me think about the lake and the river again and more"),
               enc("<search> </search>"), enc("<think> done") + [tok.eos_token_id], []])


def drawn_policy(seed: int):
    choices = outputs_to_draw_from()

    def policy(_call: int, _i: int, prompt: list[int]) -> list[int]:
        return list(random.Random(hash((seed, tuple(prompt)))).choice(choices))

    return policy


def rows(k: int) -> list[dict]:
    return [row(i, question=f"Where is Lake Varo? ({i})") for i in range(k)]


def rollout(backend, cfg, n=3, k=8, retriever=None, **kw):
    timings: dict = {}
    trajs = run_agent_loop(rows(k), backend=backend, tokenizer=make_tokenizer(), retriever=retriever or DictRetriever(),
                           cfg=cfg, n=n, timings=timings, **kw)
    return trajs, timings


# (seed, max_total_length, max_turns): the prompts are 104 tokens; together these runs end trajectories in every way
CASES = [(0, 400, 3), (2, 300, 3), (4, 260, 2), (1, 400, 1)]


@pytest.mark.parametrize("seed, max_total_length, max_turns", CASES,
                         ids=["roomy", "tight-budget", "tighter-budget", "one-search"])
def test_both_schedulers_give_the_same_trajectories(seed, max_total_length, max_turns):
    limits = dict(max_total_length=max_total_length, max_turns=max_turns)
    ref, ref_t = rollout(ScriptedBackend(drawn_policy(seed), make_tokenizer()), dataclasses.replace(TURNS, **limits))
    stream = ScriptedStreamBackend(drawn_policy(seed), make_tokenizer(), step_s=STEP_S)
    got, got_t = rollout(stream, dataclasses.replace(CONTINUOUS, **limits))
    assert [dataclasses.asdict(t) for t in got] == [dataclasses.asdict(t) for t in ref]
    # requests finished out of order, in fewer engine iterations (the endings covered: the test below)
    entered = sorted({r["entered_at_step"] for r in stream.requests})
    assert len(entered) > max_turns + 1, "every request entered at a turn boundary: nothing ran out of order"
    assert got_t["decode_iterations"] == stream.steps < ref_t["decode_iterations"]
    assert got_t["generated_tokens"] == ref_t["generated_tokens"]


def test_the_draws_cover_invalid_actions_truncation_and_the_final_turn():
    """What the equivalence above runs through (its cases together)."""
    seen = []
    for seed, length, turns in CASES:
        trajs, _ = rollout(ScriptedBackend(drawn_policy(seed), make_tokenizer()),
                           dataclasses.replace(TURNS, max_total_length=length, max_turns=turns))
        seen += trajs
    assert {t.finish_reason for t in seen} == {"answer", "max_turns", "truncated", "length"}
    assert any(t.invalid_actions for t in seen) and any(t.valid_searches >= 2 for t in seen)
    assert any(t.eos_stops for t in seen) and any(t.empty_turns for t in seen) and any(t.length_stops for t in seen)


def scripted_by_question(plans: dict[str, list[str]]):
    """Each row's turns in order (the turn index is the number of turns its context already holds)."""
    info_close = enc(P.INFO_CLOSE)[-1]
    invalid = enc(P.INVALID_ACTION_MESSAGE)

    def policy(_call: int, _i: int, prompt: list[int]) -> list[int]:
        text = make_tokenizer().decode(prompt)
        (name,) = [q for q in plans if f"({q})" in text]
        response = prompt[len(encode_prompt(make_tokenizer(), f"Where is Lake Varo? ({name})", "tiny")):]
        turn = response.count(info_close) + sum(response[j:j + len(invalid)] == invalid for j in range(len(response)))
        return enc(plans[name][turn])

    return policy


SEARCH = "<search> Lake Varo </search>"
ANSWER = "<answer> Ostria </answer>"
RAMBLE = "no tags here " * 12  # past max_tokens_per_turn


def test_budgets_and_finish_reasons_when_trajectories_finish_out_of_order():
    plans = {"quick": [ANSWER], "searcher": [SEARCH, SEARCH, SEARCH, SEARCH], "rambler": ["umm", "umm", RAMBLE, ANSWER],
             "slow": ["<think> " + "the lake " * 6 + "</think> " + SEARCH, ANSWER]}
    qs = [row(i, question=f"Where is Lake Varo? ({name})") for i, name in enumerate(plans)]
    stream = ScriptedStreamBackend(scripted_by_question(plans), make_tokenizer(), step_s=STEP_S)
    retriever = DictRetriever()
    trajs = run_agent_loop(qs, backend=stream, tokenizer=make_tokenizer(), retriever=retriever, cfg=CONTINUOUS, n=1)
    by = {name: t for name, t in zip(plans, trajs)}
    assert (by["quick"].finish_reason, by["quick"].num_turns) == ("answer", 1)
    assert (by["searcher"].finish_reason, by["searcher"].valid_searches, by["searcher"].invalid_actions,
            by["searcher"].num_turns) == ("max_turns", 3, 1, 4)  # turn 3 may only answer
    assert (by["rambler"].finish_reason, by["rambler"].invalid_actions, by["rambler"].length_stops) == ("answer", 3, 1)
    assert (by["slow"].finish_reason, by["slow"].valid_searches) == ("answer", 1)
    # "slow"'s first turn was still decoding when "searcher" entered its second: no turn barrier
    searcher_second = [r for r in stream.requests if "(searcher)" in make_tokenizer().decode(r["prompt"])][1]
    slow_len = len(enc(plans["slow"][0]))
    assert searcher_second["entered_at_step"] < slow_len, (searcher_second["entered_at_step"], slow_len)
    assert all(len(t.prompt_ids) + len(t.response_ids) <= CONTINUOUS.max_total_length for t in trajs)
    ref = run_agent_loop(qs, backend=ScriptedBackend(scripted_by_question(plans), make_tokenizer()),
                         tokenizer=make_tokenizer(), retriever=DictRetriever(), cfg=TURNS, n=1)
    assert [dataclasses.asdict(t) for t in trajs] == [dataclasses.asdict(t) for t in ref]


def test_searches_that_become_ready_together_go_as_one_batch():
    plans = {f"s{i}": [SEARCH, ANSWER] for i in range(4)}
    qs = [row(i, question=f"Where is Lake Varo? ({name})") for i, name in enumerate(plans)]
    retriever = DictRetriever()
    run_agent_loop(qs, backend=ScriptedStreamBackend(scripted_by_question(plans), make_tokenizer(), step_s=STEP_S),
                   tokenizer=make_tokenizer(), retriever=retriever, cfg=CONTINUOUS, n=2)
    assert retriever.calls == [(["Lake Varo"] * 8, CFG.topk)]


class FailingRetriever:
    def search(self, queries, topk):
        raise ConnectionError("retriever down")


def test_a_failed_search_fails_the_rollout_and_leaves_no_request_in_the_engine():
    plans = {"searcher": [SEARCH, ANSWER], "rambler": [RAMBLE, RAMBLE, RAMBLE, ANSWER]}
    qs = [row(i, question=f"Where is Lake Varo? ({name})") for i, name in enumerate(plans)]
    stream = ScriptedStreamBackend(scripted_by_question(plans), make_tokenizer(), step_s=STEP_S)
    with pytest.raises(ConnectionError, match="retriever down") as info:
        run_agent_loop(qs, backend=stream, tokenizer=make_tokenizer(), retriever=FailingRetriever(), cfg=CONTINUOUS)
    assert any("continuous rollout" in note and "1 queries" in note for note in info.value.__notes__)
    assert not stream.has_unfinished_requests()


def test_the_scheduler_setting():
    plain, stream = ScriptedBackend([[]]), ScriptedStreamBackend(drawn_policy(0))
    assert uses_continuous_scheduler(CFG, stream) and not uses_continuous_scheduler(CFG, plain)  # auto
    assert not uses_continuous_scheduler(TURNS, stream) and uses_continuous_scheduler(CONTINUOUS, stream)
    with pytest.raises(ValueError, match="request-level API.*rollout.scheduler=turns"):
        uses_continuous_scheduler(CONTINUOUS, plain)
    with pytest.raises(ValueError, match="request-level API"):
        run_continuous(rows(1), backend=plain, tokenizer=make_tokenizer(), retriever=DictRetriever(), cfg=CFG)


class LaggingStreamBackend(ScriptedStreamBackend):
    """The scripted stream with asynchronous scheduling's visible behaviour (vLLM's default on GPU): a finished
    request is reported one or more steps late, and a seeded third of the steps return nothing at all, while the
    scheduler keeps adding requests."""

    def __init__(self, *args, seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = random.Random(seed)
        self.held: list[tuple[str, object]] = []  # finished, not reported yet
        self.empty_steps_with_requests_waiting = 0

    def step(self):
        self.held += super().step()
        if self.rng.random() < 1 / 3 or not self.held:
            self.empty_steps_with_requests_waiting += bool(self._running or self.held)
            return []
        out, self.held = self.held, []
        return out

    def has_unfinished_requests(self) -> bool:
        return super().has_unfinished_requests() or bool(self.held)

    def abort_requests(self, request_ids):
        super().abort_requests(request_ids)
        self.held = [(r, o) for r, o in self.held if r not in set(request_ids)]


@pytest.mark.parametrize("seed, max_total_length, max_turns", CASES,
                         ids=["roomy", "tight-budget", "tighter-budget", "one-search"])
def test_engine_steps_that_return_nothing_change_no_trajectory(seed, max_total_length, max_turns):
    limits = dict(max_total_length=max_total_length, max_turns=max_turns)
    ref, _ = rollout(ScriptedBackend(drawn_policy(seed), make_tokenizer()), dataclasses.replace(TURNS, **limits))
    lagging = LaggingStreamBackend(drawn_policy(seed), make_tokenizer(), step_s=STEP_S, seed=seed)
    got, timings = rollout(lagging, dataclasses.replace(CONTINUOUS, **limits))
    assert [dataclasses.asdict(t) for t in got] == [dataclasses.asdict(t) for t in ref]
    assert lagging.empty_steps_with_requests_waiting > 10 and not lagging.has_unfinished_requests()
    assert timings["decode_iterations"] == lagging.steps
