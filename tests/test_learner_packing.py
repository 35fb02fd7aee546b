"""Packed learner forwards (no padding) against padded rows: the same log-probs, losses and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from searchr1_lld.learner import batching, policy_logprobs
from searchr1_lld.rollout.types import Trajectory, to_batch

from test_trainer import SMALL, _params, _trainer, shared_retriever  # noqa: F401  (a module fixture)
from conftest import on_world  # noqa: F401


def _traj(prompt: list[int], response: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(row={"id": "x"}, group_id=0, prompt_ids=prompt, response_ids=response, response_mask=mask,
                      answer_mask=[0] * len(response), engine_logprobs=[0.0] * len(response))


def test_pack_rows_lays_rows_back_to_back():
    batch = to_batch([_traj([11, 12], [21, 22, 23], [1, 0, 1]), _traj([13, 14, 15], [24], [1]),
                      _traj([16], [], [])], pad_token_id=0)
    rows = batching.pack_rows(batch, [0, 1, 2])
    # row 0: 11 12 21 22 (23 predicts nothing); row 1: 13 14 15; row 2: its prompt only
    assert rows["input_ids"].tolist() == [[11, 12, 21, 22, 13, 14, 15, 16]]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0]]
    assert rows["cu_seq_lens"].tolist() == [0, 4, 7, 8]
    # 12 -> 21, 22 -> 23, 15 -> 24 (22 is an observation token: never predicted)
    assert rows["logit_index"].tolist() == [1, 3, 6]
    assert rows["labels"].tolist() == [21, 23, 24]
    assert rows["out_index"].tolist() == [0, 2, 3]  # [b=3, t=3]: row 0 columns 0 and 2, row 1 column 0
    assert batching.forward_positions(rows) == (8, 8)
    padded = batching.select_rows(batch, [0, 1, 2])  # width p + t - 1 = 3 + 3 - 1 = 5 for each of 3 rows
    assert batching.forward_positions(padded) == (15, 9)


def test_pack_rows_lays_a_shared_prompt_out_once():
    """Rows 0 and 2 share prompt [11, 12]: it is laid out once; each row is a (prompt, response) pair of segments."""
    batch = to_batch([_traj([11, 12], [21, 22, 23], [1, 0, 1]), _traj([13, 14, 15], [24], [1]),
                      _traj([11, 12], [25, 26], [1, 1])], pad_token_id=0)
    rows = batching.pack_rows(batch, [0, 1, 2], share_prompts=True)
    # 11 12 | 21 22 | 13 14 15 | (none: row 1's only response token predicts nothing) | 25
    assert rows["input_ids"].tolist() == [[11, 12, 21, 22, 13, 14, 15, 25]]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 2]]
    assert rows["segments"].tolist() == [[0, 2, 2, 2], [4, 3, 7, 0], [0, 2, 7, 1]]
    assert rows["cu_seq_lens"] is None
    # 12 -> 21, 22 -> 23; 15 -> 24; 12 -> 25 (the shared prompt's last position), 25 -> 26
    assert rows["logit_index"].tolist() == [1, 3, 6, 1, 7]
    assert rows["labels"].tolist() == [21, 23, 24, 25, 26]
    assert rows["out_index"].tolist() == [0, 2, 3, 6, 7]
    assert batching.forward_positions(rows) == (8, 8)
    unshared = batching.pack_rows(batch, [0, 1, 2])
    assert unshared["segments"] is None and unshared["input_ids"].shape[1] == 10


def test_micro_batches_by_prompt_keep_groups_and_pay_each_prompt_once():
    # rows 0-2 group 7 (prompt 10, lengths 30, 20, 25: 10 + 20 + 10 + 15 = 55), rows 3-4 group 8 (prompt 5)
    prompts, lengths, groups = [10, 10, 10, 5, 5], [30, 20, 25, 9, 7], [7, 7, 7, 8, 8]
    assert batching.micro_batches_by_prompt(prompts, lengths, groups, 55) == [[0, 1, 2], [3, 4]]
    assert batching.micro_batches_by_prompt(prompts, lengths, groups, 100) == [[0, 1, 2, 3, 4]]  # 55 + 5 + 4 + 2
    # a group over the budget is split, the new part paying its prompt again
    assert batching.micro_batches_by_prompt(prompts, lengths, groups, 45) == [[0, 1], [2, 3, 4]]
    assert batching.micro_batches_by_prompt(prompts, lengths, groups, 1) == [[0], [1], [2], [3], [4]]


@pytest.fixture(scope="module")
def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = Qwen2ForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    assert policy_logprobs.use_packed_attention(model) and policy_logprobs.runs_packed(model)
    return model


def _uneven_batch(share: bool):
    """Rows with prompts of 3-7 tokens and responses of 0-9; with ``share``, rows 1 and 3 repeat row 0's prompt."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 64, (p,), generator=g).tolist() for p in (3, 7, 5, 4)]
    if share:
        prompts[1] = prompts[3] = prompts[0]
    trajs = [_traj(prompt, torch.randint(2, 64, (r,), generator=g).tolist(), [int(j % 4 != 2) for j in range(r)])
             for prompt, r in zip(prompts, (9, 2, 0, 6))]
    return to_batch(trajs, pad_token_id=0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("share", [False, True])
def test_packed_forward_equals_padded_rows(tiny_qwen2, fused, share):
    """Log-probs and entropies of uneven rows (prompts 3-7 tokens, responses 0-9), packed and padded, and their
    gradients, on a random Qwen2 with grouped key/value heads; packed with a prompt shared by three rows too."""
    batch = _uneven_batch(share)
    idx = [0, 1, 2, 3]
    settings = dict(chunk_size=5, temperature=0.7, compute_entropy=True, fused=fused)
    padded = batching.select_rows(batch, idx)
    packed = batching.pack_rows(batch, idx, share_prompts=share)
    if share:
        assert packed["input_ids"].shape[1] == 3 + 8 + 1 + 5 + 5  # the shared prompt once
    mask = padded["response_mask"]
    lp_pad, ent_pad = policy_logprobs.response_logprobs(
        tiny_qwen2, padded["input_ids"][:, :-1], padded["attention_mask"][:, :-1], padded["position_ids"][:, :-1],
        padded["responses"], padded["p"] - 1, **settings)
    loss_pad = ((lp_pad + 0.3 * ent_pad) * mask).sum()
    grads_pad = torch.autograd.grad(loss_pad, list(tiny_qwen2.parameters()))
    lp, ent = policy_logprobs.packed_response_logprobs(
        tiny_qwen2, packed["input_ids"], packed["position_ids"], packed["cu_seq_lens"], packed["logit_index"],
        packed["labels"], segments=packed["segments"], **settings)
    flat = lambda x: x.new_zeros(mask.numel()).index_copy(0, packed["out_index"], x).view(mask.shape)  # noqa: E731
    loss = ((flat(lp) + 0.3 * flat(ent)) * mask).sum()
    grads = torch.autograd.grad(loss, list(tiny_qwen2.parameters()))
    torch.testing.assert_close(flat(lp), lp_pad * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flat(ent), ent_pad * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, loss_pad, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_pad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_rows_log_probs_do_not_depend_on_the_rows_packed_with_it(tiny_qwen2):
    """With shared prompts, each row's log-probs are the same (to 1e-6, a rounding error) alone, with other rows, with
    or without gradient: the learner's log-probs before an update (a no-grad pass over micro-batches of whole groups)
    equal the update's first forward (other micro-batches, with grad), so LLDS sees logp_new == logp_old there, to
    rounding. (A BLAS may round a row differently by the height of its tile and by how its threads split it, whatever
    the layout; test_trainer checks the step.)"""
    batch = _uneven_batch(True)
    settings = dict(chunk_size=256, temperature=1.0, compute_entropy=False)

    def logps(idx, grad):
        rows = batching.pack_rows(batch, idx, share_prompts=True)
        with torch.set_grad_enabled(grad):
            lp, _ = policy_logprobs.packed_response_logprobs(
                tiny_qwen2, rows["input_ids"], rows["position_ids"], None, rows["logit_index"], rows["labels"],
                segments=rows["segments"], **settings)
        parts = torch.split(lp.detach(), [int(batch.response_mask[i].sum()) for i in idx])
        return {i: part for i, part in zip(idx, parts)}

    threads = torch.get_num_threads()
    try:
        # to a rounding error: a BLAS may split a tile's rows over its threads by the tile's height (measured: 2
        # threads on an AVX-512 EPYC, 4.8e-7; once also on 1 thread inside the full suite), so not bit for bit;
        # a row that saw another row's tokens would be off by far more
        for n in (1, 2):
            torch.set_num_threads(n)
            together = logps([0, 1, 2, 3], False)
            for idx, grad in (([3], False), ([1, 0], True), ([3, 2, 0], True), ([0], True)):
                for i, part in logps(idx, grad).items():
                    assert torch.allclose(part, together[i], rtol=0, atol=1e-6), (n, idx, grad, i, part - together[i])
    finally:
        torch.set_num_threads(threads)


def test_shared_prompts_need_the_packed_sdpa_attention(tiny_qwen2):
    batch = _uneven_batch(True)
    rows = batching.pack_rows(batch, [0, 1], share_prompts=True)
    other = copy.deepcopy(tiny_qwen2)
    other.config._attn_implementation = "flash_attention_2"  # varlen kernels follow cu_seq_lens only
    assert policy_logprobs.runs_packed(other) and not policy_logprobs.shares_prompts(other)
    with pytest.raises(RuntimeError, match="share prompts need the packed sdpa attention"):
        policy_logprobs.packed_response_logprobs(other, rows["input_ids"], rows["position_ids"], None,
                                                 rows["logit_index"], rows["labels"], segments=rows["segments"],
                                                 chunk_size=4, temperature=1.0, compute_entropy=False)


def test_an_unpacked_forward_is_plain_sdpa(tiny_qwen2):
    """With the packed attention installed, a padded batch (attention mask, no boundaries) runs sdpa as before."""
    from transformers import Qwen2ForCausalLM

    reference = Qwen2ForCausalLM(copy.deepcopy(tiny_qwen2.config)).eval()
    reference.load_state_dict(tiny_qwen2.state_dict())
    reference.set_attn_implementation("sdpa")
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    am = (ids != 0).long()
    pos = (am.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        a = tiny_qwen2(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits
        b = reference(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits
    assert tiny_qwen2.config._attn_implementation == policy_logprobs.PACKED_SDPA
    assert reference.config._attn_implementation == "sdpa"
    assert torch.equal(a * am[..., None], b * am[..., None])


def test_the_update_is_the_same_packed_and_padded(tmp_path, tiny_world, shared_retriever):  # noqa: F811
    """One rollout of uneven responses (some cut short), LLDS on with its action gate and the KL term: the batch
    log-probs the monitor and LLDS read, the update's losses and its gradient agree packed and padded; the padded
    update computes padding, the packed one none."""
    from searchr1_lld.algo.advantages import grpo_outcome_advantages
    from searchr1_lld.config import load_config
    from searchr1_lld.learner import step

    cfg = load_config(None, SMALL + [f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
                                     "trainer.ppo_mini_batch_size=4", "trainer.ppo_epochs=2", "rollout.n=4",
                                     "rollout.max_turns=2", "trainer.micro_batch_token_budget=1200",
                                     "algorithm.entropy_coef=0.01"])
    tr = _trainer(cfg, tiny_world, shared_retriever, reward_of_index=lambda i: float(i % 3 == 0))
    learner = tr.learner
    step.seed_everything(0)
    trajs = learner.rollout(tr.sampler.next_batch())
    for k, t in enumerate(trajs[::3]):  # uneven lengths for sure: cut some responses
        keep = max(1, len(t.response_ids) // (k + 2))
        for name in ("response_ids", "response_mask", "answer_mask", "engine_logprobs"):
            setattr(t, name, getattr(t, name)[:keep])
    batch = to_batch(trajs, learner.tokenizer.pad_token_id)
    assert len(set(batch.attention_mask.sum(1).tolist())) > 2
    adv = grpo_outcome_advantages(batch.rewards, batch.group_ids)
    weights = _params(learner.model)
    grads, real_step = [], learner.optimizer.step

    def recording_step(*args, **kwargs):  # the accumulated gradient of each update, then no step at all
        grads.append(torch.cat([p.grad.reshape(-1) for p in learner.model.parameters() if p.grad is not None]).clone())

    learner.optimizer.step = recording_step
    out, logps = {}, {}
    # the policy that sampled the batch a little off the current one, so that LLDS's gate opens on some tokens
    shift = 0.3 * torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(0)) + 0.1
    for packed in (False, True):
        learner.cfg.trainer.pack_sequences = packed
        logps[packed] = step.batch_logprobs(learner, learner.model, batch)
        logp_ref = step.batch_logprobs(learner, learner.ref_model, batch)
        logp_old = (logps[packed] + shift) * batch.response_mask
        learner.optimizer.zero_grad(set_to_none=True)
        out[packed] = step.update_policy(learner, batch, adv, logp_old, logp_ref, None, 0.1, step=0)
        assert all(torch.equal(a, b) for a, b in zip(weights, _params(learner.model)))
    learner.optimizer.step = real_step
    torch.testing.assert_close(logps[True], logps[False], rtol=1e-5, atol=1e-5)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_ref", "actor/approx_kl", "llds/loss",
                "llds/active_token_frac", "actor/grad_norm"):
        assert out[True][key] == pytest.approx(out[False][key], rel=1e-4, abs=1e-6), key
    assert 0 < out[True]["llds/active_token_frac"] < 1
    assert out[False]["actor/padded_token_share"] > 0.1 and out[True]["actor/padded_token_share"] == 0.0
    n = len(grads) // 2  # the padded run's updates, then the packed run's
    assert n == out[True]["actor/updates"] and float(grads[0].norm()) > 0
    for a, b in zip(grads[n:], grads[:n]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_packed_row_without_its_boundaries_is_refused(tiny_qwen2):
    """Positions restarting within a row and no cu_seq_lens_q: an error, never attention across the sequences."""
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        tiny_qwen2(input_ids=torch.tensor([[3, 4, 5, 6]]), position_ids=torch.tensor([[0, 1, 0, 1]]), use_cache=False)


def test_flash_attention_from_the_kernels_hub_runs_packed_and_other_attention_is_refused(tiny_qwen2):
    """transformers switches flash_attention_N to a kernels-hub repository when flash-attn is missing and the kernels
    package is there; those names run packed forwards as flash_attention_2 does. Every name transformers can switch
    to is recognised (read from transformers, so a new one fails here); an implementation that cannot run packed
    forwards is an error naming it, not a silent fall-back to padding."""
    from transformers import modeling_flash_attention_utils as fa

    from searchr1_lld.learner.policy_logprobs import follows_sequence_boundaries

    hub = set(fa.FLASH_ATTN_KERNEL_FALLBACK.values()) | {"kernels-community/aiter-flash-attn",
                                                        "kernels-community/vllm-flash-attn3"}
    assert all(follows_sequence_boundaries(name) for name in hub), hub
    assert follows_sequence_boundaries("kernels-community/flash-attn2@v2:flash_attn_varlen_func")
    assert not follows_sequence_boundaries("eager") and not follows_sequence_boundaries("kernels-community/other")
    model = copy.deepcopy(tiny_qwen2)
    model.config._attn_implementation = "kernels-community/flash-attn2"
    assert policy_logprobs.use_packed_attention(model) and policy_logprobs.runs_packed(model)
    model.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="'eager' attention, which cannot run packed forwards.*pack_sequences=false"):
        policy_logprobs.use_packed_attention(model)
    assert not policy_logprobs.runs_packed(model)
