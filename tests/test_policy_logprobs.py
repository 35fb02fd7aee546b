"""policy_logprobs: log-probs from the LM head's input (no full logits) == the logits path, on a tiny Qwen2."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.learner import policy_logprobs
def _tiny_qwen2(tie: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, tie_word_embeddings=tie, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).float()


def _inputs(b=3, length=11):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (b, length), generator=g)
    att = torch.ones(b, length, dtype=torch.long)
    att[1, :2] = 0  # left padding
    pos = (att.cumsum(1) - 1).clamp(min=0)
    return ids, att, pos


@pytest.mark.parametrize("tie", [True, False])
def test_fused_head_path_equals_logits_path(tie):
    model = _tiny_qwen2(tie)
    assert policy_logprobs.fused_output_head(model) is model.lm_head
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    ids, att, pos = _inputs()
    start = 4
    labels = ids[:, start + 1 :]
    results = []
    for fused in (True, False):
        model.zero_grad(set_to_none=True)
        logp, ent = policy_logprobs.response_logprobs(model, ids[:, :-1], att[:, :-1], pos[:, :-1], labels, start,
                                                      chunk_size=5, temperature=0.7, compute_entropy=True, fused=fused)
        (logp.sum() + 0.3 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), grads))
    (lf, ef, gf), (ln, en, gn) = results
    assert lf.shape == labels.shape
    torch.testing.assert_close(lf, ln, atol=1e-5, rtol=0)
    torch.testing.assert_close(ef, en, atol=1e-5, rtol=0)
    assert set(gf) == set(gn)
    for name in gn:
        torch.testing.assert_close(gf[name], gn[name], atol=1e-5, rtol=1e-4, msg=name)
    assert float(gn["lm_head.weight" if not tie else "model.embed_tokens.weight"].abs().sum()) > 0


def test_fused_path_never_builds_full_logits():
    model = _tiny_qwen2(True)
    ids, att, pos = _inputs()
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape)))
    policy_logprobs.response_logprobs(model, ids[:, :-1], att[:, :-1], pos[:, :-1], ids[:, 3:], 2, chunk_size=4, temperature=1.0,
                                      compute_entropy=False)
    handle.remove()
    assert seen == [(3, 0, 97)]
    assert not model.lm_head._forward_pre_hooks  # the capture hook is removed again


def test_fallback_for_heads_that_are_not_plain_linear():
    model = _tiny_qwen2(False)
    model.config.final_logit_softcapping = 30.0  # logits are post-processed: the head's input is not enough
    assert policy_logprobs.fused_output_head(model) is None
    model.config.final_logit_softcapping = None
    model.lm_head.weight.ds_id = 0  # what a DeepSpeed ZeRO-3 partitioned parameter carries
    assert policy_logprobs.fused_output_head(model) is None


@pytest.mark.parametrize("fused", [True, False])
def test_padded_vocabulary_rows_are_left_out_of_the_softmax_as_the_engine_does(fused):
    """With ``vocab_limit`` the softmax runs over the ids below it only (the vLLM engine masks the rows past the
    tokenizer with a -inf logit bias): log_softmax(logits[..., :limit]), not the full head's, and the padded rows get
    no gradient."""
    model = _tiny_qwen2(False)
    ids, att, pos = _inputs()
    limit, start = 80, 4
    labels = ids[:, start + 1:].clamp(max=limit - 1)
    with torch.no_grad():  # padded rows that would take a visible share of the full softmax
        model.lm_head.weight[limit:] = model.lm_head.weight[labels.flatten()[:97 - limit]] * 3
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1], attention_mask=att[:, :-1], position_ids=pos[:, :-1]).logits[:, start:]
    expected = torch.log_softmax(logits[..., :limit].float() / 0.7, -1).gather(-1, labels[..., None])[..., 0]
    full = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, labels[..., None])[..., 0]
    logp, _ = policy_logprobs.response_logprobs(model, ids[:, :-1], att[:, :-1], pos[:, :-1], labels, start,
                                                chunk_size=5, temperature=0.7, compute_entropy=False, fused=fused,
                                                vocab_limit=limit)
    torch.testing.assert_close(logp, expected, atol=1e-5, rtol=0)
    assert float((logp.detach() - full).abs().max()) > 1e-2  # the padded rows did matter
    logp.sum().backward()
    assert float(model.lm_head.weight.grad[limit:].abs().sum()) == 0
    assert float(model.lm_head.weight.grad[:limit].abs().sum()) > 0


def test_the_learner_takes_the_engines_vocabulary():
    """step.rows_logprobs passes the rollout engine's vocab_limit to the log-prob computation."""
    from types import SimpleNamespace

    from searchr1_lld.learner import step

    model = _tiny_qwen2(False)
    ids, att, pos = _inputs()
    rows = {"input_ids": ids, "attention_mask": att, "position_ids": pos, "responses": ids[:, 5:] % 80, "p": 5}

    def learner(limit):
        return SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu")), backend=SimpleNamespace(
            vocab_limit=limit), cfg=SimpleNamespace(rollout=SimpleNamespace(temperature=1.0),
                                                    trainer=SimpleNamespace(logprob_chunk_size=4)))

    with torch.no_grad():
        limited, _ = step.rows_logprobs(learner(80), model, rows, compute_entropy=False)
        full, _ = step.rows_logprobs(learner(None), model, rows, compute_entropy=False)
        expected, _ = policy_logprobs.response_logprobs(model, ids[:, :-1], att[:, :-1], pos[:, :-1], rows["responses"],
                                                        4, chunk_size=4, temperature=1.0, compute_entropy=False,
                                                        vocab_limit=80)
    torch.testing.assert_close(limited, expected)
    assert not torch.allclose(limited, full)
