"""The learner: GRPO + LLDS on accelerate (one CPU process, one GPU, multi-GPU DDP, DeepSpeed ZeRO-2/3).

One training step (:func:`searchr1_lld.learner.step.train_step`)::

    sample train_batch_size prompts (this rank's share)                       batching.PromptSampler
    rollout: n responses per prompt, policy in eval mode, no grad             run_agent_loop  (reward = EM)
    (dynamic sampling: more rounds of prompts until the batch is full; remax: a greedy response per prompt)
                                                                                sampling.py
    engine.sleep(): the rollout engine hands its GPU memory to the update     rollout/backends (contract: base.py)
    advantages A_i (GRPO, per group)                                          algo.advantages
    logp_old under the current policy, logp_ref under the frozen initial one  step.batch_logprobs -> algo.logprobs
    rollout-correction weights (truncated IS, engine vs learner), if enabled  algo.rollout_correction
    for epoch in ppo_epochs, for mini-batch of ppo_mini_batch_size *responses* (over all ranks; groups may straddle):
        for micro-batch (token budget, sorted by length; every rank runs the max count, padding ones weigh 0):
            loss = objective(pg + kl_coef * KL(ref) - entropy_coef * H + LLDS)  algo.objective
            (every term over the *mini-batch* totals -> accumulation == the one-shot mini-batch loss; or, with
            algorithm.loss_scale=micro-batch-mean, each micro-batch's own mean / number of micro-batches)
            backward (DeepSpeed: set_gradient_accumulation_boundary(last) + backward)   learner/engines: backward
        global grad norm (before clipping), checked on all ranks *before* the step -> non-finite on any rank: skip
        on all ranks and count; else clip -> AdamW step -> LR scheduler step (warm-up ratio of all optimiser steps)
                                                                                learner/engines: optimizer_step
    logp_new of the step's batch after the updates (no grad) -> LLD monitor   monitor
    weights -> rollout engine: engine.load_weights(stream) (ZeRO-3: gathered module by module), engine.wake_up()
                                                                                learner/engines: named_weights

Where the rest lives: the learner's state (policy, optimiser, reference, engines, retriever) in state.py, built by
the factories of factories.py; the training engine (plain / DDP, DeepSpeed ZeRO-n: backward, the optimiser step, the
weights handed to the rollout engine, the model's part of a checkpoint) in learner/engines/; batching in batching.py;
the run directory and resume safety, checkpoint files and the best checkpoint in searchr1_lld/bookkeeping/; the LLD
monitor and phase detector in searchr1_lld/instruments/; the rollouts beside the update (trainer.staleness >= 1: a
rollout worker, the staleness bound, the weights published after every update) in learner/pipeline/, not built at
k = 0 (docs/staleness.md). This module is the loop: it keeps the counters, evaluates on schedule, logs and saves.
The step composes the pure functions of ``searchr1_lld.algo``; neither holds loss math of its own. Batch semantics
and the multi-rank rules: docs/batch_semantics.md.

Determinism: every step re-seeds python / numpy / torch from (seed, step, rank), and every sampled rollout request
carries a seed derived from that step seed, its trajectory and its turn (rollout/turn_rules.request_seed; the vLLM
engine samples by it, the HF engine, driven turn by turn in a fixed order, from the re-seeded generator), so a run
resumed from a checkpoint samples its next step as the uninterrupted run did, whatever order the continuous
scheduler adds requests in, wherever the engine computes the same logits for the same request: on one CPU
(tests/test_vllm_engine.py, tests/test_continuous_scheduler.py). A GPU engine batches requests differently from run
to run, and bf16 logits then differ in their last bits, which can change a sample where two tokens nearly tie; from
there the two runs' trajectories differ, drawn from the same distribution (RNG states are also saved in the
checkpoint).

Python API: :func:`train` ``(cfg) -> RunResult`` (run dir, final metrics, before/after EM).
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld import evaluation
from searchr1_lld.bookkeeping import checkpoint as ckpt
from searchr1_lld.bookkeeping import resume
from searchr1_lld.bookkeeping.best_checkpoint import BestCheckpoint, load_best, write_best
from searchr1_lld.bookkeeping.tracking import Tracker
from searchr1_lld.config import Config, ConfigError
from searchr1_lld.data import splits
from searchr1_lld.distributed import any_rank
from searchr1_lld.instruments.monitor import PhaseDetector, ProbeSet
from searchr1_lld.instruments.phases import PhaseReport
from searchr1_lld.learner import factories, pipeline, sampling, step
from searchr1_lld.learner.batching import PromptSampler
from searchr1_lld.learner.pipeline.rollouts import RolloutPipeline
from searchr1_lld.learner.state import Learner
from searchr1_lld.protocols import Retriever
from searchr1_lld.rollout.types import Trajectory


@dataclass
class RunResult:
    """What :func:`train` returns."""

    run_dir: Path
    steps: int
    final_metrics: dict[str, Any]
    em_before: float | None
    em_after: float | None
    skipped_updates: int = 0
    eval_table: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    train_s: float = 0.0  # seconds of training over the whole run (Trainer.train_s)


@dataclass
class EvalRows:
    """The rows a run evaluates on (eval limits applied)."""

    test: list[dict]  # data.test_files: before and after training
    curve: list[dict]  # every trainer.eval_every steps: the validation rows when there are any, else test
    curve_key: str  # "eval/val_em", "eval/val_sub_em" (trainer.val_subsample) or "eval/em"
    full_val: list[dict]  # with trainer.val_subsample: the whole validation split, before the first step and at the last
    benchmarks: dict[str, list[dict]]  # eval/<name>/em at the last step (trainer.select_on_test: every eval)


class Trainer:
    """The GRPO + LLDS training loop. Build with a validated Config; ``run()`` trains ``trainer.total_steps`` steps.
    The learner's state is ``self.learner`` (:class:`~searchr1_lld.learner.state.Learner`); the loop keeps the
    counters (``step``, ``skipped_updates``), the prompt sampler, the LLD instruments and the run directory."""

    def __init__(self, cfg: Config, *, run_dir: str | Path | None = None, retriever: Retriever | None = None,
                 preflight: bool = True):
        cfg.validate()
        self.cfg, tc = cfg, cfg.trainer
        # batch semantics (docs/batch_semantics.md): ppo_mini_batch_size counts responses over all processes
        self.responses_per_step = tc.train_batch_size * cfg.rollout.n
        self.updates_per_step = tc.ppo_epochs * (self.responses_per_step // tc.ppo_mini_batch_size)
        self.total_updates = tc.total_steps * self.updates_per_step
        self.inputs = resume.inputs_fingerprint(cfg)
        self.run_dir = Path(run_dir) if run_dir else resume.run_dir_of(cfg, self.inputs)
        step.seed_everything(tc.seed)
        self.learner = Learner.build(cfg, self.total_updates, retriever=retriever, preflight=preflight)
        ws = self.learner.dist.world_size
        if tc.train_batch_size % ws or tc.ppo_mini_batch_size % ws:
            raise ValueError(
                f"trainer.train_batch_size ({tc.train_batch_size}) and trainer.ppo_mini_batch_size "
                f"({tc.ppo_mini_batch_size}) must be divisible by the number of processes ({ws})")
        if tc.staleness and ws > 1:
            raise ConfigError(f"trainer.staleness={tc.staleness} trains in one learner process with a rollout worker "
                              f"process beside it; this launch has {ws} processes, and the split GPU launch's rollout "
                              "ranks (searchr1_lld/placement.py) are not driven by the trainer yet")
        # the validation split (data.val_holdout: held out of the training rows here; or data.val_files)
        self.train_rows, self.val_rows = factories.load_train_and_val_rows(cfg)
        factories.check_prompt_lengths(self.train_rows, self.learner.tokenizer, cfg)
        self.sampler = PromptSampler(self.train_rows, tc.train_batch_size, tc.seed, cfg.data.shuffle)
        self.detector = PhaseDetector()
        self.probe = ProbeSet(tc.probe_size)
        self.history: list[dict[str, Any]] = []  # every step's metrics ({"step": n, ...}), resumed ones included
        self.best = BestCheckpoint(tc.keep_best, tc.keep_best_mode) if tc.keep_best else None
        self.step = 0  # training steps done (seeds the next step's RNG; the checkpoint's step)
        self.skipped_updates = 0  # optimiser steps skipped over the run for a non-finite gradient
        # wall seconds of run()'s steps (their scheduled evaluations included) over the whole run: an interrupted
        # pass's come back with its last checkpoint
        self.train_s = 0.0
        self.phase_report: PhaseReport | None = None  # the detector's report of the last step
        self.pipeline: RolloutPipeline | None = None  # trainer.staleness >= 1: built at the first step
        self.llds_warning = step.llds_noop_warning(cfg, self.updates_per_step)
        self.test_selection_warning = selection_on_test_warning(cfg)
        for warning in (self.llds_warning, self.test_selection_warning):
            if warning and self.learner.dist.is_main:
                warnings.warn(warning)

    # ---------------------------------------------------------------- the step and evaluation
    def train_step(self) -> dict[str, Any]:
        """One GRPO(+LLDS) step (:func:`searchr1_lld.learner.step.train_step`) on this rank's share of the next
        prompts; advances the counters and returns the step's metrics. With trainer.staleness >= 1 the step trains
        the batch a rollout worker generated beside the previous update (:meth:`pipelined_step`)."""
        if self.cfg.trainer.staleness == 0:
            result = step.train_step(self.learner, self.next_rows(), step=self.step, probe=self.probe,
                                     detector=self.detector, history=self.history, more_rows=self.next_rows)
            pipeline_metrics: dict[str, float] = {}
        else:
            result, pipeline_metrics = self.pipelined_step()
        self.step += 1
        self.skipped_updates += result.skipped_updates
        self.phase_report = result.phase_report
        metrics = {**result.metrics, **pipeline_metrics, "actor/skipped_updates_total": float(self.skipped_updates)}
        self.history.append({"step": self.step, **metrics})
        return metrics

    def pipelined_step(self) -> tuple[step.StepResult, dict[str, float]]:
        """The step on the batch of the rollout pipeline (learner/pipeline; started at the first step, after any
        resume): its rollout, generated by weights at most trainer.staleness versions old, trained as the synchronous
        step trains its own (the decoupled objective: logp_old is the learner's recompute, the proximal policy; the
        rollout correction weighs pi_proximal / pi_behaviour), then the weights published. Returns the step's result
        and the pipeline's async/* metrics."""
        if self.pipeline is None:
            seed, dist = self.cfg.trainer.seed, self.learner.dist
            self.pipeline = pipeline.process_pipeline(
                self.learner, start=self.step, draw_rows=self.next_rows, sampler_state=self.sampler.state,
                seed_of=lambda s: step.step_seed(seed, s, dist.rank, dist.world_size))  # the synchronous step's
        rollout, pipeline_metrics = self.pipeline.batch(self.step)
        sampled = sampling.StepRollout(rollout.trajectories, rollout.trajectories,
                                       {"time/rollout_s": rollout.rollout_s})
        result = step.train_step(self.learner, [t.row for t in rollout.trajectories[:: self.cfg.rollout.n]],
                                 step=self.step, probe=self.probe, detector=self.detector, history=self.history,
                                 sampled=sampled)
        self.pipeline.publish(self.learner.engine.named_weights(self.learner.module), version=self.step + 1)
        return result, pipeline_metrics

    def close_pipeline(self) -> None:
        """End the rollout pipeline's worker (trainer.staleness >= 1), if one runs."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None

    def sampler_state(self) -> dict[str, int]:
        """The prompt sampler's state a checkpoint records: with a pipeline, before the rows of its oldest request in
        flight (they are drawn and generated again on resume, never trained twice)."""
        return self.sampler.state() if self.pipeline is None else self.pipeline.sampler_state_to_save()

    def next_rows(self) -> list[dict]:
        """This rank's share of the sampler's next train_batch_size prompts (all ranks draw the same batch): the
        step's rows, and each further round of dynamic sampling's (which every rank runs alike)."""
        dist = self.learner.dist
        return self.sampler.next_batch()[dist.rank :: dist.world_size]

    def evaluate(self, rows: list[dict], desc: str = "eval", progress: bool = False) -> dict[str, float]:
        """Greedy EM on ``rows`` (:meth:`Learner.evaluate`)."""
        return self.learner.evaluate(rows, desc, progress)

    def evaluate_benchmarks(self, rows_by_dataset: dict[str, list[dict]]) -> dict[str, float]:
        """eval/<dataset>/em for each benchmark and eval/avg_em (mean over datasets), greedy, eval.max_turns/topk."""
        out = {f"eval/{name}/em": self.evaluate(rows, desc=name)["em"] for name, rows in rows_by_dataset.items()}
        out["eval/avg_em"] = sum(out.values()) / max(len(out), 1)
        return out

    def evaluate_by_source(self, rows: list[dict], key: str) -> dict[str, float]:
        """``{key: greedy EM on rows}``; rows of several sources (``data_source``: a hold-out of nq + hotpotqa) are
        scored source by source, each logged as ``<key less _em>/<source>/em`` (eval/val_em -> eval/val/nq/em), and
        ``key`` is their mean weighted by questions (the EM of all the rows)."""
        by_source: dict[str, list[dict]] = {}
        for row in rows:
            by_source.setdefault(splits.source_of(row), []).append(row)
        if len(by_source) < 2 or not key.endswith("_em"):
            return {key: self.evaluate(rows)["em"]}
        parts = {source: self.evaluate(part, desc=source or "eval") for source, part in by_source.items()}
        out = {f"{key.removesuffix('_em')}/{source or 'unnamed'}/em": m["em"] for source, m in parts.items()}
        out[key] = sum(m["em"] * m["n"] for m in parts.values()) / sum(m["n"] for m in parts.values())
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
            "data": self.sampler_state(),
            "skipped_updates": self.skipped_updates,
            "train_s": self.train_s,
            "history": self.history,
            "probe": [dataclasses.asdict(t) for t in self.probe.trajectories],
            "probe_measured": self.probe.measured,
            "step_size": self.learner.step_size.state_dict(),
        }
        lr = self.learner
        path = ckpt.save_checkpoint(
            self.run_dir, self.step, model=lr.model, optimizer=lr.optimizer, scheduler=lr.scheduler,
            trainer_state=state, accelerator=lr.accelerator, keep_last_k=self.cfg.trainer.keep_last_k,
            tokenizer=lr.tokenizer, keep_steps=keep, engine=lr.engine,
        )
        if best_value is not None and self.best is not None:
            self.best.record(self.step, best_value, path)
            if lr.dist.is_main:
                write_best(self.run_dir, self.best)
                ckpt.prune_checkpoints(self.run_dir, self.cfg.trainer.keep_last_k, self.best.kept_steps())
        return path

    def maybe_resume(self) -> Path | None:
        """Restore the checkpoint trainer.resume names (none: None): weights, optimiser, counters, sampler, LLD
        instruments; the engine receives the restored weights."""
        path = ckpt.resolve_resume(self.cfg.trainer.resume, self.run_dir)
        if path is None:
            return None
        lr = self.learner
        state = ckpt.load_checkpoint(path, model=lr.model, optimizer=lr.optimizer, scheduler=lr.scheduler,
                                     accelerator=lr.accelerator, engine=lr.engine)
        self.step = int(state["step"])
        self.sampler.load_state(state["data"])
        # checkpoints written before the counter was named skipped_updates call it skipped_steps
        self.skipped_updates = int(state.get("skipped_updates", state.get("skipped_steps", 0)))
        # checkpoints written before the history carried its step numbers: step i + 1 is the i-th record
        self.history = [h if "step" in h else {"step": i + 1, **h} for i, h in enumerate(state.get("history", []))]
        # checkpoints written before the run's clock was kept: its steps' own times (evaluations not counted)
        self.train_s = float(state.get("train_s", sum(h.get("time/step_s", 0.0) for h in self.history)))
        self.probe.trajectories = [Trajectory(**{**t, "action_spans": [tuple(s) for s in t["action_spans"]]})
                                   for t in state.get("probe", [])]
        self.probe.measured = bool(state.get("probe_measured", self.probe.trajectories))
        if "step_size" in state:  # checkpoints written before the controller existed ran without it (multiplier 1)
            lr.restore_step_size(state["step_size"])
        lr.sync_engine()
        return path

    # ---------------------------------------------------------------- the loop
    def run(self, *, evaluate: bool = True, allow_changes: Sequence[str] = ()) -> RunResult:
        """Train to ``trainer.total_steps`` (resuming per ``trainer.resume``). ``evaluate``: greedy test EM before and
        after training (eval.md); the evaluations every ``trainer.eval_every`` steps (``eval/val_em`` on the
        validation split, or ``eval/em`` on the test rows when there is none; also at the last step, where the
        benchmarks' ``eval/<name>/em`` are scored, every time with ``trainer.select_on_test``) follow the config
        alone. Greedy decoding draws no random numbers, so they leave the training itself unchanged.
        ``allow_changes``: config keys that may differ from the resumed run's saved config (see
        :data:`resume.RESUME_SAFE_KEYS`); any other is refused."""
        tracker = self._open_run(allow_changes)
        rows = self._eval_rows()
        em_before = None
        if evaluate and rows.test:
            em_before = self._em_before(rows.test)
            tracker.write(f"test EM before training: {em_before:.4f} ({len(rows.test)} questions)")
        if rows.full_val and self.step == 0:  # the ground truth before any update: the subsample and the whole split
            tracker.record(0, {**self.evaluate_by_source(rows.curve, rows.curve_key),
                               **self.evaluate_by_source(rows.full_val, "eval/val_em")})
        tracker.start_bar()  # its clock counts training only
        last_metrics: dict[str, Any] = {}
        last_phase, last_drawdown = "healthy", None
        try:
            while self.step < self.cfg.trainer.total_steps:
                started = time.time()
                last_metrics = metrics = self.train_step()
                metrics.update(self._scheduled_evaluations(rows))
                self.history[-1].update(metrics)
                tracker.log(self.step, metrics)
                last_phase, last_drawdown = self._log_phase(tracker, last_phase, last_drawdown)
                self.train_s += time.time() - started
                self._save_on_schedule(metrics)
            self._save_last()
        finally:
            self.close_pipeline()  # Ctrl-C or an error included: the rollout worker ends within seconds
        em_after, table = self._final_evaluation(tracker, rows.test, em_before, last_metrics) if (
            evaluate and rows.test) else (None, "")
        self._close_run(tracker)
        return RunResult(run_dir=self.run_dir, steps=self.step, final_metrics=last_metrics, em_before=em_before,
                         em_after=em_after, skipped_updates=self.skipped_updates, eval_table=table,
                         history=self.history, train_s=self.train_s)

    def _open_run(self, allow_changes: Sequence[str]) -> Tracker:
        """Settle the run directory (resume safety), resume, load the best checkpoint's record; the tracker, with the
        notes of all that written to it."""
        cfg, tc, lr = self.cfg, self.cfg.trainer, self.learner
        resume.check_run_dir_shared(lr.accelerator, self.run_dir)  # node-local run dirs: refused, one line
        notes = resume.settle_run_dir(cfg, self.run_dir, lr.dist.is_main, allow_changes, self.inputs)
        resumed = self.maybe_resume()
        if self.best is not None:
            self.best, best_note = load_best(self.run_dir, tc.keep_best, tc.keep_best_mode, self.step)
            notes = notes + ([best_note] if best_note else [])
        if resumed is not None:
            notes.append(f"resumed from {resumed} at step {self.step}")
        notes += [f"WARNING: {w}" for w in (self.llds_warning, self.test_selection_warning) if w]
        tracker = Tracker(self.run_dir, cfg.logging, cfg.to_dict(), total_steps=tc.total_steps,
                          start_step=self.step, enabled=lr.dist.is_main)
        for note in notes:
            tracker.write(note)
        return tracker

    def _eval_rows(self) -> EvalRows:
        cfg, tc = self.cfg, self.cfg.trainer
        limit = tc.eval_limit or cfg.eval.limit  # as the benchmarks (evaluation.benchmark_rows)
        test_rows = factories.load_test_rows(cfg)[:limit or None]
        val_rows = self.val_rows[:limit or None]
        # the curve during training: the validation rows when there are any (settings are chosen on them), else test
        curve, key = (val_rows, "eval/val_em") if val_rows else (test_rows, "eval/em")
        full_val: list[dict] = []
        if val_rows and tc.val_subsample:
            curve, key, full_val = evaluation.fixed_subsample(val_rows, tc.val_subsample), "eval/val_sub_em", val_rows
        return EvalRows(test=test_rows, curve=curve, curve_key=key, full_val=full_val,
                        benchmarks=evaluation.benchmark_rows(cfg) if tc.eval_every else {})

    def _scheduled_evaluations(self, rows: EvalRows) -> dict[str, float]:
        """The evaluations due after this step: every trainer.eval_every steps and at the last step; the whole
        validation split beside a subsample at the last step and at trainer.full_eval_steps; the benchmarks
        (eval.datasets, test sets) at the last step only, unless trainer.select_on_test."""
        tc = self.cfg.trainer
        last = self.step == tc.total_steps
        out = {}
        if rows.full_val and self.step in tc.full_eval_steps and not last:
            out.update(self.evaluate_by_source(rows.full_val, "eval/val_em"))
        if not tc.eval_every or not (self.step % tc.eval_every == 0 or last):
            return out
        if rows.curve:
            out.update(self.evaluate_by_source(rows.curve, rows.curve_key))
        if rows.full_val and last:
            out.update(self.evaluate_by_source(rows.full_val, "eval/val_em"))
        if rows.benchmarks and (last or tc.select_on_test):
            out.update(self.evaluate_benchmarks(rows.benchmarks))
        return out

    def _log_phase(self, tracker: Tracker, last_phase: str, last_drawdown: str | None) -> tuple[str, str | None]:
        """Phase changes, early warnings and a new drawdown alarm of this step, as lines of the run's log."""
        report = self.phase_report
        if report.phase != last_phase:
            tracker.write(f"step {self.step}: phase {last_phase} -> {report.phase}: {'; '.join(report.reasons)}")
        if report.warning:
            tracker.write(f"step {self.step}: {report.warning}")
        if report.drawdown_alarm and not last_drawdown:
            tracker.write(f"step {self.step}: {report.drawdown_alarm}")
        return report.phase, report.drawdown_alarm

    def _save_on_schedule(self, metrics: dict[str, Any]) -> None:
        """A new best (trainer.keep_best, agreed by every rank) or every trainer.save_every steps but the last."""
        tc = self.cfg.trainer
        if self.best is not None and any_rank(self.learner.accelerator, self.best.improves(metrics.get(self.best.metric))):
            self.save(best_value=float(metrics[self.best.metric]))
        elif tc.save_every and self.step % tc.save_every == 0 and self.step < tc.total_steps:
            self.save()

    def _save_last(self) -> None:
        """The last step is checkpointed whenever checkpoints are on (saving or resuming), unless it already is."""
        tc = self.cfg.trainer
        latest = ckpt.latest_checkpoint(self.run_dir)
        if (tc.save_every or tc.resume != "never") and (not latest or latest.name != f"step_{self.step:06d}"):
            self.save()

    def _final_evaluation(self, tracker: Tracker, test_rows: list[dict], em_before: float | None,
                          last_metrics: dict[str, Any]) -> tuple[float, str]:
        """Test EM after training (the last step's in-loop evaluation already scored this policy when it ran on
        test) and the before/after table, written to RUN/eval.md and eval.json."""
        em_after = last_metrics["eval/em"] if "eval/em" in last_metrics else self.evaluate(
            test_rows, "test (after training)", self.cfg.logging.progress_bar)["em"]
        table = eval_table(em_before, em_after, len(test_rows))
        if self.learner.dist.is_main:
            (self.run_dir / "eval.md").write_text(table + "\n")
            (self.run_dir / "eval.json").write_text(json.dumps({"em_before": em_before, "em_after": em_after,
                                                                "n": len(test_rows)}))
        tracker.write(table)
        return em_after, table

    def _close_run(self, tracker: Tracker) -> None:
        if self.best is not None:
            tracker.write(f"best checkpoint by {self.best.mode} {self.best.metric}: step {self.best.step} "
                          f"({self.best.value:.4f}) at {self.best.path}" if self.best.step is not None else
                          f"WARNING: trainer.keep_best={self.best.metric} was never logged: no best checkpoint kept")
        if self.learner.dist.is_main and self.skipped_updates:
            tracker.write(f"skipped {self.skipped_updates} updates with non-finite gradients")
        tracker.close()

    def _em_before(self, test_rows: list[dict]) -> float:
        """Test EM of the initial policy: measured once per run directory (eval_before.json), reused on resume."""
        path = self.run_dir / "eval_before.json"
        if path.is_file():
            return json.loads(path.read_text())["em"]
        em = self.evaluate(test_rows, "test (before training)", self.cfg.logging.progress_bar)["em"]
        if self.learner.dist.is_main:
            path.write_text(json.dumps({"em": em, "n": len(test_rows)}))
        return em


def selection_on_test_warning(cfg: Config) -> str:
    """The warning of a run that chooses on test (trainer.select_on_test), '' otherwise."""
    tc = cfg.trainer
    if not tc.select_on_test:
        return ""
    return (f"trainer.select_on_test=true: eval.datasets (test sets) are scored every {tc.eval_every} steps and "
            f"trainer.keep_best={tc.keep_best or '(off)'} may choose a checkpoint on them, as the authors' scripts "
            "did; the test EM of a checkpoint chosen so is not a held-out estimate")


def eval_table(em_before: float | None, em_after: float | None, n: int) -> str:
    """Markdown before/after EM table."""
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    delta = "-" if em_before is None or em_after is None else f"{em_after - em_before:+.4f}"
    return "\n".join([
        f"| test EM (n={n}) | before | after | change |",
        "| --- | --- | --- | --- |",
        f"| data.test_files | {fmt(em_before)} | {fmt(em_after)} | {delta} |",
    ])


def train(cfg: Config, *, run_dir: str | Path | None = None, retriever: Retriever | None = None,
          evaluate: bool = True, allow_changes: Sequence[str] = ()) -> RunResult:
    """Train with ``cfg`` (validated Config) and return a :class:`RunResult`. The lab and the demo call this."""
    cfg.validate()
    trainer = Trainer(cfg, run_dir=run_dir, retriever=retriever)
    return trainer.run(evaluate=evaluate, allow_changes=allow_changes)
