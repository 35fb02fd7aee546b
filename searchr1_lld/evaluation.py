"""Evaluator: greedy Search-R1 rollouts on QA benchmarks -> EM per benchmark -> tables.

    checkpoint --> run_agent_loop(greedy=True, max 4 turns, top-3 docs) --> one record per question
               --> trajectories.jsonl (append-only, flushed per batch: the source of truth)
               --> results.json / results.md / results.csv (always recomputed from trajectories.jsonl)

Metrics of one dataset (``n`` questions, one greedy response each):
    em                  = mean_i EM(pred_i, golds_i)                       (SQuAD-normalised exact match)
    sub_em              = mean_i subEM(pred_i, golds_i)                    (a gold is a substring of the prediction)
    f1                  = mean_i max_g tokenF1(pred_i, g)
    mean_valid_searches = mean_i valid_searches_i
    mean_turns          = mean_i num_turns_i
    invalid_action_rate = sum_i invalid_actions_i / sum_i num_turns_i     (share of turns that were invalid actions)
    truncation_rate     = mean_i 1[truncated_i]                            (ran out of token budget)
    answer_rate         = mean_i 1[prediction_i is not None]
Synthetic world rows carry ``metadata.hops``; then em_single_hop / em_multi_hop (and their n) are reported too.
Average over datasets (the paper's "Avg."): unweighted mean of the per-dataset EM.
Relative gain of a method over the base (the first row of a comparison): (avg_new - avg_base) / avg_base.

Resuming: a rerun reads trajectories.jsonl, skips every (dataset, id) already in it and appends only the rest; a
partial last line (a crash mid-write) is dropped. Each trajectories file has a ``*.provenance.json`` next to it: the
model (path + SHA-256 of its weight and config files), the tokenizer, the rows of every dataset (hashed), the decoding
settings and the retriever; a rerun whose provenance differs is refused (:func:`check_provenance`), so results of two
models or settings are never mixed. Sharding: ``shard=(i, k)`` evaluates rows i, i+k, i+2k, ... of every
dataset into ``trajectories.shard-i-of-k.jsonl``; :func:`merge_shards` combines the shard files and writes the tables.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from searchr1_lld.jsonl import read_jsonl
from searchr1_lld.rewards import exact_match, sub_exact_match, token_f1

BENCHMARKS: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SYNTHETIC = "synthetic"
KNOWN_DATASETS: tuple[str, ...] = BENCHMARKS + (SYNTHETIC,)
# Column headers in the paper's layout.
DISPLAY_NAMES = {
    "nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki",
    "musique": "Musique", "bamboogle": "Bamboogle", "synthetic": "Synthetic",
}
TRAJECTORIES = "trajectories.jsonl"
RESULTS_JSON, RESULTS_MD, RESULTS_CSV = "results.json", "results.md", "results.csv"


class EvalError(ValueError):
    """A problem with evaluation inputs or outputs; the message says what and where."""


# --------------------------------------------------------------------------------------------------------------------
# Records and metrics (pure)
# --------------------------------------------------------------------------------------------------------------------


def parse_datasets(text: str | Sequence[str]) -> list[str]:
    """``"nq,hotpotqa"`` or ``["nq", "hotpotqa"]`` or ``"all"`` -> checked list of dataset names (order kept)."""
    names = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if names == ["all"]:
        return list(BENCHMARKS)
    if not names:
        raise EvalError("no dataset given")
    unknown = [n for n in names if n not in KNOWN_DATASETS]
    if unknown:
        raise EvalError(f"unknown dataset {unknown[0]!r}; known: {list(KNOWN_DATASETS)} (or 'all')")
    if len(set(names)) != len(names):
        raise EvalError(f"dataset listed twice in {names}")
    return names


def record_from_trajectory(traj: Any, dataset: str) -> dict[str, Any]:
    """One JSON-able record per evaluated question; EM / sub-EM / F1 are scored here from ``traj.prediction``."""
    row = traj.row
    golds = list(row["golden_answers"])
    metadata = row.get("metadata") or {}
    prediction = traj.prediction
    return {
        "dataset": dataset,
        "id": str(row["id"]),
        "question": row["question"],
        "golden_answers": golds,
        "prediction": prediction,
        "em": exact_match(prediction, golds),
        "sub_em": sub_exact_match(prediction, golds),
        "f1": token_f1(prediction, golds),
        "num_turns": int(traj.num_turns),
        "valid_searches": int(traj.valid_searches),
        "invalid_actions": int(traj.invalid_actions),
        "truncated": bool(traj.truncated),
        "finish_reason": traj.finish_reason,
        "queries": list(traj.queries),
        "retrieved_ids": [list(ids) for ids in traj.retrieved_ids],
        "hops": metadata.get("hops"),
        "response_text": traj.response_text,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def dataset_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate the records of one dataset into the metrics listed in the module docstring."""
    if not records:
        raise EvalError("dataset_metrics: no records")
    turns = sum(r["num_turns"] for r in records)
    out: dict[str, Any] = {
        "n": len(records),
        "em": _mean([r["em"] for r in records]),
        "sub_em": _mean([r["sub_em"] for r in records]),
        "f1": _mean([r["f1"] for r in records]),
        "mean_valid_searches": _mean([r["valid_searches"] for r in records]),
        "mean_turns": _mean([r["num_turns"] for r in records]),
        "invalid_action_rate": sum(r["invalid_actions"] for r in records) / turns if turns else 0.0,
        "truncation_rate": _mean([float(r["truncated"]) for r in records]),
        "answer_rate": _mean([float(r["prediction"] is not None) for r in records]),
    }
    hops = [r.get("hops") for r in records]
    if any(h is not None for h in hops):
        for label, keep in (("single_hop", lambda h: h == 1), ("multi_hop", lambda h: h is not None and h >= 2)):
            subset = [r for r, h in zip(records, hops) if keep(h)]
            out[f"n_{label}"] = len(subset)
            out[f"em_{label}"] = _mean([r["em"] for r in subset]) if subset else None
    return out


def average_em(datasets: dict[str, dict[str, Any]]) -> float:
    """Unweighted mean of per-dataset EM (the paper's "Avg." column)."""
    if not datasets:
        raise EvalError("average_em: no datasets")
    return sum(m["em"] for m in datasets.values()) / len(datasets)


def relative_gain(new: float, base: float) -> float | None:
    """(new - base) / base; None when the base is 0 (undefined)."""
    if base == 0:
        return None
    return (new - base) / base


def summarize(records: Iterable[dict[str, Any]], order: Sequence[str] | None = None, name: str = "") -> dict[str, Any]:
    """All records -> ``{"name", "datasets": {ds: metrics}, "average_em", "n"}`` (datasets in ``order`` if given)."""
    by_ds: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_ds.setdefault(r["dataset"], []).append(r)
    names = [d for d in (order or []) if d in by_ds] + sorted(d for d in by_ds if d not in (order or []))
    datasets = {d: dataset_metrics(by_ds[d]) for d in names}
    return {
        "name": name,
        "datasets": datasets,
        "average_em": average_em(datasets) if datasets else 0.0,
        "n": sum(m["n"] for m in datasets.values()),
    }


# --------------------------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------------------------


def _table_rows(methods: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[list[str]]]:
    """Shared layout of the markdown and CSV tables: rows = methods, columns = datasets + Avg. (+ gain vs row 0)."""
    if not methods:
        raise EvalError("no results to tabulate")
    columns: list[str] = []
    for _, res in methods:
        for d in res["datasets"]:
            if d not in columns:
                columns.append(d)
    order = [d for d in KNOWN_DATASETS if d in columns] + [d for d in columns if d not in KNOWN_DATASETS]
    with_gain = len(methods) > 1
    header = ["Method"] + [DISPLAY_NAMES.get(d, d) for d in order] + ["Avg."] + (["Gain"] if with_gain else [])
    base_avg = methods[0][1]["average_em"]
    rows = []
    for i, (name, res) in enumerate(methods):
        cells = [name]
        for d in order:
            m = res["datasets"].get(d)
            cells.append(f"{m['em']:.3f}" if m is not None else "-")
        cells.append(f"{res['average_em']:.3f}")
        if with_gain:
            gain = relative_gain(res["average_em"], base_avg)
            cells.append("base" if i == 0 else ("n/a" if gain is None else f"{round(gain * 100, 1) + 0.0:+.1f}%"))
        rows.append(cells)
    return header, rows


def markdown_table(methods: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Paper layout (EM): rows = methods/checkpoints, columns = datasets + Avg.; Gain = relative to the first row."""
    header, rows = _table_rows(methods)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def detail_table(results: dict[str, Any]) -> str:
    """Per-dataset diagnostics of one run: EM, sub-EM, F1, searches, turns, invalid-action and truncation rates."""
    cols = ["n", "em", "sub_em", "f1", "mean_valid_searches", "mean_turns", "invalid_action_rate", "truncation_rate"]
    extra = [c for c in ("em_single_hop", "em_multi_hop") if any(c in m for m in results["datasets"].values())]
    cols += extra
    lines = ["| Dataset | " + " | ".join(cols) + " |", "|---|" + "|".join(["---:"] * len(cols)) + "|"]
    for d, m in results["datasets"].items():
        cells = []
        for c in cols:
            v = m.get(c)
            cells.append("-" if v is None else (str(v) if isinstance(v, int) else f"{v:.3f}"))
        lines.append(f"| {DISPLAY_NAMES.get(d, d)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_table(methods: Sequence[tuple[str, dict[str, Any]]]) -> str:
    header, rows = _table_rows(methods)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def write_tables(out_dir: str | Path, methods: Sequence[tuple[str, dict[str, Any]]], detail: dict | None = None) -> None:
    """results.md (+ per-dataset details when ``detail`` is one run's results) and results.csv in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = "## Exact match\n\n" + markdown_table(methods)
    if detail is not None:
        md += "\n## Details\n\n" + detail_table(detail)
    (out_dir / RESULTS_MD).write_text(md)
    (out_dir / RESULTS_CSV).write_text(csv_table(methods))


def write_results(out_dir: str | Path, results: dict[str, Any]) -> None:
    """results.json + results.md + results.csv of one evaluated checkpoint."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    write_tables(out_dir, [(results.get("name") or out_dir.name, results)], detail=results)


def load_results(path: str | Path) -> dict[str, Any]:
    """A finished evaluation's results.json (``path`` = the file or its directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSON
    if not path.is_file():
        raise EvalError(f"no {RESULTS_JSON} at {path}: is this a finished evaluation output dir?")
    res = json.loads(path.read_text())
    if "datasets" not in res or "average_em" not in res:
        raise EvalError(f"{path} is not an evaluation result (needs 'datasets' and 'average_em')")
    return res


# --------------------------------------------------------------------------------------------------------------------
# Trajectory file: append-only, resumable, shardable
# --------------------------------------------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a trajectories file; a truncated final line (crash mid-write) is ignored, any other bad line raises."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        return read_jsonl(path, partial_tail=True)
    except ValueError as e:
        raise EvalError(f"corrupt record: {e}") from None


class TrajectoryLog:
    """Append-only JSONL of evaluation records keyed by (dataset, id); flushed and fsynced after every batch."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records = read_records(self.path)
        self.done: set[tuple[str, str]] = {(r["dataset"], str(r["id"])) for r in records}
        # Drop a partial last line so appends start on a fresh line.
        if self.path.exists():
            text = self.path.read_text()
            if text and not text.endswith("\n"):
                self.path.write_text(text[: text.rfind("\n") + 1])

    def is_done(self, dataset: str, row_id: Any) -> bool:
        return (dataset, str(row_id)) in self.done

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        with open(self.path, "a") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done.update((r["dataset"], str(r["id"])) for r in records)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path)


# --------------------------------------------------------------------------------------------------------------------
# Provenance: what a trajectories file was produced by (resume only with the same)
# --------------------------------------------------------------------------------------------------------------------

# Files of a model directory that define its behaviour (hashed in full).
MODEL_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "config.json", "generation_config.json")
# Rollout settings that change what a greedy evaluation produces.
DECODING_KEYS = ("max_turns", "max_tokens_per_turn", "max_obs_length", "max_total_length", "topk")


def sha256_file(path: str | Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_fingerprint(model_path: str | Path) -> dict[str, Any]:
    """``{"model": path or hub id, "weights_sha256": ...}``: SHA-256 over the weight and config files of a local
    model dir (names + contents); a hub id is recorded as it is (its hash is ``None``)."""
    path = Path(model_path)
    if not path.is_dir():
        return {"model": str(model_path), "weights_sha256": None}
    files = sorted({f for pat in MODEL_FILE_PATTERNS for f in path.glob(pat) if f.is_file()})
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return {"model": str(path.resolve()), "weights_sha256": h.hexdigest() if files else None}


def rows_sha256(rows: Sequence[dict[str, Any]]) -> str:
    """Hash of the evaluated rows (ids, questions, gold answers): a rebuilt world or another split changes it."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([str(r["id"]), r["question"], list(r["golden_answers"])], ensure_ascii=False).encode())
    return h.hexdigest()


def eval_provenance(*, model_path: str | Path, tokenizer_path: str | Path, rows_by_dataset: dict[str, Sequence[dict]],
                    rollout_cfg: Any, template: str, backend: str, dtype: str, retriever: str) -> dict[str, Any]:
    """Everything that determines an evaluation's records (a JSON-able dict, compared key by key on resume)."""
    return {
        **model_fingerprint(model_path),
        "tokenizer": str(Path(tokenizer_path).resolve()) if Path(tokenizer_path).exists() else str(tokenizer_path),
        "datasets": {name: {"n": len(rows), "rows_sha256": rows_sha256(rows)} for name, rows in rows_by_dataset.items()},
        "decoding": {"greedy": True, "template": template, "backend": backend, "dtype": dtype,
                     **{k: getattr(rollout_cfg, k) for k in DECODING_KEYS}},
        "retriever": retriever,
    }


def provenance_path(out_dir: str | Path, shard: tuple[int, int] | None = None) -> Path:
    traj = trajectories_path(out_dir, shard)
    return traj.with_name(traj.name.removesuffix(".jsonl") + ".provenance.json")


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(old.keys() | new.keys())
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_provenance(out_dir: str | Path, shard: tuple[int, int] | None, provenance: dict[str, Any],
                     overwrite: bool = False) -> None:
    """Refuse to resume a trajectories file written by another model, data or decoding settings.

    Records present and provenance equal: resume. Records present and provenance different (or unknown: a file from
    before provenance was recorded): :class:`EvalError` listing the differences, unless ``overwrite``, which deletes
    the file (and this output's results) and starts over. Then the provenance is written next to the file.
    """
    traj, prov = trajectories_path(out_dir, shard), provenance_path(out_dir, shard)
    if overwrite:
        targets = [traj, prov] + ([] if shard else [Path(out_dir) / n for n in (RESULTS_JSON, RESULTS_MD, RESULTS_CSV)])
        for f in targets:
            f.unlink(missing_ok=True)
    if read_records(traj):
        if not prov.is_file():
            raise EvalError(f"{traj} holds results of an unknown model and settings (no {prov.name}); "
                            "rerun with --overwrite to start over, or pick another --out")
        diffs = _differences(json.loads(prov.read_text()), provenance)
        if diffs:
            raise EvalError(f"{traj} was produced by a different evaluation, refusing to mix results: "
                            + "; ".join(diffs) + ". Rerun with --overwrite to start over, or pick another --out")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tmp = prov.with_name(prov.name + ".part")
    tmp.write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    tmp.rename(prov)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/k"`` (0 <= i < k) -> (i, k); None -> None."""
    if text is None:
        return None
    try:
        i, k = (int(p) for p in text.split("/"))
    except ValueError:
        raise EvalError(f"--shard must look like i/k (e.g. 0/4), got {text!r}") from None
    if not (k >= 1 and 0 <= i < k):
        raise EvalError(f"--shard {text!r}: need 0 <= i < k")
    return i, k


def shard_rows(rows: Sequence[dict], shard: tuple[int, int] | None) -> list[dict]:
    """Rows i, i+k, i+2k, ... (the k shards partition the rows)."""
    if shard is None:
        return list(rows)
    i, k = shard
    return list(rows[i::k])


def trajectories_path(out_dir: str | Path, shard: tuple[int, int] | None = None) -> Path:
    if shard is None:
        return Path(out_dir) / TRAJECTORIES
    return Path(out_dir) / f"trajectories.shard-{shard[0]}-of-{shard[1]}.jsonl"


def count_pending(rows_by_dataset: dict[str, Sequence[dict[str, Any]]], out_dir: str | Path,
                  shard: tuple[int, int] | None = None) -> int:
    """How many rows (of this shard) are not yet in the trajectories file."""
    path = trajectories_path(out_dir, shard)
    done = {(r["dataset"], str(r["id"])) for r in read_records(path)}
    return sum((d, str(r["id"])) not in done for d, rows in rows_by_dataset.items() for r in shard_rows(rows, shard))


def merge_shards(out_dir: str | Path, order: Sequence[str] | None = None, name: str = "") -> dict[str, Any]:
    """Combine every ``trajectories.shard-*.jsonl`` (and an existing trajectories.jsonl) in ``out_dir`` into
    trajectories.jsonl (one record per (dataset, id)), then write results.json / .md / .csv. Returns the results."""
    out_dir = Path(out_dir)
    shard_files = sorted(out_dir.glob("trajectories.shard-*-of-*.jsonl"))
    if not shard_files and not (out_dir / TRAJECTORIES).exists():
        raise EvalError(f"no trajectories or shard files in {out_dir}")
    counts = {int(p.name.split("-of-")[1].split(".")[0]) for p in shard_files}
    if len(counts) > 1:
        raise EvalError(f"shard files in {out_dir} disagree on the shard count: {sorted(counts)}")
    _merge_provenance(out_dir, shard_files)
    log = TrajectoryLog(out_dir / TRAJECTORIES)
    for p in shard_files:
        log.append([r for r in read_records(p) if not log.is_done(r["dataset"], r["id"])])
    return finalize(out_dir, order=order, name=name)


def _merge_provenance(out_dir: Path, shard_files: Sequence[Path]) -> None:
    """All shards (and an existing merged file) must come from the same evaluation; the merged file gets it too."""
    provs = {}
    for p in list(shard_files) + [out_dir / TRAJECTORIES]:
        prov = p.with_name(p.name.removesuffix(".jsonl") + ".provenance.json")
        if prov.is_file():
            provs[p.name] = json.loads(prov.read_text())
    if not provs:
        return
    first_name, first = next(iter(provs.items()))
    for name, prov in provs.items():
        diffs = _differences(first, prov)
        if diffs:
            raise EvalError(f"{first_name} and {name} in {out_dir} come from different evaluations: " + "; ".join(diffs))
    provenance_path(out_dir).write_text(json.dumps(first, indent=1, sort_keys=True) + "\n")


def finalize(out_dir: str | Path, order: Sequence[str] | None = None, name: str = "") -> dict[str, Any]:
    """Recount everything from trajectories.jsonl and write results.json / results.md / results.csv."""
    out_dir = Path(out_dir)
    records = read_records(out_dir / TRAJECTORIES)
    if not records:
        raise EvalError(f"{out_dir / TRAJECTORIES} has no records")
    results = summarize(records, order=order, name=name or out_dir.name)
    write_results(out_dir, results)
    return results


# --------------------------------------------------------------------------------------------------------------------
# Data, retriever, backend
# --------------------------------------------------------------------------------------------------------------------


def load_eval_rows(datasets: Sequence[str], *, world_dir: str | Path = ".cache/world", limit: int = 0,
                   split: str | None = None, flashrag_dir: str | Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """Rows of each dataset (first ``limit`` rows when limit > 0).

    ``synthetic``: ``world_dir/qa/test.jsonl``; a benchmark name: the FlashRAG loader in :mod:`data.flashrag`
    (split = test if it exists, else dev, unless ``split`` is given; from the local mirror ``flashrag_dir`` or
    $FLASHRAG_LOCAL_DIR when set, else the hub).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for name in datasets:
        if name == SYNTHETIC:
            path = Path(world_dir) / "qa" / f"{split or 'test'}.jsonl"
            if not path.is_file():
                raise EvalError(f"synthetic test split not found at {path}; build it with "
                                f"`python -m data.build_world --out {world_dir}`")
            rows = read_jsonl(path)
        else:
            rows = _load_benchmark(name, split, flashrag_dir)
        if limit > 0:
            rows = rows[:limit]
        ids = [str(r["id"]) for r in rows]
        if len(set(ids)) != len(ids):
            raise EvalError(f"dataset {name}: row ids are not unique (resume and sharding need unique ids)")
        out[name] = rows
    return out


def benchmark_rows(cfg: Any) -> dict[str, list[dict[str, Any]]]:
    """The benchmarks a training run evaluates on (eval.datasets, first trainer.eval_limit or else eval.limit
    questions of each); loaded once at the start so a missing dataset fails before training."""
    return load_eval_rows(parse_datasets(cfg.eval.datasets), world_dir=cfg.data.world_dir,
                          limit=cfg.trainer.eval_limit or cfg.eval.limit)


def _load_benchmark(name: str, split: str | None, flashrag_dir: str | Path | None) -> list[dict[str, Any]]:
    from data import flashrag  # the FlashRAG loader (hub or local mirror)

    try:
        return list(flashrag.load_eval_rows(name, split, local_dir=flashrag_dir))
    except flashrag.FlashRAGError as e:
        raise EvalError(str(e)) from e


def make_retriever(*, url: str | None = None, index_dir: str | Path | None = None, **client_kwargs: Any) -> Any:
    """HTTP client when ``url`` is given, else an in-process retriever over ``index_dir``."""
    if url:
        from retriever.client import RetrieverClient

        return RetrieverClient(url, **client_kwargs)
    if not index_dir:
        raise EvalError("need a retriever: --retriever-url URL or --index DIR")
    from retriever.inprocess import InProcessRetriever

    return InProcessRetriever(str(index_dir))


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def make_backend(kind: str, model_path: str | Path, tokenizer: Any, *, rollout_cfg: Any, batch_size: int,
                 dtype: str = "auto", device: str = "auto", tokenizer_path: str = "") -> Any:
    """``hf``: transformers model in eval mode (GPU if present); ``vllm``: a vLLM engine (GPU only)."""
    if kind == "vllm":
        from searchr1_lld.rollout.backends.vllm import VLLMBackend

        return VLLMBackend(str(model_path), tokenizer, rollout_cfg, dtype=dtype, tokenizer_path=str(tokenizer_path))
    if kind != "hf":
        raise EvalError(f"unknown backend {kind!r}; expected 'hf' or 'vllm'")
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1_lld.rollout.backends.hf import HFBackend

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.bfloat16 if device == "cuda" else torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch_dtype).to(device).eval()
    return HFBackend(model, tokenizer, batch_size=batch_size)


# --------------------------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------------------------


def eval_rollout_config(rollout_cfg: Any, *, max_turns: int, topk: int) -> Any:
    """The training rollout settings with evaluation's turn and document limits (decoding is greedy)."""
    return dataclasses.replace(rollout_cfg, max_turns=max_turns, topk=topk, n=1)


def evaluate(rows_by_dataset: dict[str, Sequence[dict[str, Any]]], *, backend: Any, tokenizer: Any, retriever: Any,
             rollout_cfg: Any, out_dir: str | Path | None = None, batch_size: int = 64, template: str = "tiny", chat_template: str = "never",
             shard: tuple[int, int] | None = None, name: str = "", progress: bool = True,
             rollout_fn: Callable[..., list[Any]] | None = None) -> dict[str, Any] | None:
    """Greedy rollouts for every row not yet in the trajectories file, appended batch by batch.

    Without a shard: returns the results (also written as results.json / .md / .csv in ``out_dir``). With a shard:
    writes only the shard's trajectories file and returns None (run :func:`merge_shards` once all shards finish).
    ``out_dir`` None: in memory (nothing written or resumed), returns the :func:`summarize` of the (shard's) rows.
    ``rollout_fn`` defaults to :func:`searchr1_lld.rollout.agent_loop.run_agent_loop` (same signature).
    """
    from tqdm.auto import tqdm

    if rollout_fn is None:
        from searchr1_lld.rollout.agent_loop import run_agent_loop as rollout_fn

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


def compare(methods: Sequence[tuple[str, dict[str, Any]]], out_dir: str | Path) -> str:
    """One comparison table (rows = methods, Gain relative to the first) -> out_dir/results.md/.csv/.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tables(out_dir, methods)
    base_avg = methods[0][1]["average_em"]
    summary = {
        "base": methods[0][0],
        "methods": {name: {**res, "relative_gain": relative_gain(res["average_em"], base_avg)} for name, res in methods},
    }
    (out_dir / "comparison.json").write_text(json.dumps(summary, indent=2) + "\n")
    return markdown_table(methods)
