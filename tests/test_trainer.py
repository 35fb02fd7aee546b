"""The learner on the tiny world: real optimiser steps, non-finite skip, resume equivalence, end-to-end over HTTP."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from searchr1_lld.algo import policy_loss
from searchr1_lld.bookkeeping import checkpoint as ckpt
from searchr1_lld.config import load_config
from searchr1_lld.learner.batching import micro_batches_by_tokens
from searchr1_lld.learner.optim import lr_factor
from searchr1_lld.learner.trainer import Trainer

from conftest import REPO_ROOT, on_world, world_args

SMALL = [
    "trainer.train_batch_size=2", "trainer.ppo_mini_batch_size=2", "trainer.ppo_epochs=2", "rollout.n=2",
    "rollout.max_turns=1", "rollout.max_tokens_per_turn=20", "rollout.max_obs_length=60",
    "rollout.max_total_length=1024", "trainer.lr=1e-3", "trainer.warmup_ratio=0", "trainer.weight_decay=0",
    "trainer.micro_batch_token_budget=400", "logging.progress_bar=false", "logging.plot_every=0",
    "trainer.probe_every=1", "trainer.probe_size=2",
]


@pytest.fixture(scope="module")
def shared_retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def _cfg(tmp_path, *extra):
    return load_config(None, SMALL + [f"trainer.output_dir={tmp_path}", "trainer.run_name=run", *extra])


def _trainer(cfg, tiny_world, retriever, reward_of_index=lambda i: float(i % 2 == 0)):
    tr = Trainer(on_world(cfg, tiny_world), retriever=retriever)
    real_rollout = tr.learner.rollout

    def rollout_with_mixed_rewards(rows, **kw):
        # the untrained tiny test policy rarely answers right: set the rewards by hand (default: every group one
        # correct and one wrong response; responses of one prompt are consecutive)
        trajs = real_rollout(rows, **kw)
        if not kw.get("greedy"):
            for i, t in enumerate(trajs):
                t.reward = reward_of_index(i)
        return trajs

    tr.learner.rollout = rollout_with_mixed_rewards  # what the step rolls out with
    return tr


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_micro_batches_respect_token_budget_and_sort():
    lengths = [5, 50, 7, 40, 6, 100]
    mbs = micro_batches_by_tokens(lengths, range(6), token_budget=100)
    assert sorted(i for mb in mbs for i in mb) == list(range(6))
    for mb in mbs:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 100
    assert mbs[0] == [0, 4, 2]  # shortest first, packed together


def test_lr_factor_warmup_and_cosine():
    assert lr_factor(0, 10, 0.2, "constant") == pytest.approx(0.5)
    assert lr_factor(1, 10, 0.2, "constant") == pytest.approx(1.0)
    assert lr_factor(5, 10, 0.2, "constant") == 1.0
    assert lr_factor(2, 10, 0.2, "cosine") == pytest.approx(1.0)
    assert lr_factor(10, 10, 0.2, "cosine") == pytest.approx(0.0)


def test_micro_batches_in_several_passes_train_as_in_one(tmp_path, tiny_world, shared_retriever):
    """algorithm.loss_scale=micro-batch-mean with micro-batches of 2 responses: run in one forward pass each or, with a
    1-token budget, in one pass per response, the update's gradient is the same (one rollout, two updates from the
    same weights)."""
    from searchr1_lld.learner import step
    from searchr1_lld.algo.advantages import grpo_outcome_advantages
    from searchr1_lld.rollout.types import to_batch

    cfg = _cfg(tmp_path, "algorithm.loss_scale=micro-batch-mean", "trainer.ppo_mini_batch_size=4",
               "trainer.ppo_epochs=1", "algorithm.llds.gate=none", "trainer.micro_batch_size=2")
    tr = _trainer(cfg, tiny_world, shared_retriever)
    learner = tr.learner
    step.seed_everything(0)
    batch = to_batch(learner.rollout(tr.sampler.next_batch()), learner.tokenizer.pad_token_id)
    adv = grpo_outcome_advantages(batch.rewards, batch.group_ids)
    logp_old = step.batch_logprobs(learner, learner.model, batch)
    logp_ref = step.batch_logprobs(learner, learner.ref_model, batch)
    weights = _params(tr.learner.model)
    grads, real_step = [], tr.learner.optimizer.step

    def recording_step(*args, **kwargs):  # the accumulated gradient of the update, then no step at all
        grads.append(torch.cat([p.grad.reshape(-1) for p in tr.learner.model.parameters() if p.grad is not None]).clone())

    tr.learner.optimizer.step = recording_step
    out = {}
    for budget in (100_000, 1):
        learner.cfg.trainer.micro_batch_token_budget = budget
        out[budget] = step.update_policy(learner, batch, adv, logp_old, logp_ref, None, None, step=0)
        assert all(torch.equal(a, b) for a, b in zip(weights, _params(tr.learner.model)))
    tr.learner.optimizer.step = real_step
    assert out[100_000]["actor/micro_batches"] == 2 and out[1]["actor/micro_batches"] == 4  # forward passes
    assert float(grads[0].norm()) > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("variant", ["llds", "grpo"])
def test_one_real_step(tmp_path, tiny_world, shared_retriever, variant):
    extra = ["algorithm.llds.lam=0"] if variant == "grpo" else ["algorithm.llds.ma=fixed", "algorithm.llds.gate=none"]
    # group 0 = [correct, wrong] drives the update; group 1 = [wrong, wrong] has advantage 0 (in LLDS's preserving
    # set) and its likelihood is moved only by group 0's update, so some of its tokens fall and LLDS acts on them
    tr = _trainer(_cfg(tmp_path, *extra), tiny_world, shared_retriever, reward_of_index=lambda i: float(i == 0))
    before = _params(tr.learner.model)
    m = tr.train_step()
    after = _params(tr.learner.model)
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "parameters did not change"
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_ref", "actor/grad_norm", "actor/approx_kl",
                "lld/correct_logp_old_per_token", "lld/correct_delta_per_token", "lld/rate"):
        assert math.isfinite(m[key]), key
    assert m["actor/updates"] == 4 and m["actor/skipped_updates"] == 0  # 2 epochs x 2 mini-batches
    assert m["actor/grad_norm"] > 0
    assert m["lld/step_kl"] > 0  # the updates moved the policy on the step's own samples
    assert 0 < m["time/monitor_forward_s"] < m["time/step_s"]
    assert "probe/logp_per_token" in m and m["phase/name"] in ("healthy", "early_stagnation", "steady_decay",
                                                                 "accelerated_collapse")
    # the probe set (group 0's correct response) is measured before the update too; the update raised its likelihood
    assert m["probe/initial_logp_per_token"] < m["probe/logp_per_token"]
    assert m["adv/nonzero_frac"] == pytest.approx(0.5)  # group 0 carries signal, group 1 (all wrong) none
    assert 1 <= m["actor/signal_updates"] <= m["actor/updates"]
    assert 0 < m["actor/grad_norm_signal"] <= m["actor/grad_norm"]
    if variant == "llds":
        # after the first mini-batch update logp_new != logp_old, so LLDS acts on some tokens
        assert m["llds/active_token_frac"] > 0 and math.isfinite(m["llds/loss"])
        assert m["llds/lam_answer_effective"] == pytest.approx(0.2)
    else:
        assert "llds/active_token_frac" not in m


def test_training_runs_the_policy_loss_registered_under_the_configured_name(tmp_path, tiny_world, shared_retriever,
                                                                            monkeypatch):
    """Every micro-batch's loss comes from the policy-loss registry: re-registering the configured name (here a
    recording wrapper around the real loss) reaches training without any other edit."""
    cfg = _cfg(tmp_path, "trainer.ppo_epochs=1")
    tr = _trainer(cfg, tiny_world, shared_retriever)
    real = policy_loss.get_policy_loss_fn(cfg.algorithm.policy_loss)
    calls = []

    def recording(logp_new, *args, **kwargs):
        calls.append(logp_new.requires_grad)
        return real(logp_new, *args, **kwargs)

    monkeypatch.setitem(policy_loss.POLICY_LOSSES, cfg.algorithm.policy_loss, recording)
    m = tr.train_step()
    assert calls and all(calls)
    assert len(calls) == m["actor/micro_batches"]


def test_nonfinite_gradient_is_skipped(tmp_path, tiny_world, shared_retriever):
    tr = _trainer(_cfg(tmp_path, "trainer.ppo_epochs=1"), tiny_world, shared_retriever)
    first = next(tr.learner.model.parameters())
    handle = first.register_hook(lambda g: g * float("nan"))
    before = _params(tr.learner.model)
    m = tr.train_step()
    handle.remove()
    assert m["actor/skipped_updates"] == 2 and tr.skipped_updates == 2
    assert all(torch.equal(a, b) for a, b in zip(before, _params(tr.learner.model))), "a non-finite update was applied"
    assert math.isnan(m["actor/grad_norm"])


def test_llds_noop_warning(tmp_path, tiny_world, shared_retriever):
    cfg = _cfg(tmp_path, "trainer.ppo_epochs=1", "trainer.ppo_mini_batch_size=4")
    with pytest.warns(UserWarning, match="permanent no-op"):
        Trainer(on_world(cfg, tiny_world), retriever=shared_retriever)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Trainer(on_world(_cfg(tmp_path, "trainer.ppo_epochs=1", "trainer.ppo_mini_batch_size=2",
                              "algorithm.llds.enabled=false"), tiny_world), retriever=shared_retriever)


def test_resume_reproduces_the_next_step(tmp_path, tiny_world, shared_retriever):
    common = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_k=3"]
    # uninterrupted: 2 steps
    a = _trainer(_cfg(tmp_path / "a", *common, "trainer.resume=never"), tiny_world, shared_retriever)
    res_a = a.run(evaluate=False)
    # interrupted after 1 step (checkpoint written), then a fresh process resumes
    cfg_b = _cfg(tmp_path / "b", *common, "trainer.resume=auto")
    b1 = _trainer(cfg_b, tiny_world, shared_retriever)
    b1.train_step()
    b1.save()
    # a half-written later checkpoint (crash during save) must be ignored
    (b1.run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    del b1
    b2 = _trainer(cfg_b, tiny_world, shared_retriever)
    res_b = b2.run(evaluate=False)
    # the resumed run's history covers every step: the one before the interruption came back with the checkpoint
    assert res_b.steps == 2 and [h["step"] for h in res_b.history] == [1, 2] == [h["step"] for h in res_a.history]
    for pa, pb in zip(a.learner.model.parameters(), b2.learner.model.parameters()):
        assert torch.equal(pa, pb)
    for ma, mb in zip(res_a.history, res_b.history):
        for key in ("reward/em_mean", "actor/pg_loss", "actor/grad_norm", "lld/correct_logp_old_per_token",
                    "llds/loss", "phase/name"):
            assert ma[key] == mb[key] or (math.isnan(ma[key]) and math.isnan(mb[key])), key


def test_the_training_clock_counts_every_pass_of_an_interrupted_run(tmp_path, tiny_world, shared_retriever):
    """Trainer.train_s: the seconds of the run's steps over every pass; an earlier pass's come back with its
    checkpoint, and a checkpoint written before the clock was kept gives its steps' own times."""
    common = ["trainer.save_every=1", "trainer.resume=auto"]
    first = _trainer(_cfg(tmp_path, *common, "trainer.total_steps=1"), tiny_world, shared_retriever)
    res_1 = first.run(evaluate=False)
    assert res_1.train_s == first.train_s >= res_1.history[0]["time/step_s"] > 0
    second = _trainer(_cfg(tmp_path, *common, "trainer.total_steps=2"), tiny_world, shared_retriever)
    res_2 = second.run(evaluate=False, allow_changes=("trainer.total_steps",))
    assert res_2.train_s >= res_1.train_s + res_2.history[1]["time/step_s"]  # the first pass's seconds, then step 2's
    state_file = second.run_dir / "checkpoints" / "step_000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["train_s"] == res_2.train_s
    del state["train_s"]
    state_file.write_text(json.dumps(state))
    marker = state_file.parent / ckpt.COMPLETE  # the checkpoint's file sizes, this one's rewritten to match
    marker.write_text("\n".join(f"{state_file.stat().st_size}\ttrainer_state.json"
                                if line.endswith("\ttrainer_state.json") else line
                                for line in marker.read_text().splitlines()))
    older = _trainer(_cfg(tmp_path, *common, "trainer.total_steps=2"), tiny_world, shared_retriever)
    assert older.maybe_resume() is not None
    assert older.train_s == sum(h["time/step_s"] for h in res_2.history) > 0


def test_evaluation_during_training_leaves_the_training_unchanged(tmp_path, tiny_world, shared_retriever):
    """trainer.eval_every scores the policy greedily on the validation rows (eval/val_em; the test rows, eval/em,
    only before and after) every N steps and at the last one; greedy decoding draws no random numbers, so the trained
    weights and every training metric equal those of a run without it."""
    common = ["trainer.total_steps=3", "trainer.save_every=0", "trainer.resume=never", "trainer.eval_limit=4"]
    a = _trainer(_cfg(tmp_path / "a", *common), tiny_world, shared_retriever)
    res_a = a.run(evaluate=False)
    b = _trainer(_cfg(tmp_path / "b", *common, "trainer.eval_every=2"), tiny_world, shared_retriever)
    res_b = b.run(evaluate=True)
    assert [("eval/val_em" in m) for m in res_b.history] == [False, True, True]  # step 2, and the last step (3)
    assert not any("eval/em" in m for m in res_b.history)  # the test rows are not the curve
    assert not any("eval/val_em" in m for m in res_a.history)
    assert res_b.em_before is not None and res_b.em_after is not None
    for pa, pb in zip(a.learner.model.parameters(), b.learner.model.parameters()):
        assert torch.equal(pa, pb)
    for ma, mb in zip(res_a.history, res_b.history):
        for key in (k for k in ma if not k.startswith("time/")):  # wall-clock times differ, nothing else
            assert ma[key] == mb[key] or (math.isnan(ma[key]) and math.isnan(mb[key])), key


def test_a_fixed_validation_subsample_every_step_and_the_whole_split_at_both_ends(tmp_path, tiny_world,
                                                                                    shared_retriever):
    """trainer.val_subsample: eval/val_sub_em on the same fixed questions every eval_every steps (and before the
    first step), eval/val_em on the whole validation split before the first step and at the last; metrics.jsonl
    holds the step-0 line."""

    from searchr1_lld.evaluation import fixed_subsample

    cfg = _cfg(tmp_path, "trainer.total_steps=2", "trainer.save_every=0", "trainer.resume=never",
               "trainer.eval_every=1", "trainer.val_subsample=6")
    tr = _trainer(cfg, tiny_world, shared_retriever)
    res = tr.run(evaluate=False)
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert set(lines[0]) == {"step", "eval/val_sub_em", "eval/val_em"}
    assert ["eval/val_sub_em" in m for m in res.history] == [True, True]
    assert ["eval/val_em" in m for m in res.history] == [False, True]  # the whole split at the last step only
    val = [json.loads(x) for x in (tiny_world / "qa" / "val.jsonl").read_text().splitlines()]
    sub = fixed_subsample(val, 6)
    assert len(sub) == 6 and tr.evaluate(sub)["em"] == res.history[-1]["eval/val_sub_em"]
    assert tr.evaluate(val)["em"] == res.history[-1]["eval/val_em"] and tr.evaluate(val)["n"] == len(val)


def test_the_whole_validation_split_at_a_chosen_midpoint(tmp_path, tiny_world, shared_retriever):
    """trainer.full_eval_steps: eval/val_em on the whole split after the steps it names as well (here step 2, which
    is not an eval_every step), beside the subsample's schedule; the last step's whole split as before."""
    cfg = _cfg(tmp_path, "trainer.total_steps=4", "trainer.save_every=0", "trainer.resume=never",
               "trainer.eval_every=3", "trainer.val_subsample=6", "trainer.full_eval_steps=[2]")
    tr = _trainer(cfg, tiny_world, shared_retriever)
    res = tr.run(evaluate=False)
    assert ["eval/val_sub_em" in m for m in res.history] == [False, False, True, True]  # steps 3 and 4 (the last)
    assert ["eval/val_em" in m for m in res.history] == [False, True, False, True]  # steps 2 and 4
    val = [json.loads(x) for x in (tiny_world / "qa" / "val.jsonl").read_text().splitlines()]
    assert tr.evaluate(val)["em"] == res.history[-1]["eval/val_em"]


@pytest.mark.slow
def test_train_py_end_to_end_over_http(tmp_path, tiny_world):
    """train.py through the real retriever service on loopback: 2 steps, before/after EM table written."""
    server = subprocess.Popen(
        [sys.executable, "-m", "retriever", "serve", "--index", str(tiny_world / "index"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
    )
    try:
        url = None
        for line in server.stdout:
            found = re.search(r"retriever ready on (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "retriever service did not start"
        args = ["--config", str(REPO_ROOT / "configs" / "tiny.yaml"), *SMALL, *world_args(tiny_world),
                "retriever.mode=http", f"retriever.url={url}",
                "trainer.total_steps=2", f"trainer.output_dir={tmp_path}", "trainer.run_name=e2e",
                "trainer.eval_limit=4", "trainer.save_every=1"]
        out = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        run_dir = tmp_path / "e2e"
        assert out.stdout.count(f"run directory: {run_dir}") == 2
        assert "| data.test_files |" in (run_dir / "eval.md").read_text()
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
        assert (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file()
        assert (run_dir / "plots" / "likelihood.png").is_file()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_run_evaluates_its_configured_datasets(tmp_path, tiny_world, shared_retriever):
    """Evaluation during training runs on eval.datasets (here the world's test split as a NAME=PATH rows file, a
    local stand-in for a benchmark), eval_limit questions each, every eval_every steps and at the end; without
    data.test_files there is no before/after table."""
    test_file = tiny_world / "qa" / "test.jsonl"
    cfg = _cfg(tmp_path, f"eval.datasets=[heldout={test_file}]", "trainer.eval_every=1",
               "trainer.eval_limit=2", "trainer.total_steps=1", "trainer.save_every=0", "trainer.resume=never",
               "trainer.ppo_epochs=1")
    tr = Trainer(on_world(cfg, tiny_world, "data.test_files=[]"), retriever=shared_retriever)
    res = tr.run(evaluate=True)
    m = res.history[-1]
    assert 0.0 <= m["eval/heldout/em"] <= 1.0 and m["eval/avg_em"] == m["eval/heldout/em"]
    assert res.em_before is None and "eval/em" not in m  # no data.test_files: no before/after EM


def test_a_checkpoint_policy_is_a_complete_model_dir(tmp_path, tiny_world, shared_retriever):
    """policy/ holds the weights, the generation config and the tokenizer: from_pretrained needs nothing else."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tr = _trainer(_cfg(tmp_path, "trainer.total_steps=1", "trainer.save_every=0", "trainer.probe_every=0"), tiny_world,
                  shared_retriever)
    policy = tr.save() / "policy"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in policy.iterdir()}
    tok = AutoTokenizer.from_pretrained(str(policy))
    assert tok.get_vocab() == tr.learner.tokenizer.get_vocab() and tok.pad_token_id == tr.learner.tokenizer.pad_token_id
    assert tok.chat_template == tr.learner.tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(str(policy))
    assert model.generation_config.eos_token_id == tr.learner.tokenizer.eos_token_id


def test_training_rows_must_be_named():
    from searchr1_lld.learner.factories import load_train_rows

    with pytest.raises(ValueError, match="data.train_files is empty"):
        load_train_rows(load_config(None))
    with pytest.raises(FileNotFoundError, match="rows file not found: nowhere.jsonl"):
        load_train_rows(load_config(None, ["data.train_files=[nowhere.jsonl]"]))


def test_max_prompt_length_is_enforced_on_the_training_prompts(tiny_world):
    from transformers import AutoTokenizer

    from searchr1_lld.learner.factories import check_prompt_lengths, load_train_rows
    from searchr1_lld.rollout.agent_loop import encode_prompt

    rows = load_train_rows(load_config(None, world_args(tiny_world)))
    tok = AutoTokenizer.from_pretrained(str(tiny_world / "tokenizer"))
    longest = max(len(encode_prompt(tok, r["question"], "tiny")) for r in rows)
    check_prompt_lengths(rows, tok, load_config(None, [f"data.max_prompt_length={longest}"]))  # fits exactly
    with pytest.raises(ValueError, match=rf"data.max_prompt_length={longest - 1}: the training prompt of row .* is "
                                         rf"{longest} tokens"):
        check_prompt_lengths(rows, tok, load_config(None, [f"data.max_prompt_length={longest - 1}"]))


def test_the_evaluations_before_and_after_training_show_progress(tiny_world, shared_retriever, tmp_path, capsys):
    cfg = _cfg(tmp_path, "trainer.total_steps=1", "trainer.eval_limit=2", "trainer.save_every=0",
               "logging.progress_bar=true")
    _trainer(cfg, tiny_world, shared_retriever).run()
    err = capsys.readouterr().err.replace("\r", "\n")
    for bar in ("eval test (before training): 100%", "train: 100%", "eval test (after training): 100%"):
        assert bar in err, err[-3000:]
    assert err.index("eval test (before training)") < err.index("train: ") < err.index("eval test (after training)")


def test_the_fast_paths_train_as_the_reference_paths_do(tmp_path, tiny_world, shared_retriever, monkeypatch):
    """Three training steps (groups of 4, LLDS on, KL on) with the KV decoder and shared-prompt packing, and with
    the model(...) decoder and one prompt per row: the same samples and the same metrics to float rounding."""
    from searchr1_lld.learner import policy_logprobs
    from searchr1_lld.rollout.backends.hf import HFBackend

    runs = {}
    for fast in (True, False):
        cfg = _cfg(tmp_path / str(fast), "trainer.train_batch_size=4", "rollout.n=4", "trainer.ppo_mini_batch_size=8",
                   "rollout.max_turns=2", "trainer.micro_batch_token_budget=1200")
        tr = _trainer(cfg, tiny_world, shared_retriever)
        if not fast:
            learner = tr.learner
            learner.backend = HFBackend(learner.model, learner.tokenizer, batch_size=cfg.rollout.generation_batch_size,
                                        seed=learner.backend.seed, shares_learner_weights=True, fast_decode=False)
            monkeypatch.setattr(policy_logprobs, "shares_prompts", lambda model: False)
        assert (tr.learner.backend.kv_decoder is not None) == fast
        runs[fast] = [tr.train_step() for _ in range(3)]
        monkeypatch.undo()
    for fast_m, ref_m in zip(runs[True], runs[False]):
        assert fast_m["rollout/response_length_mean"] == ref_m["rollout/response_length_mean"]
        for key in ("actor/pg_loss", "actor/kl_ref", "actor/entropy", "actor/grad_norm", "llds/active_token_frac",
                    "lld/correct_logp_new_per_token", "probe/logp_per_token"):
            assert fast_m[key] == pytest.approx(ref_m[key], rel=1e-3, abs=1e-6), key
    assert runs[True][-1]["llds/active_token_frac"] > 0
