"""Backends: sampling math, stop detection, the HF KV-cache sampler, and the vLLM adapter's pure logic (fakes)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from searchr1_lld.config import RolloutConfig, VLLMConfig
from searchr1_lld.rollout.backends.base import GenerationOutput, StopDetector
from searchr1_lld.rollout.backends.hf import HFBackend, cache_keyword, sample_next_token, top_p_mask
from searchr1_lld.rollout.backends.kinds import backend_kind
from searchr1_lld.rollout.backends.vllm import (
    VLLMBackend,
    build_llm_kwargs,
    build_sampling_kwargs,
    convert_completion,
)
from test_rollout_support import enc, make_model, make_tokenizer

# ---------------------------------------------------------------------------------------------------- sampling math


def test_top_p_mask_hand_computed():
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.25, 0.25, 0.5]])
    keep = top_p_mask(probs, 0.6)
    assert keep[0].tolist() == [False, True, True]
    assert keep[1].sum() == 2 and bool(keep[1, 2])  # 0.5 plus one of the tied 0.25s
    # mass before each token (sorted 0.5, 0.3, 0.2) is 0, .5, .8: top_p=0.5 keeps only the best
    assert top_p_mask(probs[:1], 0.5).tolist() == [[False, True, False]]
    assert top_p_mask(probs[:1], 1.0).tolist() == [[True, True, True]]


def test_sample_next_token_logprob_convention_and_greedy():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 3.0, 1.0]])
    tok, lp = sample_next_token(logits, temperature=0.7, top_p=1.0, greedy=True)
    assert tok.tolist() == [0, 1]
    assert torch.allclose(lp, torch.log_softmax(logits, -1)[[0, 1], [0, 1]])  # temperature ignored when greedy
    g = torch.Generator().manual_seed(0)
    tok, lp = sample_next_token(logits, temperature=0.7, top_p=1.0, greedy=False, generator=g)
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, tok[:, None]).squeeze(-1)
    assert torch.allclose(lp, ref)


def test_top_p_never_samples_outside_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(2000, 1)
    g = torch.Generator().manual_seed(1)
    tok, _ = sample_next_token(logits, temperature=1.0, top_p=0.8, greedy=False, generator=g)
    counts = torch.bincount(tok, minlength=3).tolist()
    assert counts[2] == 0 and counts[0] > counts[1] > 0


# ---------------------------------------------------------------------------------------------------- stop detection


def test_stop_detector_matches_text_across_tokens_and_eos():
    tok = make_tokenizer()
    ids = enc("the river Keln flows from Mount Tor")
    det = StopDetector(tok, ["Keln flows"], [tok.eos_token_id])
    cut, stopped = det.cut(ids)
    assert stopped and tok.decode(cut).endswith("Keln flows") and len(cut) < len(ids)
    assert not det.is_stop(cut[:-1])
    cut, stopped = det.cut(enc("nothing here") + [tok.eos_token_id, 5, 6])
    assert stopped and cut[-1] == tok.eos_token_id
    cut, stopped = StopDetector(tok, ["</search>"]).cut(enc("<search> q </search> more"))
    assert stopped and cut == enc("<search> q </search>")


def test_generation_output_validates():
    with pytest.raises(ValueError, match="finish_reason"):
        GenerationOutput([1], [0.0], "eos")
    with pytest.raises(ValueError, match="logprobs"):
        GenerationOutput([1, 2], [0.0], "stop")


# ---------------------------------------------------------------------------------------------------- HF backend


def _forward_logprobs(model, prompt, gen):
    ids = torch.tensor([prompt + gen])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return lp.gather(-1, torch.tensor(gen)[:, None]).squeeze(-1), logits


def test_hf_greedy_batch_matches_single_prompt_and_forward_pass():
    tok, model = make_tokenizer(), make_model()
    prompts = [enc("Where is Lake Varo?"), enc("Question: what is the capital of Ostria and why?"), enc("Brelm")]
    be = HFBackend(model, tok, batch_size=8)
    outs = be.generate(prompts, max_new_tokens=12, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    for p, out in zip(prompts, outs):
        single = be.generate([p], max_new_tokens=12, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)[0]
        assert out.token_ids == single.token_ids and out.finish_reason == "length" and len(out.token_ids) == 12
        ref, logits = _forward_logprobs(model, p, out.token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)
        assert out.token_ids[0] == int(logits[len(p) - 1].argmax())


def test_hf_passes_the_kv_cache_by_the_name_the_model_takes():
    class Old(torch.nn.Module):  # transformers 4.x: past_key_values
        def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
            return input_ids

    class New(torch.nn.Module):  # transformers 5.x: cache (past_key_values deprecated, removed in 5.40)
        def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None, **kwargs):
            return input_ids

    class Wrapper(torch.nn.Module):  # passes **kwargs on to what it wraps (PEFT's models do)
        def __init__(self, inner=None):
            super().__init__()
            self.model = inner

        def forward(self, *args, **kwargs):
            return self.model(*args, **kwargs)

    assert cache_keyword(Old()) == "past_key_values" and cache_keyword(New()) == "cache"
    assert cache_keyword(Wrapper(Old())) == "past_key_values" and cache_keyword(Wrapper(Wrapper(New()))) == "cache"
    with pytest.raises(TypeError, match="neither"):
        cache_keyword(Wrapper())
    tok, model = make_tokenizer(), make_model()
    with warnings.catch_warnings():  # the installed transformers' model: no deprecated keyword on any call
        warnings.simplefilter("error", FutureWarning)
        outs = HFBackend(model, tok).generate([enc("Where is Lake Varo?")], max_new_tokens=4, stop_strings=[],
                                              temperature=1.0, top_p=1.0, greedy=True)
    assert len(outs[0].token_ids) == 4


def test_hf_stops_each_sequence_on_its_own_stop_string():
    tok, model = make_tokenizer(), make_model()
    prompts = [enc("Where is Lake Varo?"), enc("Brelm is the capital")]
    be = HFBackend(model, tok, batch_size=2)
    free = be.generate(prompts, max_new_tokens=10, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    stop = tok.decode(free[0].token_ids[:4])  # text of the first 4 tokens of sequence 0
    assert stop not in tok.decode(free[1].token_ids)
    outs = be.generate(prompts, max_new_tokens=10, stop_strings=[stop], temperature=1.0, top_p=1.0, greedy=True)
    k = len(outs[0].token_ids)
    assert outs[0].finish_reason == "stop" and k <= 4 and outs[0].token_ids == free[0].token_ids[:k]
    assert stop in tok.decode(outs[0].token_ids)
    assert outs[1].token_ids == free[1].token_ids and outs[1].finish_reason == "length"


def test_hf_sampling_is_seeded_and_reports_tempered_logprobs():
    tok, model = make_tokenizer(), make_model()
    prompts = [enc("Where is Lake Varo?")] * 3
    a = HFBackend(model, tok, seed=3).generate(prompts, max_new_tokens=6, stop_strings=[], temperature=0.8, top_p=0.9,
                                               greedy=False)
    b = HFBackend(model, tok, seed=3).generate(prompts, max_new_tokens=6, stop_strings=[], temperature=0.8, top_p=0.9,
                                               greedy=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    p = prompts[0]
    _, logits = _forward_logprobs(model, p, a[0].token_ids)
    ref = torch.log_softmax(logits[len(p) - 1 : -1] / 0.8, -1).gather(-1, torch.tensor(a[0].token_ids)[:, None])
    assert torch.allclose(torch.tensor(a[0].logprobs), ref.squeeze(-1), atol=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        HFBackend(model, tok).generate(prompts, max_new_tokens=2, stop_strings=[], temperature=0.0, top_p=1.0,
                                       greedy=False)


def test_hf_load_weights_streams_by_name_and_checks_the_set():
    tok, model = make_tokenizer(), make_model(seed=0)
    other = make_model(seed=1)
    shared = HFBackend(model, tok, shares_learner_weights=True)

    def never_read():
        raise AssertionError("a backend sharing the learner's module must not read the stream")
        yield  # pragma: no cover

    shared.load_weights(never_read())
    be = HFBackend(model, tok)
    prompt = [enc("Where is Lake Varo?")]
    kw = dict(max_new_tokens=8, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    before = be.generate(prompt, **kw)[0]
    be.load_weights((n, p.detach()) for n, p in other.named_parameters())
    for (n1, p1), (_, p2) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(p1, p2), n1
    after = be.generate(prompt, **kw)[0]
    assert after.logprobs != before.logprobs  # generation now follows the loaded weights
    with pytest.raises(KeyError, match="no parameter"):
        be.load_weights([("nope.weight", torch.zeros(1))])
    first = next(iter(other.named_parameters()))
    with pytest.raises(ValueError, match="not sent"):
        be.load_weights([(first[0], first[1].detach())])
    with pytest.raises(ValueError, match="shape"):
        be.load_weights([(first[0], torch.zeros(3))])


def test_sleeping_backend_refuses_to_generate():
    tok, model = make_tokenizer(), make_model()
    be = HFBackend(model, tok, shares_learner_weights=True)
    be.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        be.generate([enc("Brelm")], max_new_tokens=2, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    be.wake_up()
    assert len(be.generate([enc("Brelm")], max_new_tokens=2, stop_strings=[], temperature=1.0, top_p=1.0,
                           greedy=True)[0].token_ids) == 2


# ---------------------------------------------------------------------------------------------------- vLLM adapter


def test_vllm_param_building():
    cfg = RolloutConfig(vllm=VLLMConfig(gpu_memory_utilization=0.3), max_total_length=3000)
    kw = build_llm_kwargs("/models/qwen", cfg, seed=7)
    assert kw["model"] == kw["tokenizer"] == "/models/qwen" and kw["gpu_memory_utilization"] == 0.3
    assert kw["enable_sleep_mode"] is True and kw["max_model_len"] == 3000 and kw["seed"] == 7
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["distributed_executor_backend"] == "external_launcher"
    cfg.vllm.logprobs_mode = ""
    assert "logprobs_mode" not in build_llm_kwargs("/m", cfg)
    s = build_sampling_kwargs(max_new_tokens=500, stop_strings=["</search>", "</answer>"], temperature=1.0, top_p=0.9,
                              greedy=False, n=5)
    assert s["stop"] == ["</search>", "</answer>"] and s["include_stop_str_in_output"] is True
    assert (s["n"], s["temperature"], s["top_p"], s["max_tokens"], s["logprobs"]) == (5, 1.0, 0.9, 500, 0)
    assert s["skip_special_tokens"] is False
    g = build_sampling_kwargs(max_new_tokens=5, stop_strings=[], temperature=1.0, top_p=0.9, greedy=True)
    assert (g["temperature"], g["top_p"]) == (0.0, 1.0)


def test_vllm_one_independent_engine_per_rank():
    # 4 processes: 4 engines in the launcher's group, a seed each, no vLLM-internal data parallel (no lockstep)
    kws = [build_llm_kwargs("/m", RolloutConfig(), seed=100, rank=r, world_size=4) for r in range(4)]
    assert [k["seed"] for k in kws] == [100, 101, 102, 103]
    assert all(k["distributed_executor_backend"] == "external_launcher" and k["tensor_parallel_size"] == 1
               and "data_parallel_size" not in k for k in kws)
    with pytest.raises(ValueError, match="lockstep"):
        build_llm_kwargs("/m", RolloutConfig(vllm=VLLMConfig(tensor_parallel_size=2)), rank=0, world_size=8)
    with pytest.raises(ValueError, match="rank"):
        build_llm_kwargs("/m", RolloutConfig(), rank=4, world_size=4)


def test_vllm_builders_emit_only_declared_keywords(monkeypatch):
    import searchr1_lld.rollout.backends.vllm as vb

    monkeypatch.setitem(vb.VLLM_API, "LLM", tuple(k for k in vb.VLLM_API["LLM"] if k != "enable_sleep_mode"))
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        build_llm_kwargs("/m", RolloutConfig())


def _completion(ids, lps, reason="stop", wrap=True):
    entries = [{t: (SimpleNamespace(logprob=lp, rank=1) if wrap else lp), 99: SimpleNamespace(logprob=-9.0)}
               for t, lp in zip(ids, lps)]
    return SimpleNamespace(token_ids=ids, logprobs=entries, finish_reason=reason)


def test_vllm_output_conversion():
    out = convert_completion(_completion([5, 6, 7], [-0.1, -0.2, -0.3]))
    assert out.token_ids == [5, 6, 7] and out.logprobs == pytest.approx([-0.1, -0.2, -0.3]) and out.finish_reason == "stop"
    assert convert_completion(_completion([5], [-0.5], "length", wrap=False)).logprobs == [-0.5]
    nolp = SimpleNamespace(token_ids=[1, 2], logprobs=None, finish_reason="length")
    assert convert_completion(nolp).logprobs is None
    missing = SimpleNamespace(token_ids=[1], logprobs=[{2: SimpleNamespace(logprob=-1.0)}], finish_reason="stop")
    with pytest.raises(RuntimeError, match="sampled token"):
        convert_completion(missing)
    with pytest.raises(RuntimeError, match="abort"):
        convert_completion(_completion([1], [-1.0], "abort"))


class FakeLLM:
    """The LLM surface the backend uses: generate, sleep, wake_up, collective_rpc("reload_weights"), reset_prefix_cache,
    apply_model (on a model holding ``held``: name -> shape, without a name mapper), llm_engine's
    has_unfinished_requests and model_config (dtype, padded vocabulary rows)."""

    def __init__(self, dtype=torch.float32, vocab_rows=None, held=None, resets=(True,), unfinished=False):
        self.log: list = []
        self.loaded: list = []
        self.model_config = SimpleNamespace(dtype=dtype, get_vocab_size=lambda: vocab_rows or len(make_tokenizer()),
                                            try_get_generation_config=lambda: self.generation_config)
        self.generation_config: dict = {}
        self.held = held or {}  # the engine model's parameters: name -> shape
        self.resets = list(resets)  # what reset_prefix_cache answers, call by call (the last one from then on)
        self.llm_engine = SimpleNamespace(has_unfinished_requests=lambda: unfinished)

    def generate(self, requests, sampling_params, use_tqdm):
        self.log.append(("generate", requests, sampling_params))
        return [SimpleNamespace(outputs=[_completion([len(r["prompt_token_ids"])], [-0.5])]) for r in requests]

    def sleep(self, level):
        self.log.append(("sleep", level))

    def wake_up(self, tags=None):
        self.log.append(("wake_up", tags))

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        self.loaded.extend(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        self.log.append(("reset_prefix_cache",))
        return self.resets.pop(0) if len(self.resets) > 1 else self.resets[0]

    def apply_model(self, func):
        model = SimpleNamespace(named_parameters=lambda: [(n, torch.empty(s)) for n, s in self.held.items()])
        return [func(model)]


def _vllm_backend(llm, monkeypatch, names=("weight", "bias"), **cfg):
    import searchr1_lld.rollout.backends.vllm as vb

    monkeypatch.setattr(vb, "model_parameter_names", lambda path: set(names))  # the fake engine's model
    be = VLLMBackend("/m", make_tokenizer(), RolloutConfig(**cfg), llm=llm)
    be._sampling_params = lambda **kw: build_sampling_kwargs(**kw)  # no vllm here: keep the kwargs
    return be


def test_vllm_backend_with_a_fake_engine(monkeypatch):
    llm = FakeLLM(held={"weight": (2, 2), "bias": (2,)})
    be = _vllm_backend(llm, monkeypatch)
    outs = be.generate([[1, 2, 3], [4]], max_new_tokens=8, stop_strings=["</search>"], temperature=1.0, top_p=1.0,
                       greedy=False)
    assert [o.token_ids for o in outs] == [[3], [1]]
    _, requests, params = llm.log[0]
    assert requests == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]}] and params["max_tokens"] == 8
    be.sleep()
    be.sleep()  # idempotent
    with pytest.raises(RuntimeError, match="asleep"):
        be.generate([[1]], max_new_tokens=1, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    model = torch.nn.Linear(2, 2)
    be.load_weights((n, p.detach()) for n, p in model.named_parameters())
    be.wake_up()
    assert [name for name, _ in llm.loaded] == ["weight", "bias"]
    assert torch.equal(dict(llm.loaded)["weight"], model.weight)
    assert llm.log[1:] == [("sleep", 2), ("wake_up", ["weights"]), ("reset_prefix_cache",), ("wake_up", ["kv_cache"])]
    assert not be.asleep


def test_vllm_sleep_mode_switch_does_what_it_says(monkeypatch):
    llm = FakeLLM(held={"w": (1,)})
    be = _vllm_backend(llm, monkeypatch, names=["w"], vllm=VLLMConfig(enable_sleep_mode=False))
    be.sleep()
    be.load_weights([("w", torch.zeros(1))])
    be.wake_up()
    assert llm.log == [("reset_prefix_cache",)]  # the engine kept its memory: no sleep / wake_up calls
    llm = FakeLLM()
    be = _vllm_backend(llm, monkeypatch, vllm=VLLMConfig(sleep_level=1))
    be.sleep()
    be.wake_up()  # no weight load in between: wake everything
    assert llm.log == [("sleep", 1), ("wake_up", None)]


def test_vllm_weights_are_cast_to_the_engine_dtype_and_must_all_arrive(monkeypatch):
    llm = FakeLLM(dtype=torch.bfloat16, held={"a.weight": (2,), "b.weight": (2,), "steps": (1,)})
    be = _vllm_backend(llm, monkeypatch, names=["a.weight", "b.weight", "steps"])
    w = torch.tensor([1.0, 2.0 ** -10 + 1.0])
    be.load_weights([("a.weight", w), ("b.weight", w.double()), ("steps", torch.tensor([3]))])
    loaded = dict(llm.loaded)
    assert loaded["a.weight"].dtype == loaded["b.weight"].dtype == torch.bfloat16
    assert loaded["a.weight"].tolist() == [1.0, 1.0]  # rounded to bf16's 8 mantissa bits
    assert loaded["steps"].dtype == torch.int64  # integer tensors are not floating-point weights: left as they are
    with pytest.raises(RuntimeError, match=r"did not receive 1 of the engine model's 3 parameters: b\.weight"):
        be.load_weights([("a.weight", w), ("steps", torch.tensor([3]))])


# Qwen2's layout in vLLM: q/k/v rows stacked into qkv_proj, the embedding padded to a multiple of 64, tied head
QWEN_LIKE_STREAM = {"model.embed_tokens.weight": (100, 8), "model.layers.0.self_attn.q_proj.weight": (8, 8),
                    "model.layers.0.self_attn.k_proj.weight": (4, 8), "model.layers.0.self_attn.v_proj.weight": (4, 8),
                    "model.norm.weight": (8,)}
QWEN_LIKE_HELD = {"model.embed_tokens.weight": (128, 8), "model.layers.0.self_attn.qkv_proj.weight": (16, 8),
                  "model.norm.weight": (8,)}


def _qwen_like_mapping(names):
    return {n: n.replace(".q_proj", ".qkv_proj").replace(".k_proj", ".qkv_proj").replace(".v_proj", ".qkv_proj")
            for n in names}


def test_what_the_engine_holds_is_compared_with_what_was_streamed():
    from searchr1_lld.rollout.backends.vllm_weights import engine_mismatches

    def mismatches(streamed, held=QWEN_LIKE_HELD):
        return engine_mismatches(streamed, _qwen_like_mapping(streamed), held)

    assert mismatches(QWEN_LIKE_STREAM) == []  # stacked rows add up, the padded embedding takes 100 rows
    skipped = mismatches({**QWEN_LIKE_STREAM, "lm_head.weight": (100, 8)})  # a tied engine has no lm_head
    assert skipped == ["streamed but not held by the engine model (vLLM skipped them): lm_head.weight"]
    unfilled = mismatches({k: v for k, v in QWEN_LIKE_STREAM.items() if k != "model.norm.weight"})
    assert unfilled == ["held by the engine model but not filled by the stream: model.norm.weight"]
    no_v = mismatches({k: v for k, v in QWEN_LIKE_STREAM.items() if ".v_proj" not in k})
    assert len(no_v) == 1 and no_v[0].startswith("model.layers.0.self_attn.qkv_proj.weight has shape (16, 8) in the "
                                                 "engine, the stream gave model.layers.0.self_attn.q_proj.weight (8, 8)")
    # 128 rows pad 100 rows, not 60
    assert len(mismatches({**QWEN_LIKE_STREAM, "model.embed_tokens.weight": (60, 8)})) == 1
    assert len(mismatches({**QWEN_LIKE_STREAM, "model.norm.weight": (8, 1)})) == 1
    mapped = {**_qwen_like_mapping(QWEN_LIKE_STREAM), "model.norm.weight": None}  # the model's name mapper drops it
    dropped = engine_mismatches(QWEN_LIKE_STREAM, mapped, QWEN_LIKE_HELD)
    assert dropped[0].endswith("skipped them): model.norm.weight")
    assert "not filled by the stream: model.norm" in dropped[1]


def test_a_load_the_engine_does_not_hold_stops_with_the_names(monkeypatch):
    llm = FakeLLM(held={"weight": (2, 2)})  # an engine model without the learner's bias
    be = _vllm_backend(llm, monkeypatch, names=("weight", "bias"))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r"not held by the engine model \(vLLM skipped them\): bias"):
        be.load_weights((n, p.detach()) for n, p in model.named_parameters())


def test_a_refused_prefix_cache_reset_is_retried_once_or_fails_with_the_reason(monkeypatch):
    names, held = ("w",), {"w": (1,)}
    llm = FakeLLM(held=held, resets=(False, True))  # blocks still being freed: the second ask succeeds
    _vllm_backend(llm, monkeypatch, names=names).load_weights([("w", torch.zeros(1))])
    assert llm.log.count(("reset_prefix_cache",)) == 2
    be = _vllm_backend(FakeLLM(held=held, resets=(False,)), monkeypatch, names=names)
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache with no request in the engine"):
        be.load_weights([("w", torch.zeros(1))])
    be = _vllm_backend(FakeLLM(held=held, resets=(False, True), unfinished=True), monkeypatch, names=names)
    with pytest.raises(RuntimeError, match="requests still in the engine hold KV blocks.*abort_requests"):
        be.load_weights([("w", torch.zeros(1))])


def test_vllm_padded_vocabulary_rows_are_never_allowed(monkeypatch):
    """The rows past the tokenizer get a logit bias of -inf (the only ids in the bias); more of them than vLLM's
    Model Runner V2 takes per request is an error when the backend is built."""
    import searchr1_lld.rollout.backends.vllm as vb

    tokens = len(make_tokenizer())
    be = _vllm_backend(FakeLLM(vocab_rows=tokens + 64), monkeypatch)
    be.generate([[1]], max_new_tokens=2, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False)
    assert be.llm.log[-1][2]["logit_bias"] == {t: float("-inf") for t in range(tokens, tokens + 64)}
    assert "allowed_token_ids" not in be.llm.log[-1][2] and be.vocab_limit == tokens
    be = _vllm_backend(FakeLLM(vocab_rows=tokens), monkeypatch)  # no padding: no mask, nothing to check per request
    be.generate([[1]], max_new_tokens=2, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False)
    assert "logit_bias" not in be.llm.log[-1][2] and be.vocab_limit is None
    _vllm_backend(FakeLLM(vocab_rows=tokens + vb.MAX_LOGIT_BIAS_ENTRIES), monkeypatch)
    with pytest.raises(ValueError, match=f"{vb.MAX_LOGIT_BIAS_ENTRIES + 1} embedding rows past .* Model Runner V2"):
        _vllm_backend(FakeLLM(vocab_rows=tokens + vb.MAX_LOGIT_BIAS_ENTRIES + 1), monkeypatch)


def test_vllm_launcher_env_keeps_what_is_set_and_picks_a_free_port(monkeypatch):
    from searchr1_lld.rollout.backends.vllm import set_launcher_env

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    set_launcher_env(0, 1)
    import os
    import socket

    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("0", "3", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))  # free: nobody listens there
    monkeypatch.setenv("MASTER_PORT", "29999")
    set_launcher_env(0, 1)
    assert os.environ["MASTER_PORT"] == "29999"


def test_vllm_sleep_mode_is_not_asked_for_where_the_platform_has_none():
    kw = build_llm_kwargs("/m", RolloutConfig(vllm=VLLMConfig(enable_sleep_mode=True)), sleep_mode_available=False)
    assert kw["enable_sleep_mode"] is False
    kw = build_llm_kwargs("/m", RolloutConfig(vllm=VLLMConfig(kv_cache_memory_bytes=1 << 26)))
    assert kw["kv_cache_memory_bytes"] == 1 << 26 and kw["enable_sleep_mode"] is True


@pytest.mark.parametrize("override, key", [
    ("rollout.vllm.tensor_parallel_size=2", "rollout.vllm.tensor_parallel_size"),
    ("rollout.vllm.sleep_level=3", "rollout.vllm.sleep_level"),
    ("algorithm.rollout_correction.cap=0.5", "algorithm.rollout_correction.cap"),
    ("algorithm.rollout_correction.mode=tokens", "algorithm.rollout_correction.mode"),
])
def test_engine_config_rejects_bad_values(override, key):
    """A bad engine setting stops the run: at load, or (the vLLM section) when its kind is chosen."""
    from searchr1_lld.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        backend_kind(load_config(None, ["rollout.backend=vllm", override]).rollout)
