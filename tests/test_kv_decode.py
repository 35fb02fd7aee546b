"""The HF backend's KV decoder (rollout/backends/kv_decode.py) against the model(...) path it replaces: the same
greedy answers and samples, prefixes reused only while the weights are unchanged, and the slow path kept (with a
warning) for models it does not run."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.rollout.backends import kv_decode
from searchr1_lld.rollout.backends.hf import HFBackend
from test_rollout_support import enc, make_model, make_tokenizer

PROMPTS = ["Where is Lake Varo?", "Question: what is the capital of Ostria and why?", "Brelm",
           "Where is Lake Varo?"]  # the last repeats the first: its prefill is copied


def _generate(backend: HFBackend, prompts: list[list[int]], **kw):
    settings = dict(max_new_tokens=10, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True) | kw
    return backend.generate(prompts, **settings)


def _llama(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_kv_decoder_gives_the_model_path_outputs(arch):
    """Greedy and sampled outputs (same seed) are the model(...) path's; the sampled log-probs agree to rounding."""
    tok = make_tokenizer()
    model = make_model() if arch == "qwen2" else _llama(tok)
    prompts = [enc(p) for p in PROMPTS]
    fast, slow = HFBackend(model, tok, batch_size=3, seed=5), HFBackend(model, tok, batch_size=3, seed=5,
                                                                        fast_decode=False)
    assert fast.kv_decoder is not None and slow.kv_decoder is None
    for kw in (dict(greedy=True), dict(greedy=False, temperature=0.9), dict(greedy=False, top_p=0.8)):
        a, b = _generate(fast, prompts, **kw), _generate(slow, prompts, **kw)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        assert [o.finish_reason for o in a] == [o.finish_reason for o in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)


def test_stop_strings_end_sequences_while_the_others_decode():
    """Sequences that stop early leave the cache (it is compacted) and the others go on unchanged."""
    tok, model = make_tokenizer(), make_model()
    prompts = [enc(p) for p in PROMPTS[:3]]
    free = _generate(HFBackend(model, tok, fast_decode=False), prompts, max_new_tokens=16)
    stop = tok.decode(free[0].token_ids[:3])
    fast = _generate(HFBackend(model, tok), prompts, max_new_tokens=16, stop_strings=[stop])
    slow = _generate(HFBackend(model, tok, fast_decode=False), prompts, max_new_tokens=16, stop_strings=[stop])
    assert fast[0].finish_reason == "stop" and len(fast[0].token_ids) <= 3
    assert [o.token_ids for o in fast] == [o.token_ids for o in slow]


def _count_prefilled(backend: HFBackend, monkeypatch) -> list[int]:
    counts: list[int] = []
    real = backend.kv_decoder.prefill

    def counting(cache, rows, new_tokens):
        counts.append(sum(len(t) for t in new_tokens))
        return real(cache, rows, new_tokens)

    monkeypatch.setattr(backend.kv_decoder, "prefill", counting)
    return counts


def test_a_next_turn_prefills_only_its_new_tokens(monkeypatch):
    """A prompt that extends what the previous call generated (context + output + observation) prefills the tokens
    after the cached ones; a duplicate prompt is not prefilled; the outputs equal a fresh backend's."""
    tok, model = make_tokenizer(), make_model()
    backend = HFBackend(model, tok, seed=0)
    counts = _count_prefilled(backend, monkeypatch)
    prompts = [enc(p) for p in PROMPTS]
    first = _generate(backend, prompts, greedy=False)
    assert counts == [sum(len(p) for p in prompts[:3])]  # the repeated prompt: copied
    observation = enc(" <information> Brelm is the capital of Ostria </information>")
    turn2 = [p + o.token_ids + observation for p, o in zip(prompts, first)]
    again = _generate(backend, turn2)
    distinct = len({tuple(p) for p in turn2})
    assert distinct >= 3 and counts[1] == distinct * (1 + len(observation))  # the last sampled token, the observation
    fresh = _generate(HFBackend(model, tok, fast_decode=False), turn2)
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh]
    for x, y in zip(again, fresh):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)


def test_cached_prefixes_are_dropped_when_the_weights_change(monkeypatch):
    """An optimiser step between calls (an in-place change) or sleep() makes the next call prefill everything."""
    tok, model = make_tokenizer(), make_model()
    backend = HFBackend(model, tok, shares_learner_weights=True)
    counts = _count_prefilled(backend, monkeypatch)
    prompts = [enc(p) for p in PROMPTS[:3]]
    first = _generate(backend, prompts)
    turn2 = [p + o.token_ids + enc(" Brelm") for p, o in zip(prompts, first)]
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # tied: the embedding changes too
    changed = _generate(backend, turn2)
    assert counts[1] == sum(len(p) for p in turn2)
    assert [o.token_ids for o in changed] == [o.token_ids for o in _generate(
        HFBackend(model, tok, fast_decode=False), turn2)]
    backend.sleep()
    backend.wake_up()
    _generate(backend, [p + o.token_ids for p, o in zip(turn2, changed)])
    assert counts[2] == sum(len(p) + len(o.token_ids) for p, o in zip(turn2, changed))


def test_a_model_it_does_not_run_takes_the_model_path_with_a_warning():
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_tokenizer()
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=256,
                                      eos_token_id=tok.eos_token_id)).eval()
    assert "model type 'gpt2'" in kv_decode.unsupported_reason(gpt2)
    with pytest.warns(UserWarning, match="slower path: model type 'gpt2'"):
        backend = HFBackend(gpt2, tok)
    assert backend.kv_decoder is None
    out = _generate(backend, [enc("Brelm")], max_new_tokens=3)
    assert len(out[0].token_ids) == 3
    with pytest.raises(ValueError, match="cannot run GPT2LMHeadModel"):
        kv_decode.KVDecoder(gpt2)
    sliding = make_model()
    sliding.model.layers[0].self_attn.sliding_window = 16
    assert kv_decode.unsupported_reason(sliding) == "sliding-window attention"
    assert kv_decode.unsupported_reason(make_model().to("meta")) == "the model is on meta, not the CPU"


def test_greedy_answers_on_the_test_world_are_the_model_paths(tiny_world):
    """The whole agent loop, greedy, over the test world's validation and test questions: every trajectory is the
    same token for token with either decoder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1_lld.config import RolloutConfig
    from searchr1_lld.data.flashrag import load_rows
    from searchr1_lld.rollout.agent_loop import run_agent_loop
    from retriever.inprocess import InProcessRetriever

    tok = AutoTokenizer.from_pretrained(str(tiny_world / "tokenizer"))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_world / "model"), dtype=torch.float32).eval()
    rows = load_rows(tiny_world / "qa" / "val.jsonl") + load_rows(tiny_world / "qa" / "test.jsonl")
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=48, max_obs_length=160, max_total_length=1024, topk=3,
                        generation_batch_size=16)
    retriever = InProcessRetriever(tiny_world / "index")
    runs = {}
    for fast in (True, False):
        backend = HFBackend(model, tok, batch_size=16, fast_decode=fast)
        runs[fast] = run_agent_loop(rows, backend=backend, tokenizer=tok, retriever=retriever, cfg=cfg, greedy=True)
    assert [t.response_ids for t in runs[True]] == [t.response_ids for t in runs[False]]
    assert [t.prediction for t in runs[True]] == [t.prediction for t in runs[False]]
    assert any(t.valid_searches >= 1 for t in runs[True])  # a turn after a search: a cached prefix reused


def _tiny_causal_lm(model_type: str) -> torch.nn.Module:
    """A random 2-layer model of ``model_type`` (one of kv_decode.KV_DECODE_MODEL_TYPES) with grouped-query heads,
    transformers' SDPA attention, fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(3)
    cfg = AutoConfig.for_model(model_type, vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                               sliding_window=None)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()


@pytest.mark.parametrize("model_type", kv_decode.KV_DECODE_MODEL_TYPES)
def test_the_transformers_internals_the_decoder_runs_compute_each_layer(model_type):
    """Guard on the installed transformers: the decoder reaches into each supported model's internals
    (``model.model.{embed_tokens, rotary_emb, layers, norm}``, the layers' ``input_layernorm``, ``self_attn.{q,k,v,o}_proj,
    scaling, head_dim``, ``mlp``, ``post_attention_layernorm`` and the modeling module's ``apply_rotary_pos_emb``).
    For every supported model type the fast path is taken (no silent fallback), and each decoder layer's output is
    what the decoder's decomposition of it computes; a release that moves or changes one of them fails here."""
    import transformers

    model = _tiny_causal_lm(model_type)
    assert kv_decode.unsupported_reason(model) is None, f"transformers {transformers.__version__}"
    decoder = kv_decode.KVDecoder(model)
    torch.manual_seed(0)
    hidden = torch.randn(1, 7, 32)
    positions = torch.arange(3, 10)[None]  # a prefix of 3 cached tokens: rotary phases from position 3
    cos_sin = model.model.rotary_emb(hidden, positions)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
            theirs = out[0] if isinstance(out, tuple) else out
            q, k, v = decoder._qkv(layer, hidden, cos_sin)
            attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                    scale=layer.self_attn.scaling, enable_gqa=True)
            mine = decoder._finish_layer(layer, hidden, attn)
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5,
                                       msg=f"{model_type} layer {i}, transformers {transformers.__version__}")
            hidden = theirs
