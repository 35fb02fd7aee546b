"""Running an evaluation: the rows of each dataset, greedy rollouts into the trajectories file, the sampled policy's
EM, comparisons."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from searchr1_lld.config import Config, RolloutConfig
from searchr1_lld.data import flashrag
from searchr1_lld.data.specs import EvalError, dataset_name, parse_datasets
from searchr1_lld.evaluation.files import TrajectoryLog, finalize, shard_rows, trajectories_path
from searchr1_lld.evaluation.metrics import dataset_metrics, record_from_trajectory, summarize
from searchr1_lld.evaluation.paper_table import write_paper_table
from searchr1_lld.data.jsonl import read_rows
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.rollout import agent_loop
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.rollout.types import Trajectory

# what :func:`evaluate` and :func:`sampled_em` call to roll out a batch: run_agent_loop's signature
RolloutFn = Callable[..., list[Trajectory]]


def load_eval_rows(datasets: Sequence[str], *, limit: int = 0, split: str | None = None,
                   flashrag_dir: str | Path | None = None,
                   file_rows: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Rows of each dataset spec (:func:`~searchr1_lld.evaluation.metrics.parse_datasets`), keyed by its name; the
    first ``limit`` rows when limit > 0.

    ``NAME=PATH``: the rows file at PATH; a benchmark name: the FlashRAG loader in
    :mod:`searchr1_lld.data.flashrag` (split = test if it exists, else dev, unless ``split`` is given; from the local
    mirror ``flashrag_dir`` or $FLASHRAG_LOCAL_DIR when set, else the hub). ``file_rows``: rows already read, by
    spec (a ``NAME=PATH`` found there is not read again; eval.py reads each file once and splits it by data_source).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for spec in datasets:
        name, sep, path = spec.partition("=")
        if file_rows is not None and spec in file_rows:
            rows = list(file_rows[spec])
        elif sep:
            if not Path(path).is_file():
                raise EvalError(f"dataset {name}: rows file {path} not found")
            rows = read_rows(path)
        else:
            rows = _load_benchmark(name, split, flashrag_dir)
        if limit > 0:
            rows = rows[:limit]
        ids = [str(r["id"]) for r in rows]
        if len(set(ids)) != len(ids):
            raise EvalError(f"dataset {name}: row ids are not unique (resume and sharding need unique ids)")
        out[dataset_name(spec)] = rows
    return out


def benchmark_rows(cfg: Config) -> dict[str, list[dict[str, Any]]]:
    """The datasets a training run evaluates on every trainer.eval_every steps (eval.datasets, first
    trainer.eval_limit or else eval.limit questions of each); loaded once at the start so a missing dataset fails
    before training. {} when eval.datasets is empty."""
    if not cfg.eval.datasets:
        return {}
    return load_eval_rows(parse_datasets(cfg.eval.datasets), limit=cfg.trainer.eval_limit or cfg.eval.limit)


def _load_benchmark(name: str, split: str | None, flashrag_dir: str | Path | None) -> list[dict[str, Any]]:
    try:
        return list(flashrag.load_eval_rows(name, split, local_dir=flashrag_dir))
    except flashrag.FlashRAGError as e:
        raise EvalError(str(e)) from e


def load_tokenizer(path: str | Path) -> Tokenizer:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def eval_rollout_config(rollout_cfg: RolloutConfig, *, max_turns: int, topk: int) -> RolloutConfig:
    """The training rollout settings with evaluation's turn and document limits (decoding is greedy)."""
    return dataclasses.replace(rollout_cfg, max_turns=max_turns, topk=topk, n=1)


def evaluate(rows_by_dataset: dict[str, Sequence[dict[str, Any]]], *, backend: GenerationBackend, tokenizer: Tokenizer,
             retriever: Retriever, rollout_cfg: RolloutConfig, out_dir: str | Path | None = None, batch_size: int = 64,
             template: str = "tiny", chat_template: str = "never", shard: tuple[int, int] | None = None,
             name: str = "", progress: bool = True, rollout_fn: RolloutFn | None = None) -> dict[str, Any] | None:
    """Greedy rollouts for every row not yet in the trajectories file, appended batch by batch.

    Without a shard: returns the results (also written as results.json / .md / .csv in ``out_dir``). With a shard:
    writes only the shard's trajectories file and returns None (run :func:`merge_shards` once all shards finish).
    ``out_dir`` None: in memory (nothing written or resumed), returns the :func:`summarize` of the (shard's) rows.
    ``rollout_fn`` defaults to :func:`searchr1_lld.rollout.agent_loop.run_agent_loop` (same signature).
    """
    if rollout_fn is None:
        rollout_fn = agent_loop.run_agent_loop  # the module's current function (a test may replace it)

    if batch_size < 1:
        raise EvalError(f"batch_size must be >= 1 (got {batch_size})")
    log = TrajectoryLog(trajectories_path(out_dir, shard)) if out_dir is not None else None
    in_memory: list[dict[str, Any]] = []
    for dataset, rows in rows_by_dataset.items():
        todo = [r for r in shard_rows(rows, shard) if log is None or not log.is_done(dataset, r["id"])]
        bar = tqdm(total=len(todo), desc=f"eval {dataset}", unit="q", disable=not progress)
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            trajs = rollout_fn(batch, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=rollout_cfg,
                                   n=1, greedy=True, template=template, chat_template=chat_template,
                                   progress=False)
            if len(trajs) != len(batch):
                raise EvalError(f"agent loop returned {len(trajs)} trajectories for {len(batch)} rows")
            records = [record_from_trajectory(t, dataset) for t in trajs]
            if log is not None:
                log.append(records)
            else:
                in_memory.extend(records)
            bar.update(len(batch))
        bar.close()
    if log is None:
        return summarize(in_memory, order=list(rows_by_dataset), name=name)
    if shard is not None:
        return None
    return finalize(out_dir, order=list(rows_by_dataset), name=name)


def sampled_em(rows: Sequence[dict[str, Any]], *, backend: GenerationBackend, tokenizer: Tokenizer,
               retriever: Retriever, rollout_cfg: RolloutConfig, samples: int, batch_size: int = 64,
               template: str = "tiny", chat_template: str = "never", progress: bool = True,
               rollout_fn: RolloutFn | None = None) -> dict[str, Any]:
    """EM of the *sampled* policy: ``samples`` rollouts per question at ``rollout_cfg.temperature`` (what GRPO
    trains and what its reward measures), in memory, nothing written.

        sampled em = mean over questions i and samples j of EM(pred_ij, golds_i)

    Returns :func:`dataset_metrics` over all ``len(rows) * samples`` rollouts (``n`` counts rollouts) plus
    ``questions``, ``samples`` and ``temperature``. Greedy decoding (:func:`evaluate`) scores the policy's mode; a
    policy whose mode drifts from its samples scores differently on the two.
    """
    if rollout_fn is None:
        rollout_fn = agent_loop.run_agent_loop  # the module's current function (a test may replace it)

    if samples < 1:
        raise EvalError(f"samples must be >= 1 (got {samples})")
    if batch_size < 1:
        raise EvalError(f"batch_size must be >= 1 (got {batch_size})")
    if not rows:
        raise EvalError("sampled_em: no rows")
    records: list[dict[str, Any]] = []
    bar = tqdm(total=len(rows), desc=f"sampled eval (x{samples})", unit="q", disable=not progress)
    for start in range(0, len(rows), batch_size):
        batch = list(rows[start:start + batch_size])
        trajs = rollout_fn(batch, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=rollout_cfg,
                           n=samples, greedy=False, template=template, chat_template=chat_template, progress=False)
        if len(trajs) != len(batch) * samples:
            raise EvalError(f"agent loop returned {len(trajs)} trajectories for {len(batch)} rows x {samples} samples")
        records += [record_from_trajectory(t, "sampled") for t in trajs]
        bar.update(len(batch))
    bar.close()
    return {**dataset_metrics(records), "questions": len(rows), "samples": samples,
            "temperature": rollout_cfg.temperature}


def model_label(model_path: str) -> str:
    """A table row label for a model: ``RUN/checkpoints/step_N/policy`` -> ``RUN-step_N`` (the run's directory
    name); ``DIR/policy`` or ``DIR/model`` -> ``DIR-policy`` / ``DIR-model``; a hub id ``owner/name`` -> ``name``;
    else the last path component."""
    parts = Path(model_path).parts
    if "checkpoints" in parts[1:-1]:
        i = len(parts) - 1 - parts[::-1].index("checkpoints")
        return f"{parts[i - 1]}-{parts[i + 1]}"
    if len(parts) > 1 and parts[-1] in ("policy", "model"):
        return f"{parts[-2].lstrip('.')}-{parts[-1]}"
    return parts[-1] if parts else str(model_path)


def distinct_labels(labels: Sequence[str], sources: Sequence[str]) -> list[str]:
    """``labels`` with every label that occurs more than once suffixed by its source (``name (source)``), so that
    no two rows of a table, or two entries of comparison.json, collapse into one."""
    counts = {x: labels.count(x) for x in labels}
    out = [f"{x} ({s})" if counts[x] > 1 else x for x, s in zip(labels, sources)]
    if len(set(out)) != len(out):
        raise EvalError(f"two rows have the same label and the same source: {out}")
    return out


def compare(methods: Sequence[tuple[str, dict[str, Any]]], out_dir: str | Path, baseline: str | None = None,
            result_dirs: Sequence[str | Path | None] | None = None) -> str:
    """The paper's table over ``methods`` (rows = runs, the seven benchmarks + Avg., Gain relative to the first row,
    or to the row named ``baseline``, which then comes first; the paper's average where quoted) -> out_dir/results.md,
    results.csv and comparison.json (:mod:`~searchr1_lld.evaluation.paper_table`). ``result_dirs``: each row's
    evaluation dir, where its provenance names the run it evaluated. Returns the Markdown."""
    dirs = list(result_dirs) if result_dirs is not None else [None] * len(methods)
    if baseline is not None:
        names = [name for name, _ in methods]
        if baseline not in names:
            raise EvalError(f"baseline {baseline!r} is none of the rows {names}")
        order = sorted(range(len(methods)), key=lambda i: methods[i][0] != baseline)  # stable: the others keep order
        methods, dirs = [methods[i] for i in order], [dirs[i] for i in order]
    return write_paper_table(out_dir, methods, dirs)
