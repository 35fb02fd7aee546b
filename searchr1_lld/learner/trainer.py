"""The learner: GRPO + LLDS on accelerate (one CPU process, one GPU, multi-GPU DDP, DeepSpeed ZeRO-2/3).

One training step (:func:`searchr1_lld.learner.step.train_step`)::

    sample train_batch_size prompts (this rank's share)                       batching.PromptSampler
    rollout: n responses per prompt, policy in eval mode, no grad             run_agent_loop  (reward = EM)
    engine.sleep(): the rollout engine hands its GPU memory to the update     rollout/backends (contract: base.py)
    advantages A_i (GRPO, per group)                                          algo.advantages
    logp_old under the current policy, logp_ref under the frozen initial one  step.batch_logprobs -> algo.logprobs
    rollout-correction weights (truncated IS, engine vs learner), if enabled  algo.rollout_correction
    for epoch in ppo_epochs, for mini-batch of ppo_mini_batch_size *responses* (over all ranks; groups may straddle):
        for micro-batch (token budget, sorted by length; every rank runs the max count, padding ones weigh 0):
            loss = objective(pg + kl_coef * KL(ref) - entropy_coef * H + LLDS)  algo.objective
            (every term over the *mini-batch* totals -> accumulation == the one-shot mini-batch loss; or, with
            algorithm.loss_scale=micro-batch-mean, each micro-batch's own mean / number of micro-batches)
            backward (DeepSpeed: engine.set_gradient_accumulation_boundary(last) + engine.backward)  optim.backward
        global grad norm (before clipping), checked on all ranks *before* the step -> non-finite on any rank: skip
        on all ranks and count; else clip -> AdamW step -> LR scheduler step (warm-up ratio of all optimiser steps)
                                                                                optim.optimizer_step
    logp_new of the step's batch after the updates (no grad) -> LLD monitor   monitor
    weights -> rollout engine: engine.load_weights(stream) (ZeRO-3: gathered module by module), engine.wake_up()
                                                                                distributed.sync_weights_to_engine

Where the rest lives: set-up (accelerator, policy, reference, engine, retriever, rows) in factories.py, batching in
batching.py, the run directory and resume safety in resume.py, checkpoint files in checkpoint.py. The trainer and the
step compose the pure functions of ``searchr1_lld.algo``; they hold no loss math of their own. Batch semantics and the
multi-rank rules: docs/batch_semantics.md.

Determinism: every step re-seeds python / numpy / torch from (seed, step, rank), so a run resumed from a checkpoint
reproduces the same next step as an uninterrupted run (RNG states are also saved in the checkpoint).

Python API: :func:`train` ``(cfg) -> RunResult`` (run dir, final metrics, before/after EM).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from searchr1_lld.bookkeeping import checkpoint as ckpt
from searchr1_lld.bookkeeping.best_checkpoint import BestCheckpoint, load_best, write_best
from searchr1_lld import distributed, evaluation
from searchr1_lld.learner import factories, optim, step
from searchr1_lld.bookkeeping import resume
from searchr1_lld.learner.batching import PromptSampler
from searchr1_lld.config import Config, RolloutConfig
from searchr1_lld.instruments.monitor import PhaseDetector, ProbeSet
from searchr1_lld.bookkeeping.tracking import Tracker


@dataclass
class RunResult:
    """What :func:`train` returns."""

    run_dir: Path
    steps: int
    final_metrics: dict[str, Any]
    em_before: float | None
    em_after: float | None
    skipped_steps: int = 0
    eval_table: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """GRPO + LLDS learner. Build with a validated Config; ``run()`` trains ``trainer.total_steps`` steps."""

    def __init__(self, cfg: Config, *, run_dir: str | Path | None = None, retriever: Any = None):
        self.cfg = cfg
        tc = cfg.trainer
        self.accelerator = acc = factories.make_accelerator(cfg)
        self.rank, self.world_size = acc.process_index, acc.num_processes
        cfg.validate()
        if tc.train_batch_size % self.world_size or tc.ppo_mini_batch_size % self.world_size:
            raise ValueError(
                f"trainer.train_batch_size ({tc.train_batch_size}) and trainer.ppo_mini_batch_size "
                f"({tc.ppo_mini_batch_size}) must be divisible by the number of processes ({self.world_size})"
            )
        # batch semantics (docs/batch_semantics.md): ppo_mini_batch_size counts responses over all processes
        self.responses_per_step = tc.train_batch_size * cfg.rollout.n
        self.updates_per_step = tc.ppo_epochs * (self.responses_per_step // tc.ppo_mini_batch_size)
        self.total_updates = tc.total_steps * self.updates_per_step
        self.inputs = resume.inputs_fingerprint(cfg)
        self.run_dir = Path(run_dir) if run_dir else resume.run_dir_of(cfg, self.inputs)
        step.seed_everything(tc.seed)
        model, self.tokenizer = factories.load_policy_and_tokenizer(cfg)
        ref = factories.make_reference(cfg, model, acc)
        optimizer, self.scheduler = optim.make_optimizer(model, tc, self.total_updates)  # scheduler: stepped by us
        factories.configure_deepspeed(acc, tc)
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.policy_dtype = next(acc.unwrap_model(self.model).parameters()).dtype
        self.ref_model = factories.place_reference(ref, acc, self.policy_dtype) if ref is not None else None
        self.retriever = retriever if retriever is not None else factories.make_retriever(cfg, acc)
        learner = acc.unwrap_model(self.model)
        engine_copy = factories.engine_copy(cfg, learner, acc)
        self.backend = factories.make_rollout_backend(cfg, learner, self.tokenizer, cfg.model.path,
                                                      engine_module=engine_copy)
        if engine_copy is not None:  # its own weights: the learner's, through the stream every step uses
            distributed.sync_weights_to_engine(acc, self.model, self.backend)
        self.train_rows = factories.load_train_rows(cfg)
        factories.check_prompt_lengths(self.train_rows, self.tokenizer, cfg)
        self.sampler = PromptSampler(self.train_rows, tc.train_batch_size, tc.seed, cfg.data.shuffle)
        self.detector = PhaseDetector()
        self.probe = ProbeSet(tc.probe_size)
        self.history: list[dict[str, Any]] = []
        self.best = BestCheckpoint(tc.keep_best, tc.keep_best_mode) if tc.keep_best else None
        self.llds_warning = step.llds_noop_warning(cfg, self.updates_per_step)
        if self.llds_warning and acc.is_main_process:
            warnings.warn(self.llds_warning)
        self.step_context = step.StepContext(
            cfg=cfg, accelerator=acc, model=self.model, ref_model=self.ref_model, optimizer=self.optimizer,
            scheduler=self.scheduler, backend=self.backend, rollout=self.rollout,
            pad_token_id=self.tokenizer.pad_token_id, sampler=self.sampler, probe=self.probe, detector=self.detector)

    # the counters live in the step context: the step advances them, save / maybe_resume read and restore them
    @property
    def step(self) -> int:
        """Training steps done."""
        return self.step_context.step

    @step.setter
    def step(self, value: int) -> None:
        self.step_context.step = value

    @property
    def skipped_steps(self) -> int:
        """Optimiser steps skipped over the run for a non-finite gradient."""
        return self.step_context.skipped_updates

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.step_context.skipped_updates = value

    # ---------------------------------------------------------------- rollout and the step
    def rollout(self, rows: list[dict], *, greedy: bool = False, n: int | None = None,
                rollout_cfg: RolloutConfig | None = None) -> list[Any]:
        from searchr1_lld.rollout.agent_loop import run_agent_loop

        with self._generating():
            return run_agent_loop(
                rows, backend=self.backend, tokenizer=self.tokenizer, retriever=self.retriever,
                cfg=rollout_cfg or self.cfg.rollout, n=self.cfg.rollout.n if n is None else n, greedy=greedy,
                template=self.cfg.data.prompt_template, chat_template=self.cfg.data.chat_template, progress=False,
            )

    @contextlib.contextmanager
    def _generating(self):
        """The policy in eval mode and no grad while the engine generates (restored afterwards)."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            unwrapped.train(was_training)

    def train_step(self) -> dict[str, Any]:
        """One GRPO(+LLDS) step (:func:`searchr1_lld.learner.step.train_step` on the step context); returns its metrics."""
        return step.train_step(self.step_context)

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, rows: list[dict], desc: str = "eval") -> dict[str, float]:
        """Greedy EM on ``rows`` through :func:`searchr1_lld.evaluation.evaluate` (eval.max_turns, eval.topk; in
        memory), rows sharded over processes and the EM summed over them."""
        if not rows:
            return {}
        e = self.cfg.eval
        with self._generating():
            res = evaluation.evaluate(
                {desc: rows}, backend=self.backend, tokenizer=self.tokenizer, retriever=self.retriever,
                rollout_cfg=evaluation.eval_rollout_config(self.cfg.rollout, max_turns=e.max_turns, topk=e.topk),
                batch_size=e.batch_size, template=self.cfg.data.prompt_template,
                chat_template=self.cfg.data.chat_template, progress=False,
                shard=(self.rank, self.world_size) if self.world_size > 1 else None)
        mine = res["datasets"].get(desc, {"em": 0.0, "n": 0})  # a rank may get no rows
        totals = torch.tensor([mine["em"] * mine["n"], float(mine["n"])], device=self.accelerator.device)
        if self.world_size > 1:
            totals = self.accelerator.reduce(totals, "sum")
        return {"em": float(totals[0] / totals[1].clamp(min=1)), "n": float(totals[1])}

    def evaluate_benchmarks(self, rows_by_dataset: dict[str, list[dict]]) -> dict[str, float]:
        """eval/<dataset>/em for each benchmark and eval/avg_em (mean over datasets), greedy, eval.max_turns/topk."""
        out = {f"eval/{name}/em": self.evaluate(rows, desc=name)["em"] for name, rows in rows_by_dataset.items()}
        out["eval/avg_em"] = sum(out.values()) / max(len(out), 1)
        return out

    # ---------------------------------------------------------------- checkpoints
    def save(self, best_value: float | None = None) -> Path:
        """Checkpoint this step (pruned to the last trainer.keep_last_k, the best one exempt). ``best_value``: this
        step is the new best of trainer.keep_best, recorded in RUN/best_checkpoint.json once the checkpoint is
        complete; the earlier best is then pruned unless it is among the last k."""
        keep = set() if self.best is None else self.best.kept_steps()
        if best_value is not None:
            keep.add(self.step)
        state = {
            "data": self.sampler.state(),
            "skipped_steps": self.skipped_steps,
            "history": self.detector.history,
            "probe": [dataclasses.asdict(t) for t in self.probe.trajectories],
        }
        path = ckpt.save_checkpoint(
            self.run_dir, self.step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trainer_state=state, accelerator=self.accelerator, keep_last_k=self.cfg.trainer.keep_last_k,
            tokenizer=self.tokenizer, keep_steps=keep,
        )
        if best_value is not None and self.best is not None:
            self.best.record(self.step, best_value, path)
            if self.accelerator.is_main_process:
                write_best(self.run_dir, self.best)
                ckpt.prune_checkpoints(self.run_dir, self.cfg.trainer.keep_last_k, self.best.kept_steps())
        return path

    def maybe_resume(self) -> Path | None:
        path = ckpt.resolve_resume(self.cfg.trainer.resume, self.run_dir)
        if path is None:
            return None
        from searchr1_lld.rollout.types import Trajectory

        state = ckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                     accelerator=self.accelerator)
        self.step = int(state["step"])
        self.sampler.load_state(state["data"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.detector.history = list(state.get("history", []))
        self.probe.trajectories = [Trajectory(**{**t, "action_spans": [tuple(s) for s in t["action_spans"]]})
                                   for t in state.get("probe", [])]
        distributed.sync_weights_to_engine(self.accelerator, self.model, self.backend)
        return path

    # ---------------------------------------------------------------- the loop
    def run(self, *, evaluate: bool = True, allow_changes: Sequence[str] = ()) -> RunResult:
        """Train to ``trainer.total_steps`` (resuming per ``trainer.resume``). ``evaluate``: greedy test EM before and
        after training (eval.md); the evaluations every ``trainer.eval_every`` steps (``eval/val_em`` on
        ``data.val_files``, or ``eval/em`` on the test rows when there are none; the benchmarks' ``eval/<name>/em``;
        also at the last step) follow the config alone. Greedy decoding draws no random numbers, so
        they leave the training itself unchanged. ``allow_changes``: config keys that may differ from the resumed
        run's saved config (see :data:`resume.RESUME_SAFE_KEYS`); any other is refused."""
        cfg, tc, main = self.cfg, self.cfg.trainer, self.accelerator.is_main_process
        resume.check_run_dir_shared(self.accelerator, self.run_dir)  # node-local run dirs: refused, one line
        notes = resume.settle_run_dir(cfg, self.run_dir, main, allow_changes, self.inputs)
        resumed = self.maybe_resume()
        if self.best is not None:
            self.best, best_note = load_best(self.run_dir, tc.keep_best, tc.keep_best_mode, self.step)
            notes = notes + ([best_note] if best_note else [])
        tracker = Tracker(self.run_dir, cfg.logging, cfg.to_dict(), total_steps=tc.total_steps,
                          start_step=self.step, enabled=main)
        for note in notes + ([f"resumed from {resumed} at step {self.step}"] if resumed is not None else []) + (
                [f"WARNING: {self.llds_warning}"] if self.llds_warning else []):
            tracker.write(note)
        test_rows = factories.load_test_rows(cfg)
        bench_rows = evaluation.benchmark_rows(cfg) if tc.eval_every else {}
        limit = tc.eval_limit or cfg.eval.limit  # as the benchmarks (evaluation.benchmark_rows)
        test_rows = test_rows[:limit] if limit else test_rows
        val_rows = factories.load_val_rows(cfg)
        val_rows = val_rows[:limit] if limit else val_rows
        # the curve during training: the validation rows when there are any (settings are chosen on them), else test
        curve_rows, curve_key = (val_rows, "eval/val_em") if val_rows else (test_rows, "eval/em")
        em_before = em_after = None
        if evaluate and test_rows:
            em_before = self._em_before(test_rows)
            tracker.write(f"test EM before training: {em_before:.4f} ({len(test_rows)} questions)")
        last_metrics: dict[str, Any] = {}
        last_phase = "healthy"
        last_drawdown: str | None = None
        while self.step < tc.total_steps:
            metrics = self.train_step()
            if tc.eval_every and curve_rows and (self.step % tc.eval_every == 0 or self.step == tc.total_steps):
                metrics[curve_key] = self.evaluate(curve_rows)["em"]
            if bench_rows and (self.step % tc.eval_every == 0 or self.step == tc.total_steps):
                metrics.update(self.evaluate_benchmarks(bench_rows))
            tracker.log(self.step, metrics)
            self.history.append({"step": self.step, **metrics})
            last_metrics = metrics
            report = self.step_context.phase_report
            if report.phase != last_phase:
                tracker.write(f"step {self.step}: phase {last_phase} -> {report.phase}: {'; '.join(report.reasons)}")
                last_phase = report.phase
            if report.warning:
                tracker.write(f"step {self.step}: {report.warning}")
            if report.drawdown_alarm and not last_drawdown:
                tracker.write(f"step {self.step}: {report.drawdown_alarm}")
            last_drawdown = report.drawdown_alarm
            new_best = self.best is not None and distributed.any_rank(
                self.accelerator, self.best.improves(metrics.get(self.best.metric)))
            if new_best:
                self.save(best_value=float(metrics[self.best.metric]))
            elif tc.save_every and self.step % tc.save_every == 0 and self.step < tc.total_steps:
                self.save()
        latest = ckpt.latest_checkpoint(self.run_dir)
        if (tc.save_every or tc.resume != "never") and (not latest or latest.name != f"step_{self.step:06d}"):
            self.save()
        table = ""
        if evaluate and test_rows:
            # the last step's in-loop evaluation already scored this policy
            em_after = last_metrics["eval/em"] if "eval/em" in last_metrics else self.evaluate(test_rows)["em"]
            table = eval_table(em_before, em_after, len(test_rows))
            if main:
                (self.run_dir / "eval.md").write_text(table + "\n")
                (self.run_dir / "eval.json").write_text(json.dumps({"em_before": em_before, "em_after": em_after,
                                                                    "n": len(test_rows)}))
            tracker.write(table)
        if self.best is not None:
            tracker.write(f"best checkpoint by {self.best.mode} {self.best.metric}: step {self.best.step} "
                          f"({self.best.value:.4f}) at {self.best.path}" if self.best.step is not None else
                          f"WARNING: trainer.keep_best={self.best.metric} was never logged: no best checkpoint kept")
        if main and self.skipped_steps:
            tracker.write(f"skipped {self.skipped_steps} updates with non-finite gradients")
        tracker.close()
        return RunResult(run_dir=self.run_dir, steps=self.step, final_metrics=last_metrics, em_before=em_before,
                         em_after=em_after, skipped_steps=self.skipped_steps, eval_table=table, history=self.history)

    def _em_before(self, test_rows: list[dict]) -> float:
        """Test EM of the initial policy: measured once per run directory (eval_before.json), reused on resume."""
        path = self.run_dir / "eval_before.json"
        if path.is_file():
            return json.loads(path.read_text())["em"]
        em = self.evaluate(test_rows)["em"]
        if self.accelerator.is_main_process:
            path.write_text(json.dumps({"em": em, "n": len(test_rows)}))
        return em


def eval_table(em_before: float | None, em_after: float | None, n: int) -> str:
    """Markdown before/after EM table."""
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    delta = "-" if em_before is None or em_after is None else f"{em_after - em_before:+.4f}"
    return "\n".join([
        f"| test EM (n={n}) | before | after | change |",
        "| --- | --- | --- | --- |",
        f"| data.test_files | {fmt(em_before)} | {fmt(em_after)} | {delta} |",
    ])


def train(cfg: Config, *, run_dir: str | Path | None = None, retriever: Any = None, evaluate: bool = True,
          allow_changes: Sequence[str] = ()) -> RunResult:
    """Train with ``cfg`` (validated Config) and return a :class:`RunResult`. The lab and the demo call this."""
    cfg.validate()
    trainer = Trainer(cfg, run_dir=run_dir, retriever=retriever)
    return trainer.run(evaluate=evaluate, allow_changes=allow_changes)
