"""LLD monitor: hand-computed likelihood metrics, shared first actions, and the phase detector on synthetic series."""

import math

import pytest
import torch

from searchr1_lld.instruments.monitor import (
    PhaseDetector,
    PhaseThresholds,
    ProbeSet,
    alarm_steps,
    engine_learner_gap,
    first_action_ids,
    likelihood_metrics,
    linear_slope,
    reward_collapse_step,
    shared_first_action_fraction,
    warning_accounting,
)


def test_likelihood_metrics_hand_computed():
    # 3 responses, T = 3; rows 0, 1 correct, row 2 incorrect; last token of row 1 is an observation (mask 0)
    logp_old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    logp_new = torch.tensor([[-0.5, -1.0, -1.0], [-2.5, -2.0, -0.0], [-1.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1]])
    rewards = torch.tensor([1.0, 1.0, 0.0])
    m = likelihood_metrics(logp_old, logp_new, mask, rewards)
    # correct: old sums -3, -4 over 5 tokens; new sums -2.5, -4.5
    assert m["lld/correct_logp_old_per_token"] == pytest.approx(-7 / 5)
    assert m["lld/correct_logp_new_per_token"] == pytest.approx(-7 / 5)
    assert m["lld/correct_logp_old_per_response"] == pytest.approx(-3.5)
    assert m["lld/correct_delta_per_response"] == pytest.approx((0.5 - 0.5) / 2)
    assert m["lld/rate"] == pytest.approx(0.5)  # row 1 has Delta = -0.5 <= 0
    assert m["lld/incorrect_delta_per_token"] == pytest.approx(-1.0 / 3)
    assert m["lld/num_correct"] == 2 and m["lld/num_incorrect"] == 1


def test_likelihood_metrics_no_correct_is_nan_and_shapes_checked():
    z = torch.zeros(2, 3)
    m = likelihood_metrics(z, z, torch.ones(2, 3), torch.zeros(2))
    assert math.isnan(m["lld/rate"]) and math.isnan(m["lld/correct_logp_old_per_token"])
    with pytest.raises(ValueError):
        likelihood_metrics(z, torch.zeros(2, 4), torch.ones(2, 3), torch.zeros(2))


def test_first_action_and_shared_fraction():
    assert first_action_ids([5, 6, 7, 8, 9], [0, 1, 1, 0, 1]) == (6, 7)
    assert first_action_ids([5], [0]) == ()
    firsts = [(1, 2), (1, 2), (3,), (1, 2), (4,)]
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0]
    groups = [0, 0, 0, 1, 1]  # group 1 has no correct response: not counted
    assert shared_first_action_fraction(firsts, rewards, groups) == pytest.approx(0.5)
    assert math.isnan(shared_first_action_fraction([(1,)], [0.0], [0]))


def test_engine_learner_gap():
    eng = torch.tensor([[-1.0, -2.0], [0.0, 0.0]])
    lrn = torch.tensor([[-1.5, -2.0], [-3.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert engine_learner_gap(eng, lrn, mask, torch.tensor([True, False])) == pytest.approx(0.25)
    assert math.isnan(engine_learner_gap(eng, lrn, mask, torch.tensor([False, False])))


def test_linear_slope():
    assert linear_slope([1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert linear_slope([1.0, float("nan"), 5.0]) == pytest.approx(2.0)
    assert math.isnan(linear_slope([1.0]))


def _series(n, reward, logp, grad, ent):
    return [{"reward/em_mean": reward(i), "lld/correct_logp_old_per_token": logp(i), "actor/grad_norm": grad(i),
             "actor/entropy": ent(i)} for i in range(n)]


def _final(history):
    det = PhaseDetector()
    report = None
    for i in range(len(history)):
        report = det.detect(history[: i + 1])
    return report


def test_phase_healthy():
    r = _final(_series(10, lambda i: 0.2 + 0.02 * i, lambda i: -1.0 + 0.05 * i, lambda i: 1.0, lambda i: 1.0))
    assert r.phase == "healthy" and r.warning is None


def test_phase_early_stagnation():
    r = _final(_series(10, lambda i: 0.2 + 0.02 * i, lambda i: -1.0 + 0.001 * (i % 2), lambda i: 1.0, lambda i: 1.0))
    assert r.phase == "early_stagnation"
    assert r.evidence["reward_slope"] == pytest.approx(0.02)


def test_phase_steady_decay_with_early_warning():
    r = _final(_series(10, lambda i: 0.2 + 0.02 * i, lambda i: -1.0 - 0.05 * i, lambda i: 1.0, lambda i: 1.0))
    assert r.phase == "steady_decay"
    assert r.warning is not None and "early warning" in r.warning
    assert r.evidence["logp_slope"] == pytest.approx(-0.05)


def test_phase_accelerated_collapse():
    def reward(i):
        return 0.2 + 0.05 * i if i < 8 else 0.05

    def logp(i):
        return -1.0 - 0.05 * i if i < 8 else -3.0

    def grad(i):
        return 1.0 if i < 8 else 20.0

    r = _final(_series(12, reward, logp, grad, lambda i: 1.0 if i < 8 else 4.0))
    assert r.phase == "accelerated_collapse"
    assert r.evidence["grad_norm_ratio"] >= 5.0
    assert any("grad norm" in s for s in r.reasons)


def _with_probe(history, every, probe):
    """Put ``probe(i)`` into every ``every``-th record (the trainer measures the probe set every probe_every steps)."""
    for i, h in enumerate(history):
        if i % every == 0:
            h["probe/logp_per_token"] = probe(i)
    return history


def test_falling_probe_is_steady_decay_while_sampled_correct_likelihood_rises():
    # the GRPO lr 2e-3 pilot's shape: entropy falls, so the sampled correct responses get likelier (+0.02/step) while
    # the fixed probe set falls 0.1 nats/token per 5 steps (slope -0.02/step) and reward still rises
    def history():
        return _series(16, lambda i: 0.1 + 0.01 * i, lambda i: -0.3 + 0.02 * i, lambda i: 0.3, lambda i: 1.0 - 0.05 * i)

    r = _final(_with_probe(history(), 5, lambda i: -0.1 - 0.02 * i))
    assert r.evidence["logp_slope"] == pytest.approx(0.02)
    # its last 3 measurements (steps 5, 10, 15: -0.2, -0.3, -0.4), at their positions
    assert r.evidence["probe_slope"] == pytest.approx(-0.02)
    assert r.phase == "steady_decay" and any("probe-set log-likelihood falling" in s for s in r.reasons)
    assert r.warning is not None and "-0.0200" in r.warning
    # the sampled series alone reads that run as healthy
    assert _final(history()).phase == "healthy"


def test_reward_crash_while_likelihood_still_falls_is_collapse_without_explosion():
    # reward peaks at 0.32 (step 9) and crashes to 0.06; the probe set keeps falling; entropy falls (no explosion)
    def reward(i):
        return 0.1 + 0.02 * i if i < 10 else 0.06

    def history(probe):
        hist = _series(16, reward, lambda i: -0.1, lambda i: 0.3, lambda i: 1.0 - 0.05 * i)
        return _with_probe(hist, 5, probe) if probe else hist

    r = _final(history(lambda i: -0.1 - 0.03 * i))
    assert r.evidence["probe_drop_from_peak"] == pytest.approx(0.45)  # below the 1 nat/token "likelihood low" bar
    assert r.phase == "accelerated_collapse" and "still falling" in r.reasons[0] and "reward 0.060" in r.reasons[1]
    # the same reward crash with a flat probe set is not a collapse (reward noise alone is not the death spiral)
    assert _final(history(lambda i: -0.1)).phase == "healthy"


def test_flat_probe_with_rising_reward_is_early_stagnation():
    hist = _with_probe(_series(16, lambda i: 0.1 + 0.01 * i, lambda i: -0.3 + 0.02 * i, lambda i: 0.3, lambda i: 1.0),
                       5, lambda i: -0.1 - 0.001 * i)
    r = _final(hist)
    assert r.evidence["probe_slope"] == pytest.approx(-0.001)
    assert r.phase == "early_stagnation" and "probe-set log-likelihood is flat" in r.reasons[0]
    assert r.warning is None


def test_probe_trend_needs_min_points_measurements():
    # two probe measurements are not a trend: the sampled series decides (rising: healthy)
    hist = _with_probe(_series(8, lambda i: 0.1 + 0.01 * i, lambda i: -0.3 + 0.02 * i, lambda i: 0.3, lambda i: 1.0),
                       5, lambda i: -0.1 - 0.05 * i)
    r = _final(hist)
    assert math.isnan(r.evidence["probe_slope"]) and r.phase == "healthy"


def test_phase_too_few_points_is_not_a_trend():
    r = _final(_series(2, lambda i: 0.1 * i, lambda i: -float(i), lambda i: 1.0, lambda i: 1.0))
    assert r.phase == "healthy" and "no trend" in r.reasons[0]


class _T:
    def __init__(self, rid, reward):
        self.row, self.reward = {"id": rid}, reward


def test_probe_set_takes_one_batch_and_measures():
    probe = ProbeSet(2)
    assert not probe.offer([_T("a", 0.0), _T("b", 0.0)])  # no correct response: still empty
    assert probe.offer([_T("a", 0.0), _T("b", 1.0), _T("b", 1.0)])  # one per prompt, from this batch only
    assert not probe.offer([_T("c", 1.0), _T("d", 1.0)])  # frozen: every measurement is over the same responses
    assert [t.row["id"] for t in probe.trajectories] == ["b"] and probe.filled and not probe.measured
    probe = ProbeSet(2)
    probe.offer([_T("b", 1.0), _T("c", 1.0), _T("d", 1.0)])
    assert [t.row["id"] for t in probe.trajectories] == ["b", "c"]
    out = probe.measure(lambda trajs: (torch.tensor([[-1.0, -3.0], [-2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])))
    assert out["probe/logp_per_token"] == pytest.approx(-6 / 3)
    assert out["probe/logp_per_response"] == pytest.approx(-3.0)
    assert probe.measured


def test_phase_collapse_seen_through_probe_when_no_correct_responses_are_sampled():
    # the lab's GRPO lr 3e-3 run: correct responses stop being sampled (no new points), grad norm explodes, the fixed
    # probe set's likelihood falls from -2.4 to -10 nats/token; reward has not crashed yet at the explosion step
    hist = _series(8, lambda i: 0.1 + 0.01 * i, lambda i: -0.5 if i < 4 else float("nan"),
                   lambda i: 0.5 if i < 6 else 16.0, lambda i: 1.0)
    for i, probe in enumerate([-2.4, None, -3.3, None, -6.3, None, -10.0, None]):
        if probe is not None:
            hist[i]["probe/logp_per_token"] = probe
    r = _final(hist)
    assert r.phase == "accelerated_collapse"
    assert r.evidence["probe_drop_from_peak"] == pytest.approx(7.6)
    assert any("probe-set" in s for s in r.reasons)
    # without the probe series the same history is not called a collapse (reward has not crashed)
    for h in hist:
        h.pop("probe/logp_per_token", None)
    assert _final(hist).phase != "accelerated_collapse"


def test_phase_collapse_is_sticky_while_reward_stays_crashed():
    # explosion at steps 8-9, then grad norm and entropy settle again but reward stays at 0: still collapsed
    def grad(i):
        return 15.0 if i in (8, 9) else 0.5

    hist = _series(16, lambda i: 0.3 if i < 8 else 0.0, lambda i: -0.5 if i < 8 else float("nan"), grad,
                   lambda i: 1.0)
    r = _final(hist)
    assert r.phase == "accelerated_collapse"
    assert any("exploded earlier" in s for s in r.reasons)
    # and recovery (reward back above the crash threshold) ends it
    hist += _series(4, lambda i: 0.3, lambda i: -0.5, lambda i: 0.5, lambda i: 1.0)
    assert _final(hist).phase != "accelerated_collapse"


def test_reported_phase_needs_persistence():
    # the raw rules call the last step a collapse (grad norm x20, likelihood 2.5 nats below peak, reward crashed);
    # one step is not evidence enough, two consecutive steps are
    hist = _series(10, lambda i: 0.3 if i < 9 else 0.0, lambda i: -0.5 if i < 9 else -3.0,
                   lambda i: 1.0 if i < 9 else 20.0, lambda i: 1.0)
    det = PhaseDetector()
    assert det.raw(hist).phase == "accelerated_collapse"
    assert det.detect(hist).phase != "accelerated_collapse"
    hist2 = _series(11, lambda i: 0.3 if i < 9 else 0.0, lambda i: -0.5 if i < 9 else -3.0,
                    lambda i: 1.0 if i < 9 else 20.0, lambda i: 1.0)
    assert det.detect(hist2).phase == "accelerated_collapse"
    # persistence grows with the run: max(persist, ceil(persist_frac * run_steps))
    assert PhaseThresholds(run_steps=3).persistence() == 2
    assert PhaseThresholds(run_steps=40).persistence() == 4
    assert PhaseDetector(PhaseThresholds(run_steps=40)).detect(hist2).phase != "accelerated_collapse"


def test_reward_collapse_step_by_hand():
    # smoothed (2-step mean): 0.1, 0.15, 0.25, 0.3, 0.15, 0.0, 0.0 ; peak 0.3 -> crashed where <= 0.09: indices 5, 6
    r = [0.1, 0.2, 0.3, 0.3, 0.0, 0.0, 0.0]
    assert reward_collapse_step(r) == 5
    assert reward_collapse_step(r, persist=3) is None  # only 2 crashed steps at the end
    assert reward_collapse_step([0.3, 0.3, 0.0, 0.0, 0.3, 0.3]) is None  # recovered: not a collapse
    assert reward_collapse_step([0.02, 0.0, 0.0, 0.0]) is None  # peak below min_peak: nothing to collapse from


def test_warning_accounting_outcomes():
    steps = list(range(1, 8))
    crash = [0.1, 0.2, 0.3, 0.3, 0.0, 0.0, 0.0]  # collapses at step 6
    assert warning_accounting(steps, crash, [3, 4]) == {"collapse_step": 6, "first_alarm_step": 3,
                                                        "lead_steps": 3, "outcome": "warned"}
    assert warning_accounting(steps, crash, [6])["outcome"] == "late"
    assert warning_accounting(steps, crash, [])["outcome"] == "missed"
    flat = [0.2] * 7
    assert warning_accounting(steps, flat, [2])["outcome"] == "false_alarm"
    assert warning_accounting(steps, flat, [])["outcome"] == "quiet"
    # alarms: the early warning, or a reported steady_decay / accelerated_collapse
    phases = ["healthy", "healthy", "early_stagnation", "steady_decay", "healthy", "accelerated_collapse", "healthy"]
    assert alarm_steps(steps, phases, [2]) == [2, 4, 6]


def test_alarm_lead_on_the_measured_lr3e3_pilot():
    """GRPO, lr 3e-3, seed 0 on the first lab's world (numbers copied from that run's metrics): reward crashes to
    0 for good at step 8; the correct / probe likelihood fell and entropy jumped from step 2-3, so the detector
    reports accelerated_collapse from step 4 (raw from step 3, held 2 steps): an alarm 4 steps ahead."""
    nan = float("nan")
    reward = [0.039, 0.117, 0.039, 0.031, 0.008, 0.094, 0.039, 0.000, 0.000, 0.000]
    correct = [-0.522, -2.993, -1.538, -0.860, -0.460, -0.465, -0.784, nan, nan, nan]
    probe = [None, -2.419, None, -3.330, None, -6.317, None, -10.033, None, -9.538]
    grad = [0.34, 0.64, 0.16, 0.30, 0.19, 5.21, 15.95, 0.03, 0.001, 0.004]
    entropy = [0.547, 2.859, 0.721, 0.789, 0.462, 0.502, 0.659, 0.171, 0.048, 0.125]
    recs = []
    for i in range(10):
        r = {"reward/em_mean": reward[i], "lld/correct_logp_old_per_token": correct[i], "actor/grad_norm": grad[i],
             "actor/entropy": entropy[i]}
        if probe[i] is not None:
            r["probe/logp_per_token"] = probe[i]
        recs.append(r)
    t = PhaseThresholds(run_steps=10)
    det = PhaseDetector(t)
    phases = [det.detect(recs[: i + 1]).phase for i in range(10)]
    warnings = [i + 1 for i in range(10) if det.detect(recs[: i + 1]).warning]
    assert phases[:3] == ["healthy"] * 3 and phases[3] == "accelerated_collapse"
    steps = list(range(1, 11))
    acc = warning_accounting(steps, reward, alarm_steps(steps, phases, warnings), t)
    assert acc == {"collapse_step": 8, "first_alarm_step": 4, "lead_steps": 4, "outcome": "warned"}
    # the collapse alarm: probe best -2.419 (step 2); -3.330 at step 4 is 0.911 below it (>= 0.75), held from step 4,
    # so reported at step 5 (2 steps of persistence): 3 steps ahead of the crash
    drawdown = [i + 1 for i in range(10) if det.detect(recs[: i + 1]).drawdown_alarm]
    assert drawdown == [5, 6, 7, 8, 9, 10]
    assert warning_accounting(steps, reward, drawdown, t)["lead_steps"] == 3


def test_drawdown_alarm_by_hand():
    """probe best -0.2; -0.94 is 0.74 below it (no alarm), -0.96 is 0.76 below (raw alarm), held 2 steps -> alarm."""
    probe = [-0.3, -0.2, -0.5, -0.94, -0.96, -1.0]
    recs = [{"reward/em_mean": 0.3, "lld/correct_logp_old_per_token": -0.5, "actor/grad_norm": 1.0,
             "actor/entropy": 1.0, "probe/logp_per_token": p} for p in probe]
    det = PhaseDetector(PhaseThresholds())
    assert det.t.drawdown_alarm_logp == 0.75
    assert det.raw(recs[:4]).evidence["probe_drop_from_peak"] == pytest.approx(0.74)
    assert det.raw(recs[:4]).drawdown_alarm is None
    assert det.raw(recs[:5]).drawdown_alarm and "0.760 nats/token below its best" in det.raw(recs[:5]).drawdown_alarm
    assert det.detect(recs[:5]).drawdown_alarm is None  # held 1 step of the 2 needed
    assert det.detect(recs[:6]).drawdown_alarm is not None
    # a probe-less run never raises it
    assert all(det.raw([{k: v for k, v in r.items() if k != "probe/logp_per_token"} for r in recs[: i + 1]])
               .drawdown_alarm is None for i in range(6))


def test_rollout_metrics_one_name_per_metric():
    """Hand-built trajectories: generated tokens (mask) vs all response tokens, rates over trajectories / turns."""
    from searchr1_lld.instruments.monitor import rollout_metrics
    from searchr1_lld.rollout.types import Trajectory

    def traj(resp, mask, **kw):
        t = Trajectory(row={"id": "x", "golden_answers": []}, group_id=0, prompt_ids=[1], response_ids=resp,
                       response_mask=mask, answer_mask=[0] * len(resp), engine_logprobs=[0.0] * len(resp))
        for k, v in kw.items():
            setattr(t, k, v)
        return t

    a = traj([2, 3, 4], [1, 0, 1], reward=1.0, finish_reason="answer", prediction="x", num_turns=2, valid_searches=1,
             invalid_actions=1)
    b = traj([2], [1], finish_reason="length", num_turns=1, length_stops=1)
    m = rollout_metrics([a, b])
    assert m["reward/em_mean"] == 0.5 and m["rollout/valid_searches_mean"] == 0.5
    assert m["rollout/generated_tokens_mean"] == 1.5  # (2 + 1) / 2: the policy's own tokens
    assert m["rollout/response_length_mean"] == 2.0  # (3 + 1) / 2: generated + observation tokens
    assert m["rollout/turns_mean"] == 1.5 and m["rollout/invalid_action_rate"] == pytest.approx(1 / 3)
    assert m["rollout/finish_answer_rate"] == 0.5 and m["rollout/finish_length_rate"] == 0.5
    assert m["rollout/has_answer_rate"] == 0.5 and m["rollout/length_stops_mean"] == 0.5
    assert m["rollout/answer_span_miss_frac"] == 0.5  # a's answer has no token in its (empty) answer mask


def test_policy_step_kl_by_hand_and_on_a_toy_policy():
    """k3 per generated token, averaged: by hand on two tokens; and on samples of a 3-way toy policy it estimates
    the exact KL(pi_old || pi_new) = sum_v p_old log(p_old / p_new)."""
    import math

    from searchr1_lld.instruments.monitor import policy_step_kl

    logp_old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    logp_new = torch.log(torch.tensor([[0.4, 0.2, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    # token 0: 0.4/0.5 - log(0.4/0.5) - 1 = 0.8 + 0.22314 - 1 = 0.02314; token 1: 0; token 2 masked
    assert policy_step_kl(logp_old, logp_new, mask) == pytest.approx((0.8 - math.log(0.8) - 1) / 2, rel=1e-5)
    assert math.isnan(policy_step_kl(logp_old, logp_new, torch.zeros_like(mask)))
    p_old, p_new = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.4, 0.4, 0.2])
    exact = float((p_old * (p_old / p_new).log()).sum())  # 0.02527
    draws = torch.multinomial(p_old, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = policy_step_kl(p_old.log()[draws][None], p_new.log()[draws][None], torch.ones(1, len(draws)))
    assert estimate == pytest.approx(exact, abs=1e-3) and exact == pytest.approx(0.02527, abs=1e-4)
