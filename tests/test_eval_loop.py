"""Evaluator through the real agent loop (scripted engine, dict retriever): greedy, 4 turns, top-3; EM recount."""

from __future__ import annotations

import json

import pytest

from searchr1_lld import evaluation as ev
from searchr1_lld.config import RolloutConfig
from scripted_backends import ScriptedBackend
from test_rollout_support import DictRetriever, enc, make_tokenizer, row

SEARCH = "<think> I need the lake </think> <search> Lake Varo </search>"
ANSWER = "<think> found it </think> <answer> Ostria </answer>"
RAMBLE = "<think> hmm </think> nothing"


def test_evaluate_with_agent_loop_and_recount(tmp_path):
    # every question: search, then answer "Ostria"; q0 and q3 expect "Brelm"
    rows = {"nq": [row(i, golds=("Ostria",) if i % 3 else ("Brelm",)) for i in range(6)]}
    tok = make_tokenizer()
    info = tok.convert_tokens_to_ids("<information>")

    def script(call, i, prompt):  # search first; answer once an observation is in the context (the instruction
        return enc(ANSWER if prompt.count(info) >= 2 else SEARCH)  # itself names <information> once)

    backend = ScriptedBackend(script, tok)
    retriever = DictRetriever()
    cfg = ev.eval_rollout_config(RolloutConfig(max_tokens_per_turn=64, max_obs_length=200, max_total_length=2048,
                                               temperature=1.0, n=5), max_turns=4, topk=3)
    res = ev.evaluate(rows, backend=backend, tokenizer=tok, retriever=retriever, rollout_cfg=cfg, out_dir=tmp_path,
                      batch_size=4, progress=False, name="scripted")
    # greedy, one response per question, top-3 documents, batches of 4 then 2
    assert all(c["greedy"] for c in backend.calls)
    assert [len(c["prompts"]) for c in backend.calls] == [4, 4, 2, 2]
    assert {topk for _, topk in retriever.calls} == {3}
    recs = ev.read_records(tmp_path / ev.TRAJECTORIES)
    assert [r["id"] for r in recs] == [f"q{i}" for i in range(6)]
    # EM from results.json equals a recount from the trajectories file
    recount = sum(r["prediction"] == "Ostria" and "Ostria" in r["golden_answers"] for r in recs) / len(recs)
    assert recount == pytest.approx(4 / 6)  # q0 and q3 expect "Brelm"
    on_disk = json.loads((tmp_path / ev.RESULTS_JSON).read_text())
    assert on_disk["datasets"]["nq"]["em"] == pytest.approx(recount) == pytest.approx(res["average_em"])
    r0 = recs[0]
    assert r0["queries"] == ["Lake Varo"] and len(r0["retrieved_ids"][0]) == 3
    assert r0["num_turns"] == 2 and r0["valid_searches"] == 1 and r0["finish_reason"] == "answer"
    assert r0["response_text"].endswith("<answer> Ostria </answer>")
    m = on_disk["datasets"]["nq"]
    assert (m["mean_valid_searches"], m["mean_turns"], m["invalid_action_rate"], m["truncation_rate"]) == (1, 2, 0, 0)


def test_invalid_actions_and_turn_limit_are_counted(tmp_path):
    tok = make_tokenizer()
    backend = ScriptedBackend(lambda call, i, prompt: enc(RAMBLE), tok)
    cfg = ev.eval_rollout_config(RolloutConfig(max_tokens_per_turn=64, max_obs_length=200, max_total_length=2048),
                                 max_turns=2, topk=3)
    res = ev.evaluate({"bamboogle": [row(0)]}, backend=backend, tokenizer=tok, retriever=DictRetriever(),
                      rollout_cfg=cfg, out_dir=tmp_path, batch_size=8, progress=False)
    m = res["datasets"]["bamboogle"]
    (rec,) = ev.read_records(tmp_path / ev.TRAJECTORIES)
    assert rec["prediction"] is None and m["em"] == 0.0 and m["answer_rate"] == 0.0
    assert m["invalid_action_rate"] == pytest.approx(rec["invalid_actions"] / rec["num_turns"]) and rec["invalid_actions"] > 0
