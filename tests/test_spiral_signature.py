"""The paper's death-spiral signature on hand-made curves (searchr1_lab/spiral/signature.py), with the registered
parameters of docs/lab/spiral/signature.json (window 10, held-out window 30, N 50, gains 0.10 / 0.05, X 0.10, k 2,
M 20)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import REPO_ROOT
from searchr1_lab.spiral.signature import (SIGNATURE_FILE, SignatureParams, load_params, run_series, signature,
                                           stretches, trailing_mean, warmup_end)

PARAMS = load_params(REPO_ROOT / SIGNATURE_FILE)
STEPS = 200


def ramp(t: int, t0: int, t1: int, v0: float, v1: float) -> float:
    """``v0`` before ``t0``, ``v1`` after ``t1``, linear in between."""
    if t <= t0:
        return v0
    if t >= t1:
        return v1
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def rise_then_fall(t: int, top: int = 100, start: int = 14, low: float = 0.3, high: float = 0.7) -> float:
    """Flat at ``low`` to ``start``, up to ``high`` at ``top``, down to 0.1 twenty steps later."""
    return ramp(t, start, top, low, high) if t <= top else ramp(t, top, top + 20, high, 0.1)


def records(reward, probe, entropy, grad_norm, held_out=None, warmup: int = 5, eval_every: int = 10,
            probe_every: int = 2) -> list[dict]:
    """A compact run file's records: step 0 with the held-out EM, then every step with the learning rate rising
    linearly to its peak at ``warmup``; held-out EM every ``eval_every`` steps (default: the reward's curve) and the
    probe every ``probe_every``."""
    held_out = held_out or reward
    out = [{"step": 0, "eval/val_sub_em": held_out(0)}]
    for t in range(1, STEPS + 1):
        r = {"step": t, "reward/em_mean": reward(t), "actor/entropy": entropy(t), "actor/grad_norm": grad_norm(t),
             "actor/lr": 1e-4 * min(t, warmup) / warmup}
        if t % eval_every == 0:
            r["eval/val_sub_em"] = held_out(t)
        if t % probe_every == 0:
            r["probe/logp_per_token"] = probe(t)
        out.append(r)
    return out


def falling_probe(t: int) -> float:
    """-0.05 to step 40, -0.35 at step 100 (while the reward of :func:`rise_then_fall` still rises), -1.0 later."""
    return ramp(t, 40, 100, -0.05, -0.35) if t <= 100 else ramp(t, 100, 130, -0.35, -1.0)


def explosion_from(start: int, level: float):
    """``level`` before ``start``, 3.5 x ``level`` from it on (a sustained explosion)."""
    return lambda t: level if t < start else 3.5 * level


def spike(start: int, steps: int, level: float, after: float):
    """``level``, 10 x ``level`` for ``steps`` steps from ``start``, then ``after`` x ``level`` (a dead state)."""
    return lambda t: level if t < start else (10 * level if t < start + steps else after * level)


def test_present():
    run = run_series(records(rise_then_fall, falling_probe, explosion_from(110, 0.3), explosion_from(110, 1.0)))
    sig = signature(run, PARAMS)
    assert run.warmup_end == 5
    a, b, c = sig.learning, sig.lld, sig.explosion
    # by hand: R̄(14) = 0.3; the reward climbs 0.4 / 86 a step to 0.7 at step 100 and falls 0.03 a step after it, so
    # the 10-step mean is largest at step 101: (9 x reward(96) + 0.67) / 10 = (9 x 0.68140 + 0.67) / 10 = 0.68026
    assert a.present and a.evidence["start"] == 14 and a.evidence["peak"] == 101
    assert a.evidence["reward_gain"] == pytest.approx(0.38026, abs=1e-4) and a.evidence["held_out_gain"] > 0.2
    assert b.present and b.evidence["drop"] == pytest.approx(0.28, abs=0.03)
    assert b.evidence["from_step"] < b.evidence["to_step"] <= a.evidence["peak"]
    assert b.evidence["reward_to"] > b.evidence["reward_from"]
    assert c.present and c.evidence["entropy_level"] == pytest.approx(0.3)
    assert c.evidence["grad_norm_level"] == pytest.approx(1.0)
    assert c.evidence["first_from"] == 110 and c.evidence["longest_steps"] == STEPS - 110 + 1
    assert sig.present


def test_absent_on_flat_curves():
    flat = lambda value: (lambda t: value)  # noqa: E731
    sig = signature(run_series(records(flat(0.5), flat(-0.05), flat(0.3), flat(1.0))), PARAMS)
    assert not sig.learning.present and sig.learning.evidence["reward_gain"] == pytest.approx(0.0)
    assert not sig.lld.present and not sig.explosion.present and sig.explosion.evidence["longest_steps"] == 0
    assert not sig.present


def test_a_transient_spike_is_not_a_sustained_explosion():
    """Spikes of 10x for 5 steps, then a dead state below the learning-phase level (what the lab's collapses did)."""
    run = run_series(records(rise_then_fall, falling_probe, spike(110, 5, 0.3, 0.1), spike(110, 5, 1.0, 0.01)))
    sig = signature(run, PARAMS)
    assert sig.learning.present and sig.lld.present
    assert not sig.explosion.present
    assert sig.explosion.evidence["longest_steps"] == 5 and sig.explosion.evidence["longest_from"] == 110
    assert sig.explosion.evidence["entropy_alone_steps"] == 5 and sig.explosion.evidence["grad_norm_alone_steps"] == 5
    assert not sig.present


def test_entropy_high_while_the_gradient_vanishes_is_no_explosion():
    """After the reward falls to zero no group has an advantage: entropy stays 3.5x up, the gradient norm near 0."""
    grad = lambda t: 1.0 if t < 110 else 0.005  # noqa: E731
    sig = signature(run_series(records(rise_then_fall, falling_probe, explosion_from(110, 0.3), grad)), PARAMS)
    assert not sig.explosion.present and sig.explosion.evidence["longest_steps"] == 0
    assert sig.explosion.evidence["entropy_alone_steps"] == STEPS - 110 + 1
    assert sig.explosion.evidence["grad_norm_alone_steps"] == 0


def test_learning_inside_the_warm_up_only():
    """The reward rises over steps 1-20 inside a 30-step warm-up and stays flat after; the likelihood falls and an
    explosion follows later: no learning phase, so no signature."""
    reward = lambda t: ramp(t, 1, 20, 0.3, 0.7)  # noqa: E731
    probe = lambda t: ramp(t, 60, 120, -0.05, -0.5)  # noqa: E731
    run = run_series(records(reward, probe, explosion_from(150, 0.3), explosion_from(150, 1.0), warmup=30))
    sig = signature(run, PARAMS)
    assert run.warmup_end == 30 and sig.learning.evidence["start"] == 39
    assert not sig.learning.present and sig.learning.evidence["reward_gain"] == pytest.approx(0.0)
    assert not sig.lld.present  # the reward never rises between two steps after the warm-up
    assert sig.explosion.present
    assert not sig.present


def test_lld_while_the_reward_already_falls_is_not_lld_in_the_learning_phase():
    """The reward rises to step 100; the probe set is flat until then and falls only as the reward falls."""
    probe = lambda t: -0.05 if t <= 100 else ramp(t, 100, 140, -0.05, -1.0)  # noqa: E731
    run = run_series(records(rise_then_fall, probe, explosion_from(110, 0.3), explosion_from(110, 1.0)))
    sig = signature(run, PARAMS)
    assert sig.learning.present and sig.explosion.present
    assert not sig.lld.present and sig.lld.evidence["drop"] < 0.01
    assert not sig.present


def test_a_reward_rise_without_held_out_gain_is_no_learning_phase():
    flat = lambda t: 0.4  # noqa: E731
    run = run_series(records(rise_then_fall, falling_probe, explosion_from(110, 0.3), explosion_from(110, 1.0),
                             held_out=flat))
    sig = signature(run, PARAMS)
    assert sig.learning.evidence["reward_gain"] > 0.3 and sig.learning.evidence["held_out_gain"] == pytest.approx(0.0)
    assert not sig.learning.present and not sig.present


def test_an_explosion_before_the_likelihood_falls_does_not_complete_the_signature():
    """The explosion's stretch (steps 20-60) ends before the probe set starts to fall (step 70)."""
    probe = lambda t: ramp(t, 70, 100, -0.05, -0.4)  # noqa: E731
    burst = lambda level: (lambda t: 3 * level if 20 <= t < 60 else level)  # noqa: E731
    sig = signature(run_series(records(rise_then_fall, probe, burst(0.3), burst(1.0))), PARAMS)
    assert sig.learning.present and sig.lld.present and sig.explosion.present
    assert sig.lld.evidence["from_step"] >= 60 and sig.explosion.evidence["first_from"] == 20
    assert not sig.present


def test_trailing_mean_by_hand():
    steps = np.array([1, 2, 3, 4])
    values = np.array([1.0, 2.0, 3.0, math.nan])
    out = trailing_mean(steps, steps, values, window=2, start=2)
    assert math.isnan(out[0])
    assert list(out[1:]) == [2.0, 2.5, 3.0]


def test_stretches_and_warmup_end_by_hand():
    assert stretches(np.array([True, True, False, True, True, True])) == [(0, 2), (3, 3)]
    assert stretches(np.array([False])) == []
    recs = [{"step": s, "actor/lr": lr} for s, lr in ((1, 1e-4), (2, 2e-4), (3, 3e-4), (4, 3e-4))]
    assert warmup_end(recs) == 3
    with pytest.raises(ValueError):
        warmup_end([{"step": 1}])


def test_the_registered_parameters_are_complete():
    assert PARAMS == SignatureParams(window=10, held_out_window=30, min_learning_steps=50, reward_gain=0.1,
                                     held_out_gain=0.05, lld_drop=0.1, explosion_ratio=2.0, explosion_steps=20)
    with pytest.raises(ValueError):
        SignatureParams.from_dict({"window": 10})
