"""One training step of the learner, top to bottom as in the diagram of trainer.py's docstring:

    sample -> rollout -> engine.sleep -> advantages -> logp_old / logp_ref -> rollout correction
    -> ppo_epochs x mini-batches x micro-batches of objective + backward, one optimiser step per mini-batch
    -> logp_new -> LLD monitor -> probe set, phase -> weights to the engine -> engine.wake_up

The step composes the pure functions of ``searchr1_lld.algo``; it holds no loss math of its own. What it reads and
advances is its :class:`StepContext`, which the :class:`~searchr1_lld.learner.trainer.Trainer` builds once.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from searchr1_lld.learner import batching, policy_logprobs

from searchr1_lld import distributed
from searchr1_lld.algo import advantages as adv_fns
from searchr1_lld.algo import llds, rollout_correction
from searchr1_lld.algo.objective import ObjectiveSpec, mini_batch_denominators, objective
from searchr1_lld.instruments.monitor import (PHASE_ID, engine_learner_gap, first_action_ids, likelihood_metrics, rollout_metrics,
                                  shared_first_action_fraction)
from searchr1_lld.learner.optim import backward, optimizer_step, sync_context

if TYPE_CHECKING:
    from accelerate import Accelerator

    from searchr1_lld.learner.batching import PromptSampler
    from searchr1_lld.config import AlgorithmConfig, Config, LLDSConfig, RolloutCorrectionConfig
    from searchr1_lld.instruments.monitor import PhaseDetector, ProbeSet
    from searchr1_lld.instruments.phases import PhaseReport
    from searchr1_lld.rollout.backends.base import GenerationBackend
    from searchr1_lld.rollout.types import Trajectory, TrajectoryBatch


@dataclass
class StepContext:
    """What a training step reads and advances; the trainer builds it once and saves / restores its counters."""

    cfg: Config  # trainer.* (batch shape, seed, probe cadence), algorithm.* (the objective), rollout.temperature
    accelerator: Accelerator  # device, rank, collectives, autocast
    model: torch.nn.Module  # the policy as prepared (plain, DDP or DeepSpeed engine); the step updates it
    ref_model: torch.nn.Module | None  # the frozen initial policy of the KL term; None when algorithm.kl_coef == 0
    optimizer: torch.optim.Optimizer  # one step per mini-batch whose gradient is finite on every rank
    scheduler: torch.optim.lr_scheduler.LRScheduler  # one step per applied optimiser step
    backend: GenerationBackend  # the rollout engine: put to sleep for the update, sent the new weights, woken
    rollout: Callable[[list[dict]], list[Trajectory]]  # prompt rows -> rollout.n trajectories each, rewards set
    pad_token_id: int  # pads the trajectories into a batch (rollout.types.to_batch)
    sampler: PromptSampler  # the prompts of each step (all ranks draw the same; each takes its share)
    probe: ProbeSet  # fixed correct trajectories whose likelihood is re-measured every trainer.probe_every steps
    detector: PhaseDetector  # names the run's phase from each step's metrics
    step: int = 0  # steps done (seeds the step's RNG; the checkpoint's step)
    skipped_updates: int = 0  # optimiser steps skipped over the run for a non-finite gradient
    phase_report: PhaseReport | None = None  # the detector's report of the last step

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes


# micro-batch metrics that are token-weighted means over the step (summed as value x tokens, divided at the end)
TOKEN_MEANS = ("actor/entropy", "actor/pg_clip_frac", "actor/approx_kl", "actor/kl_ref", "actor/pg_loss",
               "llds/active_token_frac", "llds/mean_penalty")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(base_seed: int, step: int, rank: int, num_processes: int) -> int:
    """Seed of one (step, rank): distinct per rank and per step, fixed by the run's seed."""
    return base_seed * 1_000_003 + step * max(num_processes, 1) + rank


def objective_spec(alg: AlgorithmConfig) -> ObjectiveSpec:
    """The objective's coefficients and modes from ``AlgorithmConfig``; every entry of it by name for the terms
    registered beyond the built-in ones (each reads the entry named after it: algo/terms.py)."""
    return ObjectiveSpec(
        policy_loss=alg.policy_loss, clip_low=alg.clip_low if alg.clip_low is not None else alg.clip_eps,
        clip_high=alg.clip_high if alg.clip_high is not None else alg.clip_eps, dual_clip=alg.dual_clip,
        agg_mode=alg.loss_agg_mode, kl_coef=alg.kl_coef, kl_type=alg.kl_type, entropy_coef=alg.entropy_coef,
        llds_lam=alg.llds.lam if alg.llds.enabled else 0.0, llds_gate=alg.llds.gate, llds_tau=alg.llds.tau,
        loss_scale=alg.loss_scale, term_settings=dict(vars(alg)),
    )


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


def train_step(ctx: StepContext) -> dict[str, Any]:
    """One GRPO(+LLDS) step: rollout, advantages, ppo_epochs x mini-batches of updates, monitor. Advances
    ``ctx.step`` (and ``ctx.skipped_updates``, ``ctx.phase_report``); returns the step's metrics."""
    from searchr1_lld.rollout.types import to_batch

    cfg, acc, tc = ctx.cfg, ctx.accelerator, ctx.cfg.trainer
    seed_everything(step_seed(tc.seed, ctx.step, ctx.rank, ctx.world_size))
    t0 = time.time()
    # sample this rank's prompts, roll out n responses each (reward = EM), hand the engine's memory to the update
    trajs = ctx.rollout(ctx.sampler.next_batch()[ctx.rank :: ctx.world_size])
    t_rollout = time.time() - t0
    ctx.backend.sleep()  # woken after the weight stream below
    batch = to_batch(trajs, ctx.pad_token_id)
    metrics: dict[str, Any] = {**rollout_metrics(trajs)}

    # advantages; logp_old under the current policy, logp_ref under the frozen initial one; rollout correction
    advantages = adv_fns.grpo_outcome_advantages(batch.rewards, batch.group_ids, eps=cfg.algorithm.adv_eps,
                                                 norm_by_std=cfg.algorithm.norm_adv_by_std)
    logp_old = batch_logprobs(ctx, ctx.model, batch)
    logp_ref = batch_logprobs(ctx, ctx.ref_model, batch) if ctx.ref_model is not None else None
    if batch.has_engine_logprobs:
        metrics["rollout/engine_learner_logp_gap"] = engine_learner_gap(
            batch.engine_logprobs, logp_old, batch.response_mask, torch.ones(len(trajs), dtype=torch.bool))
    tis_weights, tis_stats = correction_weights(cfg.algorithm.rollout_correction, batch, logp_old)
    metrics.update(tis_stats)
    lam_answer = answer_coefficient(cfg.algorithm.llds, batch, acc)
    if cfg.algorithm.llds.enabled and lam_answer is not None:
        metrics["llds/lam_answer_effective"] = min(lam_answer, cfg.algorithm.llds.lam)

    # ppo_epochs x mini-batches x micro-batches of objective + backward; one guarded optimiser step per mini-batch
    metrics.update(update_policy(ctx, batch, advantages, logp_old, logp_ref, tis_weights, lam_answer))

    # the LLD monitor: likelihoods after the step's updates. Its own forward: every forward of the update ran with
    # the weights before some optimiser step (the last mini-batch's included), none with the weights after the last
    t_monitor = time.time()
    logp_new = batch_logprobs(ctx, ctx.model, batch)
    metrics["time/monitor_forward_s"] = time.time() - t_monitor
    metrics.update(likelihood_metrics(logp_old, logp_new, batch.response_mask, batch.rewards))
    metrics["lld/shared_first_action_frac"] = shared_first_action_fraction(
        [first_action_ids(t.response_ids, t.response_mask) for t in trajs], [t.reward for t in trajs],
        [t.group_id for t in trajs])
    metrics["time/rollout_s"] = t_rollout
    metrics["time/step_s"] = time.time() - t0

    # probe set, metrics over ranks, phase
    ctx.probe.offer(trajs)
    if tc.probe_every and (ctx.step + 1) % tc.probe_every == 0:
        metrics.update(ctx.probe.measure(functools.partial(probe_logprobs, ctx)))
    metrics = distributed.reduce_metrics(acc, metrics)
    report = ctx.detector.update(metrics)
    metrics["phase/name"] = report.phase
    metrics["phase/id"] = float(PHASE_ID[report.phase])
    metrics["phase/drawdown_alarm"] = float(report.drawdown_alarm is not None)
    ctx.phase_report = report

    # weights -> rollout engine, which takes its memory back
    distributed.sync_weights_to_engine(acc, ctx.model, ctx.backend)
    ctx.backend.wake_up()
    ctx.step += 1
    return metrics


def correction_weights(rc: RolloutCorrectionConfig, batch: TrajectoryBatch,
                       logp_old: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated-IS weights [B, T] for the step (algorithm.rollout_correction) and their statistics; None if off."""
    if rc.mode == "off":
        return None, {}
    if not batch.has_engine_logprobs:
        raise RuntimeError("algorithm.rollout_correction needs the engine's sampling log-probs, but the rollout "
                           "backend reported none")
    w = rollout_correction.tis_weights(logp_old, batch.engine_logprobs, batch.response_mask, mode=rc.mode, cap=rc.cap)
    return w, rollout_correction.weight_stats(logp_old, batch.engine_logprobs, batch.response_mask, w,
                                              mode=rc.mode, cap=rc.cap)


def answer_coefficient(lc: LLDSConfig, batch: TrajectoryBatch, accelerator: Accelerator) -> float | None:
    """LLDS-MA's answer-span coefficient (None = MA off): fixed, or adaptive from the batch mean of valid searches
    over all ranks."""
    if lc.ma == "fixed":
        return lc.lam_answer
    if lc.ma == "adaptive":
        mean_vs = float(accelerator.reduce(batch.valid_searches.float().mean().to(accelerator.device), "mean"))
        return llds.adaptive_lam_answer(lc.lam_answer, mean_vs, lc.ma_adaptive_rule)
    return None


def update_policy(ctx: StepContext, batch: TrajectoryBatch, advantages: torch.Tensor, logp_old: torch.Tensor,
                  logp_ref: torch.Tensor | None, tis_weights: torch.Tensor | None,
                  lam_answer: float | None) -> dict[str, float]:
    """ppo_epochs x mini-batches of ppo_mini_batch_size responses (this rank: its 1/world_size share) x micro-batches
    (token budget; every rank runs the max count, padding ones weigh 0); one optimiser step per mini-batch.
    ``advantages`` [B]; ``logp_old``, ``logp_ref``, ``tis_weights`` [B, T] on CPU. Adds the skipped optimiser steps
    to ``ctx.skipped_updates``."""
    tc = ctx.cfg.trainer
    B = batch.responses.shape[0]
    rows_per_mini = tc.ppo_mini_batch_size // ctx.world_size
    if B % rows_per_mini:
        raise ValueError(f"this rank has {B} responses, not a multiple of its mini-batch share {rows_per_mini} "
                         f"(trainer.ppo_mini_batch_size={tc.ppo_mini_batch_size} over {ctx.world_size} processes)")
    gen = torch.Generator().manual_seed(step_seed(tc.seed, ctx.step, ctx.rank, ctx.world_size))
    if tc.micro_batch_size and rows_per_mini % tc.micro_batch_size:
        raise ValueError(f"trainer.micro_batch_size={tc.micro_batch_size} must divide this rank's mini-batch share "
                         f"{rows_per_mini} (trainer.ppo_mini_batch_size={tc.ppo_mini_batch_size} over "
                         f"{ctx.world_size} processes)")
    plan = batching.plan_updates(batch.attention_mask.sum(1).tolist(), rows_per_mini, tc.ppo_epochs,
                                 tc.micro_batch_token_budget, gen, tc.micro_batch_size)
    n_micro = distributed.agree_max(ctx.accelerator, [len(m) for m in plan])  # the same micro-batch count everywhere
    spec = objective_spec(ctx.cfg.algorithm)
    sums: dict[str, float] = {}
    first_kl = [0.0, 0.0]  # KL(ref) token sum and tokens of the step's first mini-batch (before any update)
    grad_norms: list[float] = []
    skipped = pads = 0
    ctx.model.train()
    for mi, (mini, count) in enumerate(zip(plan, n_micro)):
        mini_tokens, mini_resp = mini_batch_denominators(batch.response_mask[[i for mb in mini for i in mb]])
        groups, counts = micro_batch_groups(batch, mini, tc.micro_batch_size)  # the loss's micro-batches
        for k in range(count):
            pad = k >= len(mini)  # zero-weight pass: this rank ran out, its peers did not
            m_metrics, n_tok = micro_step(ctx, batch, mini[0][:1] if pad else mini[k], spec, advantages, logp_old,
                                          logp_ref, tis_weights, lam_answer, max(mini_tokens, 1.0),
                                          max(mini_resp, 1.0), last=k == count - 1, weight=0.0 if pad else 1.0,
                                          micro_batches=len(counts) if counts else len(mini),
                                          micro_batch_counts=counts[groups[k]] if counts and not pad else None)
            pads += int(pad)
            if pad:
                continue
            if mi == 0 and "actor/kl_ref" in m_metrics:
                first_kl[0] += m_metrics["actor/kl_ref"]
                first_kl[1] += n_tok
            sums["tokens"] = sums.get("tokens", 0.0) + n_tok
            for key, v in m_metrics.items():
                sums[key] = sums.get(key, 0.0) + v
        gn, ok = optimizer_step(ctx.accelerator, ctx.model, ctx.optimizer, tc.grad_clip)
        grad_norms.append(gn)
        skipped += int(not ok)
        if ok:
            ctx.scheduler.step()  # per applied optimiser step
    ctx.skipped_updates += skipped
    out = update_metrics(sums, grad_norms, first_kl)
    out.update({"actor/skipped_updates": float(skipped), "actor/micro_batches": float(sum(n_micro)),
                "actor/padding_micro_batches": float(pads),  # this rank's zero-weight ones (mean over ranks)
                "actor/skipped_updates_total": float(ctx.skipped_updates),
                "actor/lr": ctx.optimizer.param_groups[0]["lr"]})
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


def micro_step(ctx: StepContext, batch: TrajectoryBatch, mb: list[int], spec: ObjectiveSpec,
               advantages: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor | None,
               tis_weights: torch.Tensor | None, lam_answer: float | None, mini_tokens: float, mini_resp: float, *,
               last: bool, weight: float = 1.0, micro_batches: int = 1,
               micro_batch_counts: tuple[float, float] | None = None) -> tuple[dict[str, float], float]:
    """Forward + backward of one micro-batch (rows ``mb`` of ``batch``) of the objective (algo.objective, scaled by
    algorithm.loss_scale: mini-batch totals, or its micro-batch's mean / ``micro_batches``, the mini-batch's micro-batch
    count; ``micro_batch_counts``: its micro-batch's (tokens, responses) when the rows are one of several passes);
    ``weight`` 0 = a padding micro-batch (same collectives, zero gradient). Returns (metric sums, tokens)."""
    dev = ctx.accelerator.device
    rows = batching.select_rows(batch, mb)
    t = rows["responses"].shape[1]
    idx = torch.as_tensor(mb)
    mask = rows["response_mask"].to(dev)
    cut = lambda x: None if x is None else x[idx][:, :t].to(dev)  # noqa: E731  (rows mb, first t columns)
    with sync_context(ctx.accelerator, ctx.model, last):
        logp_new, entropy = rows_logprobs(ctx, ctx.model, rows, compute_entropy=True)
        loss, m = objective(
            spec, logp_new, cut(logp_old), advantages[idx].to(dev), mask, mini_tokens=mini_tokens,
            mini_responses=mini_resp, logp_ref=cut(logp_ref), entropy=entropy,
            answer_mask=rows["answer_mask"].to(dev) if lam_answer is not None else None, lam_answer=lam_answer,
            token_weights=cut(tis_weights), micro_batches=micro_batches, micro_batch_counts=micro_batch_counts,
        )
        backward(ctx.accelerator, ctx.model, loss * weight if weight != 1.0 else loss, last)
    n_tok = float(mask.sum())
    out = {f"actor/{k}": m[k] * n_tok for k in ("pg_loss", "pg_clip_frac", "approx_kl", "entropy", "kl_ref") if k in m}
    if "llds/loss" in m:
        out["llds/active_token_frac"] = m["llds/active_token_frac"] * n_tok
        out["llds/mean_penalty"] = m["llds/mean_penalty"] * n_tok
        out["llds/loss_sum"] = m["llds/loss"]  # mini-batch normalised: sums to the mini-batch loss
        for key in ("gated_responses", "gated_actions", "total_actions"):
            out[f"llds/{key}"] = m[f"llds/{key}"]
        out["llds/responses"] = float(len(mb))
    return out, n_tok


def update_metrics(sums: dict[str, float], grad_norms: list[float], first_kl: list[float]) -> dict[str, float]:
    """The step's actor/* and llds/* metrics from the micro-batch sums and the per-update gradient norms."""
    out: dict[str, float] = {}
    tok = max(sums.get("tokens", 0.0), 1.0)
    for key in TOKEN_MEANS:
        if key in sums:
            out[key] = sums[key] / tok  # token-weighted mean over all micro-batches of the step
    if "llds/loss_sum" in sums:
        out["llds/loss"] = sums["llds/loss_sum"] / max(len(grad_norms), 1)  # mean LLDS loss per update
    if "llds/gated_responses" in sums:
        out["llds/gated_responses_frac"] = sums["llds/gated_responses"] / max(sums["llds/responses"], 1.0)
        out["llds/gated_actions_frac"] = sums["llds/gated_actions"] / max(sums["llds/total_actions"], 1.0)
    finite = [g for g in grad_norms if math.isfinite(g)]
    out["actor/grad_norm"] = max(finite) if finite else float("nan")
    out["actor/grad_norm_mean"] = sum(finite) / len(finite) if finite else float("nan")
    out["actor/updates"] = float(len(grad_norms))
    if first_kl[1] > 0:  # 0 at step 0: the reference and the policy are the same weights in the same dtype
        out["actor/kl_ref_first_update"] = first_kl[0] / first_kl[1]
    return out


# --------------------------------------------------------------------------------------------------------------------
# log-probs of the learner: one micro-batch (with grad in the update), a whole batch (no grad), the probe set
# --------------------------------------------------------------------------------------------------------------------


def rows_logprobs(ctx: StepContext, model: torch.nn.Module, rows: dict[str, torch.Tensor], *,
                  compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs [b, t] (and entropies [b, t]) of the responses of ``rows`` (batching.select_rows of b
    trajectories) under ``model``: log_softmax(logits / temperature), computed from the final hidden states through
    the LM head chunk by chunk (full logits never exist; policy_logprobs)."""
    dev = ctx.accelerator.device
    temperature = ctx.cfg.rollout.temperature
    return policy_logprobs.response_logprobs(
        model, rows["input_ids"][:, :-1].to(dev), rows["attention_mask"][:, :-1].to(dev),
        rows["position_ids"][:, :-1].to(dev), rows["responses"].to(dev), rows["p"] - 1,
        chunk_size=ctx.cfg.trainer.logprob_chunk_size or None, temperature=temperature if temperature > 0 else 1.0,
        compute_entropy=compute_entropy,
    )


@torch.no_grad()
def batch_logprobs(ctx: StepContext, model: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """[B, T] token log-probs of a whole batch under ``model`` (micro-batched, no grad, zero off the response mask),
    on CPU. Every rank runs the same number of forwards (the missing ones re-run this rank's shortest row and are
    discarded)."""
    was_training = model.training
    model.eval()
    B, T = batch.responses.shape
    out = torch.zeros(B, T)
    lengths = batch.attention_mask.sum(1).tolist()
    micro = batching.micro_batches_by_tokens(lengths, range(B), ctx.cfg.trainer.micro_batch_token_budget)
    (n_micro,) = distributed.agree_max(ctx.accelerator, [len(micro)])
    # the reference runs under the same autocast as the (prepared) policy
    autocast = ctx.accelerator.autocast() if model is ctx.ref_model else contextlib.nullcontext()
    with autocast:
        for k in range(n_micro):
            mb = micro[k] if k < len(micro) else micro[0][:1]
            lp, _ = rows_logprobs(ctx, model, batching.select_rows(batch, mb), compute_entropy=False)
            if k < len(micro):
                out[torch.as_tensor(mb)] = batching.pad_cols(lp.float().cpu(), T)
    model.train(was_training)
    return out * batch.response_mask


def probe_logprobs(ctx: StepContext, trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """(token log-probs [N, T], response mask [N, T]) of the probe set's N trajectories under the current policy
    (ProbeSet.measure's callback)."""
    from searchr1_lld.rollout.types import to_batch

    batch = to_batch(trajectories, ctx.pad_token_id)
    return batch_logprobs(ctx, ctx.model, batch), batch.response_mask
