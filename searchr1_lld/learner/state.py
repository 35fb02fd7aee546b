"""The learner's state, owned in one place: the policy as prepared, its optimiser and LR schedule, the frozen
reference, the tokenizer, the rollout engine and the retriever, with the distributed facts resolved once.

    learner = Learner.build(cfg, total_updates)      # factories.py, one factory per thing
    trajectories = learner.rollout(rows)               # policy in eval mode, no grad; reward = EM
    learner.backward(loss, last=True); learner.optimizer_step()
    learner.sync_engine()                              # the learner's weights -> the rollout engine

The training step (:mod:`searchr1_lld.learner.step`) receives a :class:`Learner` and the step's prompt rows and
returns what it produced; the loop (:mod:`searchr1_lld.learner.trainer`) keeps the counters and the run directory.
Code that swaps the engine sets ``learner.backend``, the one place it lives.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from searchr1_lld import evaluation
from searchr1_lld.config import Config, RolloutConfig
from searchr1_lld.distributed import DistributedFacts
from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.learner import factories, optim
from searchr1_lld.learner.step_size import StepSizeController
from searchr1_lld.learner.engines import TrainingEngine, training_engine
from searchr1_lld.placement import learner_engine_config
from searchr1_lld.preflight.startup import check_at_start
from searchr1_lld.protocols import Accelerator, Retriever, Tokenizer
from searchr1_lld.rollout.agent_loop import run_agent_loop
from searchr1_lld.rollout.backends import backend_kind
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.rollout.types import Trajectory


@dataclass
class Learner:
    """Everything a training step updates or generates with. Build with :meth:`build`."""

    cfg: Config  # the validated run config
    accelerator: Accelerator  # device, collectives, autocast
    dist: DistributedFacts  # world size, rank, main process: resolved once
    engine: TrainingEngine  # how the policy is distributed and stepped (plain / DDP, DeepSpeed ZeRO-n): learner/engines
    model: torch.nn.Module  # the policy as prepared (plain, DDP or DeepSpeed engine); fp32 master weights
    optimizer: torch.optim.Optimizer  # AdamW; one step per mini-batch whose gradient is finite on every rank
    scheduler: torch.optim.lr_scheduler.LRScheduler  # one step per applied optimiser step
    ref_model: torch.nn.Module | None  # the frozen initial policy of the KL term; None when algorithm.kl_coef == 0
    tokenizer: Tokenizer  # with a pad token
    backend: GenerationBackend  # the rollout engine: put to sleep for the update, sent the new weights, woken
    retriever: Retriever  # the search tool of the rollout
    step_size: StepSizeController  # the trust-region multiplier of the learning rate (trainer.step_size; 1 when off)

    @classmethod
    def build(cls, cfg: Config, total_updates: int, *, retriever: Retriever | None = None,
              preflight: bool = True) -> Learner:
        """Policy, reference, optimiser (warm-up over ``total_updates`` optimiser steps), engine and retriever of
        ``cfg``; the engine receives the learner's weights when it holds a copy of its own. ``preflight``: on a GPU,
        the start-up preflight (preflight/startup.py) runs first, before the policy loads and any engine exists."""
        own = learner_engine_config(cfg)
        kind = backend_kind(own)  # the engine's kind, read once
        accelerator = factories.make_accelerator(cfg)
        dist = DistributedFacts.of(accelerator)
        engine = training_engine(accelerator)  # the training engine's kind, resolved once
        if preflight:
            check_at_start(cfg, accelerator, dist)
        model, tokenizer = factories.load_policy_and_tokenizer(cfg)
        ref = factories.make_reference(cfg, model, engine)
        step_size = StepSizeController.of(cfg.trainer.step_size, cfg.trainer.total_steps)
        optimizer, scheduler = optim.make_optimizer(model, cfg.trainer, total_updates, step_size)
        engine.configure(cfg.trainer)
        model, optimizer = accelerator.prepare(model, optimizer)
        module = accelerator.unwrap_model(model)
        dtype = next(module.parameters()).dtype
        ref_model = engine.place_reference(ref, dtype) if ref is not None else None
        if retriever is None:
            retriever = factories.make_retriever(cfg, engine)
        engine_module = factories.engine_copy(cfg, kind, module, accelerator, engine)
        backend = kind.for_learner(dataclasses.replace(cfg, rollout=own), module, tokenizer, cfg.model.path,
                                   engine_module)
        learner = cls(cfg=cfg, accelerator=accelerator, dist=dist, engine=engine, model=model, optimizer=optimizer,
                      scheduler=scheduler, ref_model=ref_model, tokenizer=tokenizer, backend=backend,
                      retriever=retriever, step_size=step_size)
        if engine_module is not None:  # its own weights: the learner's, through the stream every step uses
            learner.sync_engine()
        return learner

    @property
    def rollout_cfg(self) -> RolloutConfig:
        """The rollout settings of :attr:`backend` (placement.learner_engine_config: the run's, or with a rollout
        worker beside the update the transformers backend's)."""
        return learner_engine_config(self.cfg)

    @property
    def module(self) -> torch.nn.Module:
        """The policy without its DDP / DeepSpeed wrapper."""
        return self.accelerator.unwrap_model(self.model)

    # ---------------------------------------------------------------- generation
    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """The policy in eval mode and no grad while the engine generates (restored afterwards)."""
        with evaluating(self.module):
            yield

    def rollout(self, rows: list[dict[str, Any]], *, greedy: bool = False, n: int | None = None,
                rollout_cfg: RolloutConfig | None = None, seed: int | None = None) -> list[Trajectory]:
        """``n`` (default rollout.n) trajectories per prompt row, rewards set (EM); ``seed``: each request's sampling
        seed derives from it (run_agent_loop)."""
        cfg = self.cfg
        with self.generating():
            return run_agent_loop(
                rows, backend=self.backend, tokenizer=self.tokenizer, retriever=self.retriever,
                cfg=rollout_cfg or self.rollout_cfg, n=cfg.rollout.n if n is None else n, greedy=greedy,
                template=cfg.data.prompt_template, chat_template=cfg.data.chat_template, progress=False, seed=seed,
            )

    def evaluate(self, rows: list[dict[str, Any]], desc: str = "eval", progress: bool = False) -> dict[str, float]:
        """Greedy EM on ``rows`` through :func:`searchr1_lld.evaluation.evaluate` (eval.max_turns, eval.topk; in
        memory), rows sharded over processes and the EM summed over them: ``{"em", "n"}`` ({} for no rows).
        ``progress``: a bar of the questions, on the main process (labelled ``eval <desc>``)."""
        if not rows:
            return {}
        cfg, e, ws = self.cfg, self.cfg.eval, self.dist.world_size
        with self.generating():
            res = evaluation.evaluate(
                {desc: rows}, backend=self.backend, tokenizer=self.tokenizer, retriever=self.retriever,
                rollout_cfg=evaluation.eval_rollout_config(self.rollout_cfg, max_turns=e.max_turns, topk=e.topk),
                batch_size=e.batch_size, template=cfg.data.prompt_template, chat_template=cfg.data.chat_template,
                progress=progress and self.dist.is_main, shard=(self.dist.rank, ws) if ws > 1 else None)
        mine = res["datasets"].get(desc, {"em": 0.0, "n": 0})  # a rank may get no rows
        totals = torch.tensor([mine["em"] * mine["n"], float(mine["n"])], device=self.accelerator.device)
        if ws > 1:
            totals = self.accelerator.reduce(totals, "sum")
        return {"em": float(totals[0] / totals[1].clamp(min=1)), "n": float(totals[1])}

    # ---------------------------------------------------------------- the update
    def no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """No gradient all-reduce on non-final micro-batches of a mini-batch (the training engine's rule)."""
        return self.engine.no_sync(self.model, last)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch; ``last``: the mini-batch's accumulation boundary."""
        self.engine.backward(self.model, loss, last)

    def optimizer_step(self) -> tuple[float, bool]:
        """One guarded optimiser step on the mini-batch gradient (skipped on every rank when the norm is not finite)
        and, when applied, one LR-scheduler step. Returns (gradient norm before clipping, applied)."""
        norm, applied = self.engine.optimizer_step(self.model, self.optimizer, self.cfg.trainer.grad_clip)
        if applied:
            self.scheduler.step()
        return norm, applied

    def adapt_step_size(self, step: int, step_kl: float) -> dict[str, float]:
        """Step ``step`` (1-based) measured the step size ``step_kl`` (the same on every rank): the trust-region
        controller sets the next step's learning-rate multiplier, in force from the next update on. Returns the
        controller's metrics of the step ({} when trainer.step_size is off)."""
        out = self.step_size.observe(step, step_kl)
        if out:
            optim.refresh_lr(self.scheduler)
        return out

    def restore_step_size(self, state: dict[str, Any]) -> None:
        """The controller's state of a checkpoint, the learning rate in force set from it."""
        self.step_size.load_state_dict(state)
        optim.refresh_lr(self.scheduler)

    def sync_engine(self) -> None:
        """The learner's weights -> the rollout engine (as the training engine hands them: ZeRO-3 gathers module by
        module)."""
        self.backend.load_weights(self.engine.named_weights(self.module))

    def close(self) -> None:
        """Ends the run on every rank together: waits for the others, releases what the training engine holds (the
        DeepSpeed engines' hooks and in-flight ZeRO-3 gathers), then the process group (torch asks for it before exit;
        a rank that exits holding it can abort in its communication threads' teardown)."""
        self.accelerator.wait_for_everyone()
        self.engine.close(self.model, self.ref_model)
        self.accelerator.end_training()
