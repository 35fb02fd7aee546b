"""The rollout correction in training on the test world (the transformers backend reports the engine's sampling
log-probs): the bypass presets train two steps with logp_old := the engine's log-probs and without the learner's
recompute of it; the decoupled presets train with their weights and rejection; the diagnostics are logged with the
correction off; a backend without log-probs is a clear error; the config errors name the key and the known values."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import on_world
from searchr1_lld.config import ConfigError, format_help, load_config, save_config
from searchr1_lld.config.correction_presets import CORRECTION_PRESETS
from searchr1_lld.learner import step
from test_trainer import SMALL, _trainer

DIAGNOSTICS = ("rollout/engine_learner_kl_k1", "rollout/engine_learner_kl_k3", "rollout/engine_ppl",
               "rollout/learner_ppl", "rollout/log_ppl_diff", "rollout/chi2_token", "rollout/chi2_seq")


@pytest.fixture(scope="module")
def retriever(tiny_world):
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(tiny_world / "index")


def _cfg(tmp_path, *extra):
    return load_config(None, [*SMALL, "trainer.total_steps=2", "trainer.probe_every=0", "trainer.save_every=0",
                              f"trainer.output_dir={tmp_path}", *extra])


def _spy(monkeypatch, learner):
    """Counts the forwards of the policy over whole batches, and records (batch, logp_old) handed to the update."""
    seen = {"policy_forwards": 0, "updates": []}
    real_logprobs, real_update = step.batch_logprobs, step.update_policy

    def batch_logprobs(lrn, model, batch):
        seen["policy_forwards"] += model is lrn.model
        return real_logprobs(lrn, model, batch)

    def update_policy(lrn, batch, advantages, logp_old, *args, **kw):
        seen["updates"].append((batch, logp_old))
        return real_update(lrn, batch, advantages, logp_old, *args, **kw)

    monkeypatch.setattr(step, "batch_logprobs", batch_logprobs)
    monkeypatch.setattr(step, "update_policy", update_policy)
    return seen


@pytest.mark.parametrize("preset", ["bypass_ppo_clip_k3_rs", "bypass_pg_geo_rs_seq_tis"])
def test_bypass_presets_train_two_steps_against_the_engine(tmp_path, tiny_world, retriever, monkeypatch, preset):
    cfg = _cfg(tmp_path, f"algorithm.rollout_correction.preset={preset}")
    assert cfg.algorithm.rollout_correction.bypass
    tr = _trainer(cfg, tiny_world, retriever)
    seen = _spy(monkeypatch, tr.learner)
    result = tr.run(evaluate=False)
    assert result.steps == 2 and len(seen["updates"]) == 2
    # logp_old is the engine's, and the learner ran one whole-batch forward per step: the monitor's, after the update
    for batch, logp_old in seen["updates"]:
        assert batch.has_engine_logprobs and torch.equal(logp_old, batch.engine_logprobs * batch.response_mask)
    assert seen["policy_forwards"] == 2
    for h in result.history:
        logged = [h[k] for k in ("actor/pg_loss", "actor/grad_norm", "rollout/engine_ppl",
                                 "rollout/engine_learner_kl_k1", "rollout/engine_learner_kl_k3",
                                 "rollout/masked_token_frac")]
        assert all(math.isfinite(v) for v in logged), h
        assert "rollout/learner_ppl" not in h and "rollout/engine_learner_logp_gap" not in h  # no learner recompute
        # measured over the update's micro-batches, between the policy being updated and the engine
        assert h["rollout/engine_learner_kl_k3"] >= 0 and 0 <= h["rollout/masked_token_frac"] <= 1
    if cfg.algorithm.rollout_correction.mode != "off":
        assert all(math.isfinite(h["rollout/tis_weight_mean"]) for h in result.history)


@pytest.mark.parametrize("preset", ["decoupled_seq_is_rs", "trl_sequence_mask"])
def test_decoupled_presets_train_two_steps_with_their_weights_and_rejection(tmp_path, tiny_world, retriever,
                                                                           monkeypatch, preset):
    cfg = _cfg(tmp_path, f"algorithm.rollout_correction.preset={preset}")
    tr = _trainer(cfg, tiny_world, retriever)
    seen = _spy(monkeypatch, tr.learner)
    result = tr.run(evaluate=False)
    assert result.steps == 2 and seen["policy_forwards"] == 4  # logp_old recomputed, and the monitor's forward
    for h in result.history:
        assert all(math.isfinite(h[k]) for k in (*DIAGNOSTICS, "rollout/tis_weight_mean", "actor/pg_loss")), h
        assert abs(h["rollout/tis_weight_mean"] - 1) < 1e-3  # fp32 engine = learner: ratio ~1, nothing capped
        assert ("rollout/masked_token_frac" in h) == (preset == "decoupled_seq_is_rs")
        assert h.get("rollout/masked_token_frac", 0.0) == 0.0


def test_decoupled_rejection_removes_tokens_from_the_update(tmp_path, tiny_world, retriever, monkeypatch):
    """A token rule with a bound of 1e-30 rejects every token whose engine and learner log-probs differ at all: the
    batch the update trains on has those tokens out of its response mask, the rest of the batch unchanged."""
    cfg = _cfg(tmp_path, "algorithm.rollout_correction.rejection=token_k2",
               "algorithm.rollout_correction.rejection_upper=1e-30")
    tr = _trainer(cfg, tiny_world, retriever)
    seen = []
    real = step.correction_weights

    def correction_weights(rc, batch, logp_old):
        out = real(rc, batch, logp_old)
        seen.append((batch, logp_old, out[1]))
        return out

    monkeypatch.setattr(step, "correction_weights", correction_weights)
    m = tr.train_step()
    (batch, logp_old, trained), = seen
    differs = (logp_old != batch.engine_logprobs) & (batch.response_mask != 0)
    assert m["rollout/masked_token_frac"] == pytest.approx(float(differs.sum()) / float(batch.response_mask.sum()))
    assert 0 < m["rollout/masked_token_frac"] < 1
    assert torch.equal(trained.response_mask, batch.response_mask * (~differs).float())
    assert torch.equal(trained.input_ids, batch.input_ids) and torch.equal(trained.rewards, batch.rewards)


def test_diagnostics_are_logged_with_the_correction_off(tmp_path, tiny_world, retriever):
    cfg = _cfg(tmp_path)
    assert cfg.algorithm.rollout_correction.mode == "off" and cfg.algorithm.rollout_correction.rejection == "off"
    m = _trainer(cfg, tiny_world, retriever).train_step()
    assert all(math.isfinite(m[k]) for k in DIAGNOSTICS)
    assert abs(m["rollout/engine_learner_kl_k1"]) < 1e-3 and m["rollout/engine_learner_kl_k3"] < 1e-5
    assert m["rollout/engine_ppl"] == pytest.approx(m["rollout/learner_ppl"], rel=1e-3)
    assert "rollout/tis_weight_mean" not in m and "rollout/masked_token_frac" not in m


@pytest.mark.parametrize("extra", [["algorithm.rollout_correction.bypass=true"],
                                   ["algorithm.rollout_correction.mode=token"]])
def test_a_backend_without_log_probs_is_a_clear_error(tmp_path, tiny_world, retriever, extra):
    tr = _trainer(_cfg(tmp_path, *extra), tiny_world, retriever)
    real = tr.learner.rollout

    def without_logprobs(rows, **kw):
        trajs = real(rows, **kw)
        for t in trajs:
            t.engine_logprobs = None
        return trajs

    tr.learner.rollout = without_logprobs
    with pytest.raises(RuntimeError, match="algorithm.rollout_correction.*reported none"):
        tr.train_step()


@pytest.mark.parametrize("overrides, key, message", [
    (["algorithm.rollout_correction.mode=tokens"], "algorithm.rollout_correction.mode", "token_mask"),
    (["algorithm.rollout_correction.rejection=seq_k3"], "algorithm.rollout_correction.rejection", "seq_mean_k3"),
    (["algorithm.rollout_correction.preset=seq_mis"], "algorithm.rollout_correction.preset", "decoupled_seq_is_rs"),
    (["algorithm.rollout_correction.cap=0.5"], "algorithm.rollout_correction.cap", ">= 1"),
    (["algorithm.rollout_correction.cap_lower=2.5"], "algorithm.rollout_correction.cap_lower", "(0, cap"),
    (["algorithm.rollout_correction.cap_lower=0"], "algorithm.rollout_correction.cap_lower", "(0, cap"),
    (["algorithm.rollout_correction.rejection=seq_mean_k3"], "algorithm.rollout_correction.rejection_upper",
     "needs a threshold"),
    (["algorithm.rollout_correction.rejection=seq_mean_k3", "algorithm.rollout_correction.rejection_upper=-1"],
     "algorithm.rollout_correction.rejection_upper", "> 0"),
    (["algorithm.rollout_correction.rejection=seq_mean_k3", "algorithm.rollout_correction.rejection_upper=0.01",
      "algorithm.rollout_correction.rejection_lower=0.001"], "algorithm.rollout_correction.rejection_lower",
     "k1 rules"),
    (["algorithm.rollout_correction.rejection=seq_sum_k1", "algorithm.rollout_correction.rejection_upper=0.5"],
     "algorithm.rollout_correction.rejection_upper", "1 / rejection_upper"),
    (["algorithm.rollout_correction.rejection=seq_sum_k1", "algorithm.rollout_correction.rejection_upper=2",
      "algorithm.rollout_correction.rejection_lower=3"], "algorithm.rollout_correction.rejection_lower",
     "(0, rejection_upper"),
    (["algorithm.rollout_correction.preset=bypass_pg_is", "algorithm.rollout_correction.mode=token"],
     "algorithm.rollout_correction.mode", "pins it to 'sequence'"),
    (["algorithm.rollout_correction.preset=bypass_pg_is", "algorithm.method=grpo"], "algorithm.policy_loss",
     "algorithm.method=grpo pins it to 'ppo_clip' and algorithm.rollout_correction.preset=bypass_pg_is to "
     "'reinforce'"),
])
def test_config_errors_name_the_key_and_the_known_values(overrides, key, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert str(e.value).startswith(key) and message in str(e.value), str(e.value)


def test_presets_expand_fill_thresholds_round_trip_and_show_in_help(tmp_path):
    cfg = load_config(None, ["algorithm.rollout_correction.preset=decoupled_k3_rs",
                             "algorithm.rollout_correction.rejection_upper=0.05"])  # a threshold stays a setting
    rc = cfg.algorithm.rollout_correction
    assert (rc.mode, rc.rejection, rc.rejection_upper, rc.bypass) == ("off", "seq_mean_k3", 0.05, False)
    cfg = load_config(None, ["algorithm.method=grpo", "algorithm.rollout_correction.preset=bypass_ppo_clip_geo_rs"])
    rc = cfg.algorithm.rollout_correction
    assert (rc.rejection, rc.rejection_lower, rc.rejection_upper, rc.bypass) == ("seq_mean_k1", 0.999, 1.001, True)
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    text = format_help()
    for name in (*CORRECTION_PRESETS, "seq_mean_k3", "token_mask", "sequence_mask", "algorithm.rollout_correction.bypass"):
        assert name in text, name
