"""Evaluation records and metrics (pure): one record per question, EM / sub-EM / F1 and behaviour per dataset."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from searchr1_lld.data.specs import BENCHMARKS, KNOWN_DATASETS, EvalError, dataset_name, parse_datasets
from searchr1_lld.rewards import exact_match, sub_exact_match, token_f1
from searchr1_lld.rollout.types import Trajectory

__all__ = ["BENCHMARKS", "KNOWN_DATASETS", "DISPLAY_NAMES", "TRAJECTORIES", "RESULTS_JSON", "RESULTS_MD", "RESULTS_CSV",
           "EvalError", "dataset_name", "parse_datasets", "record_from_trajectory", "dataset_metrics", "average_em",
           "relative_gain", "summarize"]

# Column headers in the paper's layout.
DISPLAY_NAMES = {
    "nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki",
    "musique": "Musique", "bamboogle": "Bamboogle",
}
TRAJECTORIES = "trajectories.jsonl"
RESULTS_JSON, RESULTS_MD, RESULTS_CSV = "results.json", "results.md", "results.csv"


def record_from_trajectory(traj: Trajectory, dataset: str) -> dict[str, Any]:
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
