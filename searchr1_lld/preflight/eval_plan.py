"""What a training run evaluates, when, and what that costs, counted in greedy trajectories (one per question) beside
the run's own training trajectories, bounded in generated tokens and timed at a measured generation rate. The
preflight prints it for a run (``train.py --preflight``: :func:`plan_lines`); the block in docs/configs.md compares
the paper configs' schedule with the authors' (``python -m searchr1_lld.preflight.eval_plan --doc docs/configs.md``).

    evaluations   E = ceil(total_steps / eval_every)       (every eval_every steps and at the last one; 0 when off)
    curve         V questions at each: the validation split (data.val_holdout or data.val_files; trainer.val_subsample
                  of them, the whole split again before the first step, at the last and at trainer.full_eval_steps),
                  else the data.test_files rows
    benchmarks    B questions (eval.datasets): once, at the last step; at each of the E with trainer.select_on_test
    test rows     T (data.test_files): before and after training (after: the last evaluation's, when they are the curve)
    trajectories  = E x (V + B if select_on_test) + (B unless select_on_test) + the test rows' and whole splits' passes
    training      = total_steps x train_batch_size x rollout.n trajectories
    tokens       <= trajectories x (eval.max_turns + 1) x rollout.max_tokens_per_turn
    GPU-hours    <= tokens / (generated tokens / s of one GPU) / 3600
Every set is first cut to trainer.eval_limit (else eval.limit) questions when one is set.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from searchr1_lld.config import REPO_ROOT, Config, load_config
from searchr1_lld.data import flashrag
from searchr1_lld.data.specs import dataset_name, parse_datasets

BEGIN = "<!-- eval-cost:begin (python -m searchr1_lld.preflight.eval_plan --doc docs/configs.md) -->"
END = "<!-- eval-cost:end -->"
GPU_CHECK = "docs/gpu_check/h200.json"
# the schedules the block compares: (what, config, overrides)
DOC_RUNS = (
    ("paper configs, NQ+HotpotQA cells", "configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml", ()),
    ("paper configs, NQ cells", "configs/paper/qwen2.5-3b-base_nq_llds-ma.yaml", ()),
    ("the authors' schedule (trainer.select_on_test=true)", "configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml",
     ("trainer.select_on_test=true", "trainer.keep_best=eval/avg_em", "data.val_holdout.size=0")),
)
RATE_KEY = re.compile(r"rollout_tokens_per_s_(?P<model>.+)_b(?P<batch>\d+)")


@dataclass(frozen=True)
class EvalSets:
    """The questions a run evaluates on, counted (before any limit)."""

    validation: int = 0  # the validation split
    test_rows: int = 0  # data.test_files
    benchmarks: dict[str, int] = field(default_factory=dict)  # eval.datasets, by name


@dataclass(frozen=True)
class EvalSchedule:
    """A run's evaluations, counted as in the module docstring."""

    evaluations: int  # E
    per_evaluation: int  # questions scored at each of the E
    once: int  # questions scored once over the run beyond them (benchmarks at the end, test rows, whole splits)
    training_trajectories: int
    max_tokens_per_question: int

    @property
    def trajectories(self) -> int:
        return self.evaluations * self.per_evaluation + self.once

    @property
    def share_of_training(self) -> float:
        return self.trajectories / self.training_trajectories

    @property
    def max_tokens(self) -> int:
        return self.trajectories * self.max_tokens_per_question

    def max_gpu_hours(self, tokens_per_s: float) -> float:
        return self.max_tokens / tokens_per_s / 3600


def eval_schedule(cfg: Config, sets: EvalSets) -> EvalSchedule:
    """The schedule of ``cfg`` over ``sets`` (module docstring)."""
    tc, limit = cfg.trainer, cfg.trainer.eval_limit or cfg.eval.limit
    cut = (lambda n: min(n, limit)) if limit else (lambda n: n)  # noqa: E731
    val, test, bench = cut(sets.validation), cut(sets.test_rows), sum(cut(n) for n in sets.benchmarks.values())
    evaluations = math.ceil(tc.total_steps / tc.eval_every) if tc.eval_every else 0
    curve = (min(tc.val_subsample, val) if tc.val_subsample else val) if val else test
    whole = 2 + len(set(tc.full_eval_steps) - {tc.total_steps})  # before, at the last step, at trainer.full_eval_steps
    whole_splits = whole * val if evaluations and val and tc.val_subsample else 0
    per_evaluation = curve + (bench if tc.select_on_test else 0)
    benchmarks_once = bench if evaluations and not tc.select_on_test else 0
    test_passes = test * (1 if evaluations and not val else 2)  # before; after, unless the last evaluation scored them
    return EvalSchedule(
        evaluations=evaluations, per_evaluation=per_evaluation if evaluations else 0,
        once=benchmarks_once + test_passes + whole_splits,
        training_trajectories=tc.total_steps * tc.train_batch_size * cfg.rollout.n,
        max_tokens_per_question=(cfg.eval.max_turns + 1) * cfg.rollout.max_tokens_per_turn)


def plan_lines(cfg: Config, sets: EvalSets, unread: bool = False) -> list[str]:
    """The preflight's lines on evaluation (``unread``: a named rows file could not be read, so nothing is counted)."""
    tc, e = cfg.trainer, cfg.eval
    if unread:
        return ["evaluation: not computed (its rows files cannot be read here: see the problems)"]
    s = eval_schedule(cfg, sets)
    if not s.trajectories:
        return ["evaluation: none (no validation split, data.test_files or eval.datasets evaluated)"]
    bench = sum(sets.benchmarks.values())
    when = "at each evaluation (trainer.select_on_test)" if tc.select_on_test else "once, at the last step"
    parts = [f"{s.evaluations} evaluations (every {tc.eval_every} steps and the last), {s.per_evaluation:,} questions "
             f"each" if s.evaluations else "during training: none (trainer.eval_every=0)"]
    if bench and s.evaluations:
        parts.append(f"eval.datasets ({bench:,} questions: "
                     f"{', '.join(f'{k} {n:,}' for k, n in sets.benchmarks.items())}) {when}")
    if sets.test_rows:
        parts.append(f"data.test_files ({sets.test_rows:,} questions) before and after training")
    return [f"evaluation: {'; '.join(parts)}",
            f"evaluation cost: {s.trajectories:,} greedy trajectories over the run, {100 * s.share_of_training:.1f} % "
            f"of its {s.training_trajectories:,} training trajectories; at most {s.max_tokens / 1e6:.1f} M generated "
            f"tokens ({e.max_turns + 1} turns x {cfg.rollout.max_tokens_per_turn})"]


def paper_sets(cfg: Config) -> EvalSets:
    """The sets of a paper config, counted without its files: the hold-out's size per source of its training mix
    (FlashRAG's rows carry their dataset as data_source), the benchmarks' FlashRAG sizes."""
    sources = len(flashrag.TRAIN_MIXES[cfg.data.train_mix])
    names = [dataset_name(s) for s in parse_datasets(cfg.eval.datasets)] if cfg.eval.datasets else []
    return EvalSets(validation=cfg.data.val_holdout.size * sources,
                    benchmarks={n: flashrag.EXPECTED_EVAL_COUNTS[n] for n in names})


def measured_rate(report: dict) -> tuple[float, str]:
    """(tokens/s, what it is) of a GPU check's JSON: the rollout rate of its largest model at its largest batch."""
    found = [(m, int(match["batch"]), v) for k, v in report["results"].items()
             if (match := RATE_KEY.fullmatch(k)) and v and (m := match["model"]) in report["models"]]
    model, batch, rate = max(found, key=lambda f: (report["models"].index(f[0]), f[1]))
    return rate, (f"the HF backend's {rate:,.0f} generated tokens/s on one {report['device']} ({model}'s shape, "
                  f"batch {batch}, the largest measured)")


def render_block(root: Path, gpu_check: str = GPU_CHECK) -> str:
    """The docs/configs.md block: each schedule of :data:`DOC_RUNS` counted on its config, timed at the GPU check's
    rate."""
    rate, basis = measured_rate(json.loads((root / gpu_check).read_text()))
    rows, training = [], 0
    for what, path, overrides in DOC_RUNS:
        cfg = load_config(root / path, list(overrides))
        s = eval_schedule(cfg, paper_sets(cfg))
        training = s.training_trajectories
        rows.append(f"| {what} | {s.evaluations} | {s.per_evaluation:,} | {s.once:,} | {s.trajectories:,} | "
                    f"{100 * s.share_of_training:.1f} % | {s.max_tokens / 1e6:,.0f} | {s.max_gpu_hours(rate):,.0f} |")
    basis_text = textwrap.fill(
        f"Counted from the configs (`{DOC_RUNS[0][1]}` and its NQ sibling) and FlashRAG's benchmark sizes; a run "
        f"trains on {training:,} trajectories. Tokens are bounded by (`eval.max_turns` + 1) x "
        f"`rollout.max_tokens_per_turn` per question; GPU-hours divide that bound by {basis}, from `{gpu_check}`, "
        "the only generation rate measured (no vLLM engine and no 3B or 7B rollout has been timed). A trajectory "
        "that answers before its last turn, or stops a turn short of its token budget, generates less than the "
        "bound, so the hours bound the cost from above; where evaluation and training trajectories are about as "
        "long, the share of the training trajectories is the share of the run's generation time.", width=118)
    return "\n".join([
        BEGIN, "", basis_text, "",
        "| schedule | evaluations | questions each | questions once | greedy trajectories | of the training "
        "trajectories | generated tokens (M), at most | GPU-hours at most |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows, "", END])


def replace_block(text: str, block: str) -> str:
    """``text`` with its eval-cost block (markers included) replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no '{BEGIN}' ... '{END}' markers in the document")
    return text[:start] + block + text[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 prog="python -m searchr1_lld.preflight.eval_plan")
    ap.add_argument("--doc", help="write the block between the eval-cost markers of this document (else print it)")
    ap.add_argument("--gpu-check", default=GPU_CHECK, help="the GPU check's JSON whose rollout rate times the tokens "
                    "(relative to the repository root)")
    args = ap.parse_args(argv)
    block = render_block(REPO_ROOT, args.gpu_check)
    if args.doc:
        doc = Path(args.doc)
        doc.write_text(replace_block(doc.read_text(), block))
    else:
        print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
