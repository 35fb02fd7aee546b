"""The LLD monitor: measurements that make Lazy Likelihood Displacement and the death spiral visible.

Three parts:

1. Per-step measurements (pure functions over tensors / lists):
   - :func:`likelihood_metrics` — mean log-likelihood of correct and incorrect responses under the policy that sampled
     them (``old``) and after the step's updates (``new``), per token and per response, the displacement
     ``Delta(y) = log pi_new(y) - log pi_old(y)`` and the *LLD rate* (share of correct responses with Delta <= 0);
   - :func:`shared_first_action_fraction` — share of incorrect responses whose first action (the token ids of the
     first generated span, e.g. ``<think>..</think><search> q </search>``) is identical to the first action of a correct
     response in the same group: the paper's "shared prefix" cause, where penalising the wrong response drags the right
     one down;
   - :func:`rollout_metrics` — reward, valid searches, invalid-action rate, response length, turns;
   - :func:`engine_learner_gap` — mean |engine log-prob - learner log-prob| on generated tokens when the engine reports
     log-probs (a non-zero gap means rollout and training disagree about the sampled tokens).

2. :class:`PhaseDetector` (phases.py, re-exported here) — reads the logged series and names the phase of the run
   (``healthy`` / ``early_stagnation`` / ``steady_decay`` / ``accelerated_collapse``) with the numbers that support
   it, plus an early warning when correct-response likelihood trends down while reward still rises.

3. :class:`ProbeSet` — a fixed set of correct trajectories whose likelihood is re-measured every ``probe_every``
   steps (the same responses every time, so the trend is not confounded by what the rollout happened to sample).

Metric names say what they measure (``lld/correct_logp_old_per_token`` ...); :data:`PHASES` are ordered by severity.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from searchr1_lld.algo.kl import kl_penalty
from searchr1_lld.algo.spans import action_span_list
from searchr1_lld.instruments.phases import (ALARM_PHASES, PHASE_ID, PHASES, PhaseDetector, PhaseReport,  # noqa: F401
                                 PhaseThresholds, alarm_steps, linear_slope, reward_collapse_step, warning_accounting)

NAN = float("nan")


# --------------------------------------------------------------------------------------------------------------------
# Per-step measurements
# --------------------------------------------------------------------------------------------------------------------


def sequence_logp(token_logp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Log-likelihood of each response: ``logp(y_i) = sum_t m[i,t] * logp[i,t]``.  [B, T], [B, T] -> [B]."""
    if token_logp.shape != response_mask.shape:
        raise ValueError(f"token_logp {tuple(token_logp.shape)} and response_mask {tuple(response_mask.shape)} differ")
    return (token_logp.float() * response_mask.float()).sum(-1)


def correct_mask_from_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """A response is *correct* when its EM reward is 1 (rewards are 0/1 EM; the test is ``r > 0.5``).  [B] -> [B] bool."""
    return rewards.float() > 0.5


def policy_step_kl(logp_old: torch.Tensor, logp_new: torch.Tensor, response_mask: torch.Tensor) -> float:
    """The policy's step size over one training step: mean per generated token of the k3 estimate of
    KL(pi_old || pi_new) on the step's own samples (drawn from pi_old, so the estimate is unbiased and >= 0).

    logp_old, logp_new: [B, T] token log-probs before and after the step's updates; response_mask: [B, T].

        step_kl = sum_{i,t} m * k3(logp_old - logp_new) / sum_{i,t} m,   k3(x) = exp(-x) + x - 1   (algo/kl.py)

    NaN without generated tokens."""
    mask = response_mask.float()
    tokens = float(mask.sum())
    if tokens == 0:
        return NAN
    return float((kl_penalty(logp_old, logp_new, "low_var_kl") * mask).sum()) / tokens


def likelihood_metrics(
    logp_old: torch.Tensor,
    logp_new: torch.Tensor,
    response_mask: torch.Tensor,
    rewards: torch.Tensor,
) -> dict[str, float]:
    """Likelihood of correct / incorrect responses before and after the step's updates.

    Args:
        logp_old: [B, T] token log-probs under the policy that sampled the batch (before the step's updates).
        logp_new: [B, T] token log-probs under the policy after the step's optimiser updates.
        response_mask: [B, T] 1 on generated tokens.
        rewards: [B] EM rewards (correct = reward > 0.5).

    For S in {correct, incorrect}, V in {old, new}:
        lld/{S}_logp_{V}_per_token    = sum_{i in S,t} m logp_V / sum_{i in S,t} m
        lld/{S}_logp_{V}_per_response = mean_{i in S} sum_t m logp_V
        lld/{S}_delta_per_token       = per_token(new) - per_token(old)
        lld/{S}_delta_per_response    = mean_{i in S} Delta(y_i),  Delta(y) = sum_t m (logp_new - logp_old)
    lld/rate = |{i correct : Delta(y_i) <= 0}| / |correct|  (Lazy Likelihood Displacement rate)
    Values are NaN when the set is empty.
    """
    if not (logp_old.shape == logp_new.shape == response_mask.shape):
        raise ValueError("logp_old, logp_new and response_mask must have the same [B, T] shape")
    if rewards.shape != logp_old.shape[:1]:
        raise ValueError(f"rewards must be [B]={logp_old.shape[0]}, got {tuple(rewards.shape)}")
    mask = response_mask.float()
    correct = correct_mask_from_rewards(rewards)
    seq_old = sequence_logp(logp_old, mask)
    seq_new = sequence_logp(logp_new, mask)
    delta = seq_new - seq_old
    tokens = mask.sum(-1)
    out: dict[str, float] = {}
    for name, sel in (("correct", correct), ("incorrect", ~correct)):
        n = int(sel.sum())
        ntok = float(tokens[sel].sum())
        for tag, seq in (("old", seq_old), ("new", seq_new)):
            out[f"lld/{name}_logp_{tag}_per_token"] = float(seq[sel].sum()) / ntok if ntok > 0 else NAN
            out[f"lld/{name}_logp_{tag}_per_response"] = float(seq[sel].mean()) if n > 0 else NAN
        out[f"lld/{name}_delta_per_token"] = float(delta[sel].sum()) / ntok if ntok > 0 else NAN
        out[f"lld/{name}_delta_per_response"] = float(delta[sel].mean()) if n > 0 else NAN
        out[f"lld/num_{name}"] = float(n)
    n_correct = int(correct.sum())
    out["lld/rate"] = float((delta[correct] <= 0).float().mean()) if n_correct > 0 else NAN
    return out


def first_action_ids(response_ids: Sequence[int], response_mask: Sequence[int]) -> tuple[int, ...]:
    """Token ids of the first action span (first maximal run of generated tokens); ``()`` if none."""
    spans = action_span_list(list(response_mask))
    if not spans:
        return ()
    start, end = spans[0]
    return tuple(int(x) for x in response_ids[start:end])


def shared_first_action_fraction(
    first_actions: Sequence[tuple[int, ...]],
    rewards: Sequence[float],
    group_ids: Sequence[int],
) -> float:
    """Share of incorrect responses whose first action equals a correct response's first action in the same group.

    Denominator: incorrect responses in groups that contain at least one correct response (elsewhere there is nothing
    to share with). NaN when the denominator is 0.
    """
    if not (len(first_actions) == len(rewards) == len(group_ids)):
        raise ValueError("first_actions, rewards and group_ids must have the same length")
    correct_firsts: dict[int, set[tuple[int, ...]]] = {}
    for a, r, g in zip(first_actions, rewards, group_ids):
        if r > 0.5:
            correct_firsts.setdefault(int(g), set()).add(a)
    shared = total = 0
    for a, r, g in zip(first_actions, rewards, group_ids):
        if r <= 0.5 and int(g) in correct_firsts:
            total += 1
            shared += int(a in correct_firsts[int(g)])
    return shared / total if total else NAN


FINISH_REASONS = ("answer", "max_turns", "truncated", "length")


def rollout_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """Reward and behaviour of a rollout batch (Trajectory objects; see docs/architecture.md); means over
    trajectories unless named a rate. The one rollout-metrics function (the trainer and the benchmarks log these).

    reward/em_mean; rollout/valid_searches_mean; rollout/invalid_action_rate (invalid actions per turn);
    rollout/turns_mean; rollout/generated_tokens_mean (tokens the policy generated); rollout/response_length_mean
    (all response tokens: generated + observations); rollout/length_stops_mean, rollout/empty_turns_mean,
    rollout/eos_stops_mean (turns that hit the token cap / generated nothing / stopped at EOS);
    rollout/has_answer_rate (a closed answer was extracted); rollout/finish_<reason>_rate for the reasons in
    :data:`FINISH_REASONS`; rollout/answer_span_miss_frac (a closed answer in the text but no token in the answer mask:
    LLDS-MA would miss it; 0 unless tokenisation is unusual); rollout/truncated_frac (cut off by a length limit:
    ``Trajectory.cut_by_length``, what algorithm.mask_truncated_responses leaves out of the loss).
    """
    if not trajectories:
        raise ValueError("empty rollout batch")
    n = len(trajectories)
    mean = lambda f: sum(f(t) for t in trajectories) / n  # noqa: E731
    turns = sum(int(t.num_turns) for t in trajectories)
    out = {
        "reward/em_mean": mean(lambda t: float(t.reward)),
        "rollout/valid_searches_mean": mean(lambda t: int(t.valid_searches)),
        "rollout/invalid_action_rate": sum(int(t.invalid_actions) for t in trajectories) / turns if turns else 0.0,
        "rollout/turns_mean": turns / n,
        "rollout/generated_tokens_mean": mean(lambda t: sum(t.response_mask)),
        "rollout/response_length_mean": mean(lambda t: len(t.response_ids)),
        "rollout/length_stops_mean": mean(lambda t: t.length_stops),
        "rollout/empty_turns_mean": mean(lambda t: t.empty_turns),
        "rollout/eos_stops_mean": mean(lambda t: t.eos_stops),
        "rollout/has_answer_rate": mean(lambda t: t.prediction is not None),
        "rollout/answer_span_miss_frac": mean(lambda t: t.prediction is not None and not any(t.answer_mask)),
        "rollout/truncated_frac": mean(lambda t: t.cut_by_length),
    }
    for reason in FINISH_REASONS:
        out[f"rollout/finish_{reason}_rate"] = mean(lambda t: t.finish_reason == reason)
    return {k: float(v) for k, v in out.items()}


def engine_learner_gap(
    engine_logp: torch.Tensor, learner_logp: torch.Tensor, response_mask: torch.Tensor, has_engine_logprobs: torch.Tensor
) -> float:
    """Mean |engine - learner| token log-prob over generated tokens of rows whose engine reported log-probs.

    [B, T], [B, T], [B, T], [B] bool -> float (NaN when no row has engine log-probs).
    """
    rows = has_engine_logprobs.bool()
    if not bool(rows.any()):
        return NAN
    m = response_mask[rows].float()
    diff = (engine_logp[rows].float() - learner_logp[rows].float()).abs()
    denom = float(m.sum())
    return float((diff * m).sum()) / denom if denom > 0 else NAN


# --------------------------------------------------------------------------------------------------------------------
# Probe set
# --------------------------------------------------------------------------------------------------------------------


class ProbeSet:
    """A fixed set of correct trajectories whose likelihood is re-measured during training.

    Filled from the first rollout batch that holds correct responses (one per prompt, up to ``size``), then frozen:
    every measurement is over the same responses. The trainer measures it before the update of the step that filled
    it (``probe/initial_logp_per_token``: the likelihood the policy gave them when they were sampled) and then every
    ``trainer.probe_every`` steps after the update. ``measure(logp_fn)`` calls ``logp_fn(trajectories) ->
    (token_logp [B, T], response_mask [B, T])`` and returns ``probe/logp_per_token`` and ``probe/logp_per_response``
    (means over the probe set).
    """

    def __init__(self, size: int):
        if size < 0:
            raise ValueError("probe size must be >= 0")
        self.size = size
        self.trajectories: list[Any] = []
        self.measured = False  # measured at least once (the first measurement is the initial one)

    @property
    def filled(self) -> bool:
        """Whether the set has taken its responses (it takes them from one batch and then no more)."""
        return bool(self.trajectories) or self.size == 0

    def offer(self, trajectories: Sequence[Any]) -> bool:
        """Take the batch's correct trajectories, one per prompt, up to ``size``, if the set is still empty; returns
        whether this call filled it."""
        if self.filled:
            return False
        seen: set[Any] = set()
        for t in trajectories:
            if len(self.trajectories) >= self.size:
                break
            key = t.row.get("id") if isinstance(t.row, dict) else id(t.row)
            if float(t.reward) > 0.5 and key not in seen:
                self.trajectories.append(t)
                seen.add(key)
        return bool(self.trajectories)

    def state(self) -> list[Any]:
        return list(self.trajectories)

    def measure(self, logp_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        if not self.trajectories:
            return {}
        token_logp, mask = logp_fn(self.trajectories)
        self.measured = True
        seq = sequence_logp(token_logp, mask)
        return {
            "probe/logp_per_token": float(seq.sum()) / max(float(mask.float().sum()), 1.0),
            "probe/logp_per_response": float(seq.mean()),
            "probe/size": float(len(self.trajectories)),
        }
