"""One training step of the learner, top to bottom as in the diagram of trainer.py's docstring:

    sample -> rollout (dynamic sampling: more rounds; remax: greedy baselines) -> engine.sleep -> shaped rewards
    -> advantages -> logp_old / logp_ref -> rollout correction, NTHR
    -> ppo_epochs x mini-batches x micro-batches of objective + backward, one optimiser step per mini-batch
    -> logp_new -> LLD monitor -> probe set, phase -> weights to the engine -> engine.wake_up

The step composes the pure functions of ``searchr1_lld.algo``; it holds no loss math of its own. It receives the
:class:`~searchr1_lld.learner.state.Learner` (model, optimiser, engine, reference), the step's prompt rows and the LLD
instruments, and returns a :class:`StepResult`; the loop (:mod:`searchr1_lld.learner.trainer`) keeps the counters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from searchr1_lld import distributed
from searchr1_lld.algo import advantages as adv_fns
from searchr1_lld.algo import llds, rollout_correction, step_metrics, token_selection
from searchr1_lld.algo.objective import mini_batch_denominators, objective
from searchr1_lld.config import Config, RolloutCorrectionConfig
from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.instruments.monitor import (PHASE_ID, PhaseDetector, ProbeSet, engine_learner_gap,
                                              first_action_ids, likelihood_metrics, policy_step_kl, rollout_metrics,
                                              shared_first_action_fraction)
from searchr1_lld.instruments.phases import PhaseReport
from searchr1_lld.learner import batching, nthr_weights, policy_logprobs, sampling
from searchr1_lld.learner.state import Learner
from searchr1_lld.rollout.types import Trajectory, TrajectoryBatch, to_batch


@dataclass
class StepResult:
    """What one training step produced."""

    metrics: dict[str, Any]  # the step's metrics, averaged over ranks (float values), with the phase's name and id
    skipped_updates: int  # optimiser steps of this step skipped for a non-finite gradient
    phase_report: PhaseReport  # the phase detector's report after this step




def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(base_seed: int, step: int, rank: int, num_processes: int) -> int:
    """Seed of one (step, rank): distinct per rank and per step, fixed by the run's seed."""
    return base_seed * 1_000_003 + step * max(num_processes, 1) + rank


def llds_noop_warning(cfg: Config, updates_per_step: int) -> str | None:
    """The warning when LLDS is on but can never act (one optimiser step per rollout batch), else None."""
    a, t = cfg.algorithm, cfg.trainer
    if a.llds.enabled and a.llds.lam > 0 and not llds.llds_can_act(t.ppo_epochs, updates_per_step // t.ppo_epochs):
        return (
            "LLDS is enabled but is a permanent no-op: one optimiser step per rollout batch (ppo_epochs == 1 and "
            "ppo_mini_batch_size == train_batch_size x rollout.n responses) means logp_new == logp_old at every "
            "update. Use ppo_epochs > 1 or a smaller trainer.ppo_mini_batch_size."
        )
    return None


def train_step(learner: Learner, rows: list[dict[str, Any]], *, step: int, probe: ProbeSet,
               detector: PhaseDetector, history: Sequence[dict[str, Any]],
               more_rows: Callable[[], list[dict[str, Any]]] | None = None,
               sampled: sampling.StepRollout | None = None) -> StepResult:
    """Training step number ``step`` (0-based) on this rank's prompt ``rows``: rollout, advantages, ppo_epochs x
    mini-batches of updates, the LLD monitor (``probe`` re-measured every trainer.probe_every steps, ``detector``
    run on the earlier steps' ``history`` and this one's metrics), the new weights to the engine. ``more_rows``: the
    next rows of the prompt stream, this rank's share of a batch per call (algorithm.dynamic_sampling asks for them).
    ``sampled``: the rollout of ``rows`` made elsewhere (trainer.staleness >= 1: a rollout worker, possibly with older
    weights; learner/pipeline), trained instead of rolling out here."""
    cfg, dist = learner.cfg, learner.dist
    seed_everything(seed := step_seed(cfg.trainer.seed, step, dist.rank, dist.world_size))
    t0 = time.time()
    # rollout (the engine's memory handed over after it) and advantages; logp_old under the current policy (or the
    # engine's, in the rollout correction's bypass mode), logp_ref under the frozen initial one; rollout correction
    trajs, batch, advantages, metrics = rollout_to_batch(learner, rows, seed=seed, more_rows=more_rows,
                                                         sampled=sampled)
    rc = cfg.algorithm.rollout_correction
    logp_old = old_logprobs(learner, batch, bypass=rc.bypass)
    logp_ref = batch_logprobs(learner, learner.ref_model, batch) if learner.ref_model is not None else None
    metrics.update(mismatch_diagnostics(batch, None if rc.bypass else logp_old))
    token_weights, train_batch, weight_stats = step_token_weights(learner, batch, advantages, logp_old)
    metrics.update(weight_stats)
    valid_searches = mean_valid_searches(batch, learner)

    # the probe set: filled from the first batch with correct responses; measured (on every rank together, once all
    # ranks hold theirs) before the first update that follows, then every trainer.probe_every steps after the update
    probe.offer(trajs)
    measure_probe = bool(cfg.trainer.probe_every) and not distributed.any_rank(learner.accelerator, not probe.filled)
    if measure_probe and not probe.measured:
        metrics.update({k.replace("probe/", "probe/initial_"): v
                        for k, v in probe.measure(functools.partial(probe_logprobs, learner)).items()
                        if k != "probe/size"})

    # ppo_epochs x mini-batches x micro-batches of objective + backward; one guarded optimiser step per mini-batch
    update = update_policy(learner, train_batch, advantages, logp_old, logp_ref, token_weights, valid_searches,
                           step=step)
    metrics.update(update)

    # the LLD monitor: likelihoods after the step's updates. Its own forward: every forward of the update ran with
    # the weights before some optimiser step (the last mini-batch's included), none with the weights after the last
    metrics.update(monitor_metrics(learner, batch, trajs, logp_old))
    if measure_probe and (step + 1) % cfg.trainer.probe_every == 0:
        t_probe = time.time()
        metrics.update(probe.measure(functools.partial(probe_logprobs, learner)))
        metrics["time/probe_s"] = time.time() - t_probe
    metrics["time/step_s"] = time.time() - t0
    metrics = distributed.reduce_metrics(learner.accelerator, metrics)
    metrics.update(learner.adapt_step_size(step + 1, metrics["lld/step_kl"]))  # trainer.step_size, all ranks alike
    report = detector.detect([*history, metrics])
    metrics.update({"phase/name": report.phase, "phase/id": float(PHASE_ID[report.phase]),
                    "phase/drawdown_alarm": float(report.drawdown_alarm is not None)})

    # weights -> rollout engine, which takes its memory back
    learner.sync_engine()
    learner.backend.wake_up()
    return StepResult(metrics=metrics, skipped_updates=int(update["actor/skipped_updates"]), phase_report=report)


def rollout_to_batch(learner: Learner, rows: list[dict[str, Any]], *, seed: int,
                     more_rows: Callable[[], list[dict[str, Any]]] | None,
                     sampled: sampling.StepRollout | None = None
                     ) -> tuple[list[Trajectory], TrajectoryBatch, torch.Tensor, dict[str, Any]]:
    """The step's rollout to its batch (trajectories, tensors), advantages [B] and metrics: n responses per prompt
    (reward = EM; requests seeded from ``seed``; dynamic sampling: more rounds until the batch is full; ``sampled``:
    a rollout made elsewhere, taken as it is), for an estimator that needs baselines (remax) one greedy response per
    prompt, the engine put to sleep (woken after the step's weight stream), the rewards shaped
    (algorithm.reward_shaping) and the estimator registered as algorithm.advantage run on them
    (learner/sampling.py)."""
    cfg = learner.cfg
    if sampled is None:
        sampled = sampling.rollout_step(learner, rows, seed=seed, more_rows=more_rows)
    trajs = sampled.trajectories
    baselines, baseline_metrics = (sampling.greedy_baselines(learner, trajs)
                                   if adv_fns.needs_baselines(cfg.algorithm.advantage) else (None, {}))
    learner.backend.sleep()
    batch = to_batch(trajs, learner.tokenizer.pad_token_id)
    # the rollout metrics of every response generated (reward/em_mean: the policy's reward on the prompts drawn)
    metrics: dict[str, Any] = {**rollout_metrics(sampled.generated), **sampled.metrics, **baseline_metrics}
    scores, shaping_metrics = sampling.shaped_rewards(cfg, batch)
    metrics.update(shaping_metrics)
    advantages = adv_fns.get_advantage_fn(cfg.algorithm.advantage)(
        scores, batch.group_ids, batch.response_mask, eps=cfg.algorithm.adv_eps,
        **({} if baselines is None else {"baselines": baselines}))
    metrics["adv/nonzero_frac"] = float((advantages != 0).float().mean())  # responses that carry signal
    return trajs, batch, advantages, metrics


def monitor_metrics(learner: Learner, batch: TrajectoryBatch, trajs: list[Trajectory],
                    logp_old: torch.Tensor) -> dict[str, float]:
    """The LLD monitor of one step: the likelihoods of the step's responses after its updates (``logp_old`` [B, T]:
    before them), the policy's step size (``lld/step_kl``), and the share of groups whose correct and incorrect
    responses open with the same action."""
    t_monitor = time.time()
    logp_new = batch_logprobs(learner, learner.model, batch)
    out = {"time/monitor_forward_s": time.time() - t_monitor}
    out.update(likelihood_metrics(logp_old, logp_new, batch.response_mask, batch.rewards))
    out["lld/step_kl"] = policy_step_kl(logp_old, logp_new, batch.response_mask)
    out["lld/shared_first_action_frac"] = shared_first_action_fraction(
        [first_action_ids(t.response_ids, t.response_mask) for t in trajs], [t.reward for t in trajs],
        [t.group_id for t in trajs])
    return out


def mismatch_diagnostics(batch: TrajectoryBatch, logp_learner: torch.Tensor | None) -> dict[str, float]:
    """The engine/learner mismatch of the step's responses when the engine reported log-probs (correction on or off):
    rollout_correction.mismatch_metrics and rollout/engine_learner_logp_gap; ``logp_learner`` None (bypass mode: no
    recompute) leaves the engine's side alone."""
    if not batch.has_engine_logprobs:
        return {}
    out = rollout_correction.mismatch_metrics(logp_learner, batch.engine_logprobs, batch.response_mask)
    if logp_learner is not None:
        out["rollout/engine_learner_logp_gap"] = engine_learner_gap(
            batch.engine_logprobs, logp_learner, batch.response_mask,
            torch.ones(batch.responses.shape[0], dtype=torch.bool))
    return out


def old_logprobs(learner: Learner, batch: TrajectoryBatch, *, bypass: bool) -> torch.Tensor:
    """logp_old [B, T]: the learner's recompute under the current policy, or in the rollout correction's bypass mode
    the engine's sampling log-probs (no forward; an error when the backend reported none)."""
    if not bypass:
        return batch_logprobs(learner, learner.model, batch)
    if not batch.has_engine_logprobs:
        raise RuntimeError("algorithm.rollout_correction.bypass takes logp_old from the engine's sampling log-probs, "
                           "but the rollout backend reported none")
    return batch.engine_logprobs * batch.response_mask


def correction_weights(rc: RolloutCorrectionConfig, batch: TrajectoryBatch, logp_old: torch.Tensor
                       ) -> tuple[torch.Tensor | None, TrajectoryBatch, dict[str, float]]:
    """The step's rollout correction (algorithm.rollout_correction, decoupled mode): IS weights [B, T] (None if
    off), the batch to train on (its response mask without the tokens a rejection rule rejects), their statistics.
    Off, or in bypass mode (the policy loss corrects each micro-batch): (None, batch, {})."""
    if rc.bypass or not rollout_correction.is_on(rc):
        return None, batch, {}
    if not batch.has_engine_logprobs:
        raise RuntimeError("algorithm.rollout_correction needs the engine's sampling log-probs, but the rollout "
                           "backend reported none")
    c = rollout_correction.correct(rc, logp_old, batch.engine_logprobs, batch.response_mask)
    stats = rollout_correction.correction_stats(rc, logp_old, batch.engine_logprobs, batch.response_mask, c)
    return c.weights, dataclasses.replace(batch, response_mask=c.mask(batch.response_mask)), stats


def step_token_weights(learner: Learner, batch: TrajectoryBatch, advantages: torch.Tensor, logp_old: torch.Tensor
                       ) -> tuple[torch.Tensor | None, TrajectoryBatch, dict[str, float]]:
    """The step's per-token policy-loss weights [B, T] (None = 1), the batch to train on (without the tokens the
    rollout correction's rejection rule rejects) and their statistics: the rollout-correction weights
    (algorithm.rollout_correction, decoupled mode: :func:`correction_weights`) times NTHR's (algorithm.nthr: computed
    here, before the updates, under the policy of the step's rollout; learner/nthr_weights.py)."""
    tis, train_batch, stats = correction_weights(learner.cfg.algorithm.rollout_correction, batch, logp_old)
    nthr, nthr_stats = nthr_weights.step_weights(learner, batch, advantages,
                                                 functools.partial(model_rows, learner, learner.model, batch))
    stats.update(nthr_stats)
    return (nthr if tis is None else (tis if nthr is None else tis * nthr)), train_batch, stats


def truncation_masked(batch: TrajectoryBatch, mask_truncated: bool) -> TrajectoryBatch:
    """The batch the update trains on: with ``mask_truncated`` (algorithm.mask_truncated_responses) the response
    mask of every response a length limit cut off (``batch.cut_by_length``) zeroed
    (algo.token_selection.mask_responses), else ``batch`` itself."""
    if not mask_truncated:
        return batch
    return dataclasses.replace(batch, response_mask=token_selection.mask_responses(batch.response_mask,
                                                                                   batch.cut_by_length))


def mean_valid_searches(batch: TrajectoryBatch, learner: Learner) -> float:
    """The step's mean number of valid searches per response over all ranks (what adaptive LLDS-MA reads)."""
    acc = learner.accelerator
    return float(acc.reduce(batch.valid_searches.float().mean().to(acc.device), "mean"))


def update_policy(learner: Learner, batch: TrajectoryBatch, advantages: torch.Tensor, logp_old: torch.Tensor,
                  logp_ref: torch.Tensor | None, tis_weights: torch.Tensor | None, valid_searches: float, *,
                  step: int) -> dict[str, float]:
    """ppo_epochs x mini-batches of ppo_mini_batch_size responses (this rank: its 1/world_size share) x micro-batches
    (token budget; every rank runs the max count, padding ones weigh 0); one optimiser step per mini-batch.
    ``advantages`` [B]; ``logp_old``, ``logp_ref``, ``tis_weights`` (:func:`step_token_weights`) [B, T] on CPU. The
    responses cut off by a length limit train nothing under algorithm.mask_truncated_responses
    (:func:`truncation_masked`). Adds the skipped optimiser steps as ``actor/skipped_updates``."""
    batch = truncation_masked(batch, learner.cfg.algorithm.mask_truncated_responses)
    tc, ws = learner.cfg.trainer, learner.dist.world_size
    B = batch.responses.shape[0]
    rows_per_mini = tc.ppo_mini_batch_size // ws
    if B % rows_per_mini:
        raise ValueError(f"this rank has {B} responses, not a multiple of its mini-batch share {rows_per_mini} "
                         f"(trainer.ppo_mini_batch_size={tc.ppo_mini_batch_size} over {ws} processes)")
    gen = torch.Generator().manual_seed(step_seed(tc.seed, step, learner.dist.rank, ws))
    if tc.micro_batch_size and rows_per_mini % tc.micro_batch_size:
        raise ValueError(f"trainer.micro_batch_size={tc.micro_batch_size} must divide this rank's mini-batch share "
                         f"{rows_per_mini} (trainer.ppo_mini_batch_size={tc.ppo_mini_batch_size} over "
                         f"{ws} processes)")
    plan = batching.plan_updates(batch.attention_mask.sum(1).tolist(), rows_per_mini, tc.ppo_epochs,
                                 tc.micro_batch_token_budget, gen, tc.micro_batch_size)
    n_micro = distributed.agree_max(learner.accelerator, [len(m) for m in plan])  # the same micro-batch count everywhere
    acc: dict[str, list] = {}  # the step's metrics as the objective's terms reduce them (algo/step_metrics.py)
    first_kl = [0.0, 0.0]  # KL(ref) token sum and tokens of the step's first mini-batch (before any update)
    grad_norms: list[float] = []
    # per update: whether any response of its mini-batch (on any rank) has a non-zero advantage, i.e. carries signal
    has_signal = distributed.agree_max(learner.accelerator, [
        int(bool((advantages[[i for mb in mini for i in mb]] != 0).any())) for mini in plan])
    skipped = pads = 0
    learner.model.train()
    for mi, (mini, count) in enumerate(zip(plan, n_micro)):
        mini_tokens, mini_resp = mini_batch_denominators(batch.response_mask[[i for mb in mini for i in mb]])
        groups, counts = micro_batch_groups(batch, mini, tc.micro_batch_size)  # the loss's micro-batches
        for k in range(count):
            pad = k >= len(mini)  # zero-weight pass: this rank ran out, its peers did not
            m_metrics, n_tok = micro_step(learner, batch, mini[0][:1] if pad else mini[k], advantages, logp_old,
                                          logp_ref, tis_weights, valid_searches, max(mini_tokens, 1.0),
                                          max(mini_resp, 1.0), last=k == count - 1, weight=0.0 if pad else 1.0,
                                          micro_batches=len(counts) if counts else len(mini),
                                          micro_batch_counts=counts[groups[k]] if counts and not pad else None)
            pads += int(pad)
            if pad:
                continue
            if mi == 0 and "kl_ref" in m_metrics:  # the KL term's token mean, before any update of the step
                first_kl[0] += m_metrics["kl_ref"] * n_tok
                first_kl[1] += n_tok
            step_metrics.add_micro_batch(acc, m_metrics, n_tok)
        gn, ok = learner.optimizer_step()  # and the LR scheduler's, when applied
        grad_norms.append(gn)
        skipped += int(not ok)
    out = update_metrics(step_metrics.reduce_step(acc, len(grad_norms)), grad_norms, first_kl, has_signal)
    out.update({"actor/skipped_updates": float(skipped), "actor/micro_batches": float(sum(n_micro)),
                "actor/padding_micro_batches": float(pads),  # this rank's zero-weight ones (mean over ranks)
                "actor/lr": learner.optimizer.param_groups[0]["lr"]})
    return out


def micro_batch_groups(batch: TrajectoryBatch, passes: list[list[int]],
                       rows_per_micro: int) -> tuple[list[int], list[tuple[float, float]]]:
    """trainer.micro_batch_size > 0: the micro-batch of each forward pass of a mini-batch and each micro-batch's
    (tokens, responses), its normalisation under algorithm.loss_scale=micro-batch-mean; else ([], []): every pass is
    its own micro-batch."""
    if not rows_per_micro:
        return [], []
    groups = batching.micro_batch_of_passes(passes, rows_per_micro)
    rows: dict[int, list[int]] = {}
    for g, p in zip(groups, passes):
        rows.setdefault(g, []).extend(p)
    return groups, [mini_batch_denominators(batch.response_mask[rows[g]]) for g in sorted(rows)]


def micro_step(learner: Learner, batch: TrajectoryBatch, mb: list[int], advantages: torch.Tensor,
               logp_old: torch.Tensor, logp_ref: torch.Tensor | None, tis_weights: torch.Tensor | None,
               valid_searches: float, mini_tokens: float, mini_resp: float, *,
               last: bool, weight: float = 1.0, micro_batches: int = 1,
               micro_batch_counts: tuple[float, float] | None = None) -> tuple[dict[str, float], float]:
    """Forward + backward of one micro-batch (rows ``mb`` of ``batch``) of the objective (algo.objective, scaled by
    algorithm.loss_scale: mini-batch totals, or its micro-batch's mean / ``micro_batches``, the mini-batch's micro-batch
    count; ``micro_batch_counts``: its micro-batch's (tokens, responses) when the rows are one of several passes);
    ``weight`` 0 = a padding micro-batch (same collectives, zero gradient). Returns (the objective's metrics, typed
    with their reductions, and the forward's padding counts; the micro-batch's response tokens)."""
    dev = learner.accelerator.device
    rows = model_rows(learner, learner.model, batch, mb)
    t = rows["responses"].shape[1]
    idx = torch.as_tensor(mb)
    mask = rows["response_mask"].to(dev)
    cut = lambda x: None if x is None else x[idx][:, :t].to(dev)  # noqa: E731  (rows mb, first t columns)
    with learner.no_sync(last):
        logp_new, entropy = rows_logprobs(learner, learner.model, rows, compute_entropy=True)
        loss, m = objective(
            learner.cfg.algorithm, logp_new, cut(logp_old), advantages[idx].to(dev), mask, mini_tokens=mini_tokens,
            mini_responses=mini_resp, logp_ref=cut(logp_ref), entropy=entropy, answer_mask=rows["answer_mask"].to(dev),
            valid_searches_mean=valid_searches, token_weights=cut(tis_weights), micro_batches=micro_batches,
            micro_batch_counts=micro_batch_counts,
        )
        learner.backward(loss * weight if weight != 1.0 else loss, last)
    positions, real = batching.forward_positions(rows)
    return {**m, "actor/forward_positions": step_metrics.Sum(positions),
            "actor/forward_padding": step_metrics.Sum(positions - real)}, float(mask.sum())


def update_metrics(reduced: dict[str, float], grad_norms: list[float], first_kl: list[float],
                   has_signal: list[int] | None = None) -> dict[str, float]:
    """The step's actor/* metrics and those of the objective's terms: ``reduced``, every metric the terms returned,
    reduced over the step's micro-batches as each declared (algo/step_metrics.py), and the per-update gradient
    norms; ``has_signal`` (one flag per update): its mini-batch held a response with a non-zero advantage, which
    ``actor/grad_norm_signal`` (the largest gradient norm of those updates; NaN when none) and
    ``actor/signal_updates`` count (an update of all-zero advantages has only the KL's and LLDS's gradients)."""
    out = dict(reduced)
    positions, padding = out.pop("actor/forward_positions", 0.0), out.pop("actor/forward_padding", 0.0)
    finite = [g for g in grad_norms if math.isfinite(g)]
    out["actor/grad_norm"] = max(finite) if finite else float("nan")
    out["actor/grad_norm_mean"] = sum(finite) / len(finite) if finite else float("nan")
    out["actor/updates"] = float(len(grad_norms))
    if has_signal is not None:
        signal = [g for g, flag in zip(grad_norms, has_signal) if flag and math.isfinite(g)]
        out["actor/grad_norm_signal"] = max(signal) if signal else float("nan")
        out["actor/signal_updates"] = float(sum(has_signal))
    if positions:  # positions of the update's forwards that are padding
        out["actor/padded_token_share"] = padding / positions
    if first_kl[1] > 0:  # 0 at step 0: the reference and the policy are the same weights in the same dtype
        out["actor/kl_ref_first_update"] = first_kl[0] / first_kl[1]
    return out


# --------------------------------------------------------------------------------------------------------------------
# log-probs of the learner: one micro-batch (with grad in the update), a whole batch (no grad), the probe set
# --------------------------------------------------------------------------------------------------------------------


def model_rows(learner: Learner, model: torch.nn.Module, batch: TrajectoryBatch, idx: list[int]) -> dict[str, Any]:
    """Rows ``idx`` of ``batch`` as one forward's inputs: packed without padding (batching.pack_rows) under
    trainer.pack_sequences when ``model`` runs packed forwards, else padded (batching.select_rows)."""
    if learner.cfg.trainer.pack_sequences and policy_logprobs.runs_packed(model):
        return batching.pack_rows(batch, idx, share_prompts=policy_logprobs.shares_prompts(model))
    return batching.select_rows(batch, idx)


def rows_logprobs(learner: Learner, model: torch.nn.Module, rows: dict[str, Any], *,
                  compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs [b, t] (and entropies [b, t]) of the responses of ``rows`` (:func:`model_rows` of b
    trajectories) under ``model``: log_softmax(logits / temperature) over the ids the rollout engine samples from
    (``backend.vocab_limit``), computed from the final hidden states through the LM head chunk by chunk (full logits
    never exist; policy_logprobs). Packed rows: 0 off the response mask."""
    dev = learner.accelerator.device
    temperature = learner.cfg.rollout.temperature
    settings = dict(chunk_size=learner.cfg.trainer.logprob_chunk_size or None,
                    temperature=temperature if temperature > 0 else 1.0, compute_entropy=compute_entropy,
                    vocab_limit=learner.backend.vocab_limit)  # the engine's softmax: the ids it samples from
    if rows.get("cu_seq_lens") is None and rows.get("segments") is None:
        return policy_logprobs.response_logprobs(
            model, rows["input_ids"][:, :-1].to(dev), rows["attention_mask"][:, :-1].to(dev),
            rows["position_ids"][:, :-1].to(dev), rows["responses"].to(dev), rows["p"] - 1, **settings)
    to_dev = lambda x: None if x is None else x.to(dev)  # noqa: E731
    lp, ent = policy_logprobs.packed_response_logprobs(
        model, rows["input_ids"].to(dev), rows["position_ids"].to(dev), to_dev(rows["cu_seq_lens"]),
        rows["logit_index"].to(dev), rows["labels"].to(dev), segments=rows["segments"], **settings)
    b, t = rows["responses"].shape
    out_index = rows["out_index"].to(dev)
    unflatten = lambda x: x.new_zeros(b * t).index_copy(0, out_index, x).view(b, t)  # noqa: E731
    return unflatten(lp), (unflatten(ent) if ent is not None else None)


def batch_logprobs(learner: Learner, model: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """[B, T] token log-probs of a whole batch under ``model`` (micro-batched, no grad, zero off the response mask),
    on CPU. Every rank runs the same number of forwards (the missing ones re-run this rank's shortest row and are
    discarded)."""
    B, T = batch.responses.shape
    out = torch.zeros(B, T)
    lengths = batch.attention_mask.sum(1).tolist()
    budget = learner.cfg.trainer.micro_batch_token_budget
    if learner.cfg.trainer.pack_sequences and policy_logprobs.shares_prompts(model):  # a group's prompt laid out once
        prompts = batch.attention_mask[:, : batch.prompt_length].sum(1).tolist()
        micro = batching.micro_batches_by_prompt(prompts, lengths, batch.group_ids.tolist(), budget)
    else:
        micro = batching.micro_batches_by_tokens(lengths, range(B), budget)
    (n_micro,) = distributed.agree_max(learner.accelerator, [len(micro)])
    # the reference runs under the same autocast as the (prepared) policy
    autocast = learner.accelerator.autocast() if model is learner.ref_model else contextlib.nullcontext()
    with evaluating(model), autocast:
        for k in range(n_micro):
            mb = micro[k] if k < len(micro) else micro[0][:1]
            lp, _ = rows_logprobs(learner, model, model_rows(learner, model, batch, mb), compute_entropy=False)
            if k < len(micro):
                out[torch.as_tensor(mb)] = batching.pad_cols(lp.float().cpu(), T)
    return out * batch.response_mask


def probe_logprobs(learner: Learner, trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """(token log-probs [N, T], response mask [N, T]) of the probe set's N trajectories under the current policy
    (ProbeSet.measure's callback)."""
    batch = to_batch(trajectories, learner.tokenizer.pad_token_id)
    return batch_logprobs(learner, learner.model, batch), batch.response_mask
