"""Agent-loop bookkeeping with a scripted backend: masks, spans, turn rules, truncation, batching."""

from __future__ import annotations

import dataclasses

import pytest

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.rollout import run_agent_loop, to_batch
from searchr1_lld.rollout.agent_loop import ObservationTokenizer, encode_prompt, parse_action
from scripted_backends import ScriptedBackend
from test_rollout_support import DictRetriever, enc, make_tokenizer, row

CFG = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_obs_length=200, max_total_length=2048, topk=2)
SEARCH = "<think> I need the lake </think> <search> Lake Varo </search>"
ANSWER = "<think> found it </think> <answer> Ostria </answer>"


def run(scripts, rows=None, cfg=CFG, n=1, retriever=None, logprobs=True, **kw):
    tok = make_tokenizer()
    backend = ScriptedBackend(scripts, tok, logprobs=logprobs)
    retriever = retriever or DictRetriever()
    trajs = run_agent_loop(rows or [row(0)], backend=backend, tokenizer=tok, retriever=retriever, cfg=cfg, n=n, **kw)
    return trajs, backend, retriever


def test_parse_action_rules():
    assert parse_action("<think>a</think> <search> x y </search>") == ("search", "x y")
    assert parse_action("<answer> Paris </answer>") == ("answer", "Paris")
    assert parse_action("<search>  </search>") == ("invalid", None)
    assert parse_action("no tags here") == ("invalid", None)
    assert parse_action("<search> open only") == ("invalid", None)


def test_search_then_answer_exact_tokens_masks_spans():
    trajs, backend, retriever = run([[enc(SEARCH)], [enc(ANSWER)]])
    (t,) = trajs
    tok = make_tokenizer()
    gen1, gen2 = enc(SEARCH), enc(ANSWER)
    hits = DictRetriever().search(["Lake Varo"], topk=2)[0]
    obs = ObservationTokenizer(tok, CFG.max_obs_length)(hits)
    assert t.prompt_ids == encode_prompt(tok, row(0)["question"], "tiny")
    assert t.response_ids == gen1 + obs + gen2
    assert t.response_mask == [1] * len(gen1) + [0] * len(obs) + [1] * len(gen2)
    assert t.action_spans == [(0, len(gen1)), (len(gen1) + len(obs), len(t.response_ids))]
    ans_start = len(gen1) + len(obs) + gen2.index(tok.convert_tokens_to_ids("<answer>"))
    assert t.answer_mask == [0] * ans_start + [1] * (len(t.response_ids) - ans_start)
    assert t.engine_logprobs[len(gen1) : len(gen1) + len(obs)] == [0.0] * len(obs)
    assert t.engine_logprobs[: len(gen1)] == pytest.approx([-0.01 * (k + 1) for k in range(len(gen1))])
    assert (t.num_turns, t.valid_searches, t.invalid_actions) == (2, 1, 0)
    assert t.queries == ["Lake Varo"] and t.retrieved_ids == [[h["id"] for h in hits]]
    assert (t.finish_reason, t.truncated, t.prediction, t.reward) == ("answer", False, "Ostria", 1.0)
    assert retriever.calls == [(["Lake Varo"], 2)]
    # the second engine call saw exactly prompt + everything so far
    assert backend.calls[1]["prompts"] == [t.prompt_ids + gen1 + obs]
    assert backend.calls[0]["stop_strings"] == P.STOP_STRINGS
    assert t.response_text.endswith("<answer> Ostria </answer>")


def test_observation_is_tokenised_once_and_closing_tag_kept_when_truncated():
    tok = make_tokenizer()
    observe = ObservationTokenizer(tok, 25)
    ids = observe(DictRetriever().search(["Lake Varo"], topk=3)[0])
    tail = enc(P.INFO_CLOSE + "\n\n")
    assert len(ids) == 25 and ids[-len(tail) :] == tail
    # a block that fits is tokenised in one piece (the ids Search-R1 would append)
    hits = DictRetriever().search(["Lake Varo"], topk=1)[0]
    assert ObservationTokenizer(tok, 500)(hits) == enc(P.format_observation(hits))
    assert ids[:3] == enc("\n\n" + P.INFO_OPEN + "Doc")[:3]
    with pytest.raises(ValueError, match="max_obs_length"):
        ObservationTokenizer(tok, len(tail))(DictRetriever().search(["x"], topk=1)[0])
    cfg = dataclasses.replace(CFG, max_obs_length=25)
    (t,), _, _ = run([[enc(SEARCH)], [enc(ANSWER)]], cfg=cfg)
    assert t.response_mask.count(0) == 25


def test_stop_cuts_right_after_the_stop_token():
    trajs, backend, _ = run([[enc(SEARCH + " and then more text <answer> x </answer>")], [enc(ANSWER + " trailing")]])
    (t,) = trajs
    assert t.response_ids[: len(enc(SEARCH))] == enc(SEARCH)
    assert t.response_mask.index(0) == len(enc(SEARCH))
    assert t.response_ids[-1] == make_tokenizer().convert_tokens_to_ids("</answer>")


def test_invalid_action_appends_message_and_consumes_turn():
    bad = enc("I will just guess") + [make_tokenizer().eos_token_id]
    trajs, _, retriever = run([[bad], [enc(ANSWER)]])
    (t,) = trajs
    msg = enc(P.INVALID_ACTION_MESSAGE)
    assert t.response_ids == bad + msg + enc(ANSWER)
    assert t.response_mask == [1] * len(bad) + [0] * len(msg) + [1] * len(enc(ANSWER))
    assert (t.invalid_actions, t.valid_searches, t.num_turns, t.eos_stops) == (1, 0, 2, 1)
    assert t.finish_reason == "answer" and retriever.calls == []


def test_final_turn_may_only_answer():
    cfg = dataclasses.replace(CFG, max_turns=2)
    trajs, backend, retriever = run([[enc(SEARCH)]] * 3, cfg=cfg)
    (t,) = trajs
    assert len(backend.calls) == 3 and len(retriever.calls) == 2  # the final turn's search is not executed
    assert (t.num_turns, t.valid_searches, t.invalid_actions) == (3, 2, 1)
    assert t.finish_reason == "max_turns" and t.response_mask[-1] == 1  # nothing appended after the final turn
    assert len(t.action_spans) == 3 and t.prediction is None and t.reward == 0.0
    assert sum(t.answer_mask) == 0


def test_final_turn_hitting_the_turn_limit_is_length_and_counted():
    cfg = dataclasses.replace(CFG, max_turns=1, max_tokens_per_turn=5)
    long = enc("words words words words words words words words words")
    trajs, _, _ = run([[long], [long]], cfg=cfg)
    (t,) = trajs
    assert t.finish_reason == "length" and t.length_stops == 2 and t.invalid_actions == 2
    assert t.action_spans == [(0, 5), (5 + len(enc(P.INVALID_ACTION_MESSAGE)), len(t.response_ids))]


def test_only_active_trajectories_are_sent_and_searches_are_batched():
    rows = [row(0), row(1, "What is the capital of Ostria?", ["Brelm"]), row(2)]
    s2 = "<search> capital Ostria </search>"
    call0 = [enc(ANSWER), enc(SEARCH), enc(s2), enc("nothing"), enc(ANSWER), enc(SEARCH)]
    call1 = [enc("<answer> Brelm </answer>")] * 4
    trajs, backend, retriever = run([call0, call1], rows=rows, n=2)
    assert [t.group_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert len(backend.calls[0]["prompts"]) == 6 and len(backend.calls[1]["prompts"]) == 4
    active = [trajs[i] for i in (1, 2, 3, 5)]
    assert backend.calls[1]["prompts"] == [t.prompt_ids + t.response_ids[: t.action_spans[1][0]] for t in active]
    assert retriever.calls == [(["Lake Varo", "capital Ostria", "Lake Varo"], CFG.topk)]  # ONE call per turn
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert [t.num_turns for t in trajs] == [1, 2, 2, 2, 1, 2]
    assert trajs[3].invalid_actions == 1 and trajs[2].queries == ["capital Ostria"]


def test_total_length_budget_truncates_generation():
    tok = make_tokenizer()
    p = len(encode_prompt(tok, row(0)["question"], "tiny"))
    cfg = dataclasses.replace(CFG, max_total_length=p + 10)
    trajs, backend, _ = run([[enc("one two three four five six seven eight nine ten eleven twelve")]], cfg=cfg)
    (t,) = trajs
    assert backend.calls[0]["max_new_tokens"] == 10
    assert len(t.prompt_ids) + len(t.response_ids) == cfg.max_total_length
    assert t.truncated and t.finish_reason == "truncated" and t.response_mask == [1] * 10


def test_observation_that_does_not_fit_ends_the_trajectory_truncated():
    tok = make_tokenizer()
    p = len(encode_prompt(tok, row(0)["question"], "tiny"))
    cfg = dataclasses.replace(CFG, max_total_length=p + len(enc(SEARCH)) + 20)
    trajs, backend, retriever = run([[enc(SEARCH)]], cfg=cfg)
    (t,) = trajs
    assert t.truncated and t.finish_reason == "truncated" and t.valid_searches == 1
    assert t.response_ids == enc(SEARCH) and len(backend.calls) == 1 and len(retriever.calls) == 1


def test_answer_that_exactly_fills_the_budget_is_not_truncated():
    tok = make_tokenizer()
    p = len(encode_prompt(tok, row(0)["question"], "tiny"))
    cfg = dataclasses.replace(CFG, max_total_length=p + len(enc(ANSWER)))
    (t,), _, _ = run([[enc(ANSWER)]], cfg=cfg)
    assert t.finish_reason == "answer" and not t.truncated and t.reward == 1.0


def test_prompt_longer_than_budget_is_truncated_without_generation():
    tok = make_tokenizer()
    p = len(encode_prompt(tok, row(0)["question"], "tiny"))
    cfg = dataclasses.replace(CFG, max_total_length=p)
    (t,), backend, _ = run([], cfg=cfg)
    assert backend.calls == [] and t.truncated and t.response_ids == [] and t.num_turns == 0


def test_empty_turn_is_counted_and_invalid():
    (t,), _, _ = run([[[]], [enc(ANSWER)]])
    assert t.empty_turns == 1 and t.invalid_actions == 1 and t.finish_reason == "answer"
    assert t.response_ids[: len(enc(P.INVALID_ACTION_MESSAGE))] == enc(P.INVALID_ACTION_MESSAGE)


def test_answer_mask_covers_only_the_final_generated_answer():
    two = "<answer> Brelm </answer>"
    scripts = [[enc("<think> <answer> is a tag </think> <search> Lake Varo </search>")], [enc(two)]]
    (t,), _, _ = run(scripts)
    start = len(t.response_ids) - len(enc(two))
    assert t.answer_mask == [0] * start + [1] * len(enc(two))
    assert t.prediction == "Brelm" and t.reward == 0.0


def test_retriever_failure_propagates_with_context():
    class Down:
        def search(self, queries, topk):
            raise ConnectionError("retriever at 127.0.0.1:1 is down")

    with pytest.raises(ConnectionError, match="is down") as info:
        run([[enc(SEARCH)], [enc(ANSWER)]], retriever=Down())
    assert any("retriever.search failed" in note for note in info.value.__notes__)


def test_retriever_returning_wrong_number_of_lists_is_an_error():
    class Short(DictRetriever):
        def search(self, queries, topk):
            return super().search(queries, topk)[:-1]

    with pytest.raises(RuntimeError, match="result lists"):
        run([[enc(SEARCH)] * 2, [enc(ANSWER)] * 2], n=2, retriever=Short())


def test_greedy_and_sampling_settings_reach_the_engine_and_missing_logprobs_are_none():
    cfg = dataclasses.replace(CFG, temperature=0.0)
    (t,), backend, _ = run([[enc(ANSWER)]], cfg=cfg, logprobs=False)
    assert backend.calls[0]["greedy"] is True and t.engine_logprobs is None
    batch = to_batch([t], make_tokenizer().pad_token_id)
    assert batch.has_engine_logprobs is False and float(batch.engine_logprobs.abs().sum()) == 0.0
    (t2,), backend2, _ = run([[enc(ANSWER)]], cfg=dataclasses.replace(CFG, temperature=0.7, top_p=0.9))
    assert (backend2.calls[0]["greedy"], backend2.calls[0]["temperature"], backend2.calls[0]["top_p"]) == (False, 0.7, 0.9)


def test_to_batch_of_a_rollout_respects_the_convention():
    (t,), _, _ = run([[enc(SEARCH)], [enc(ANSWER)]])
    b = to_batch([t], make_tokenizer().pad_token_id)
    P_ = b.prompt_length
    assert b.input_ids[0, :P_].tolist() == t.prompt_ids and b.responses[0].tolist() == t.response_ids
    assert b.response_mask[0].tolist() == t.response_mask and b.answer_mask[0].tolist() == t.answer_mask
