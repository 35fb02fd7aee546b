"""Baselines and slices of the world's held-out splits: what a policy scores without learning to search.

- ``majority``: per question family, the training split's most frequent gold answer, answered to every held-out
  question of that family (no model: a guess from the training answers);
- ``warm start, no retrieval``: the warm-started policy whose searches return no passage (``NoRetrieval``): what it
  answers from its weights alone;
- ``warm start``: the warm-started policy with the world's retriever (step 0 of every run).

The *not-guessable slice* of a held-out split: the questions none of whose gold answers is a training answer
(``metadata["train_answer"]`` false, :func:`searchr1_lld.world.splits.guessable`). The majority baseline scores 0
there by construction; a policy right there found the answer in a passage.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.evaluation.files import read_records
from searchr1_lld.evaluation.metrics import TRAJECTORIES
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.rewards import normalize_answer

SLICES = ("all", "not_guessable")
SUBJECT_KEY = "subject"  # metadata key of a world's QA row: the entity the question asks about (its cluster)
HOPS_KEY = "hops"  # metadata key of a world's QA row: 1 (single-hop) or 2 (through a bridge entity)
BASELINE_NAMES = ("majority", "warm_start_no_retrieval", "warm_start")
BASELINE_LABELS = {"majority": "majority training answer per question type",
                   "warm_start_no_retrieval": "warm start, no retrieval", "warm_start": "warm start (step 0)"}


class NoRetrieval:
    """A retriever that finds nothing: every query gets an empty list of hits (the closed-book baseline)."""

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[dict[str, Any]]]:
        return [[] for _ in queries]


def read_split(world_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """The rows of the world's ``split`` (qa/<split>.jsonl)."""
    return list(read_jsonl(Path(world_dir) / "qa" / f"{split}.jsonl"))


def majority_answers(train_rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per family, the most frequent first gold answer of the training rows (ties: the answer seen first)."""
    counts: dict[str, Counter] = {}
    for r in train_rows:
        counts.setdefault(r["metadata"]["family"], Counter())[r["golden_answers"][0]] += 1
    return {family: c.most_common(1)[0][0] for family, c in counts.items()}


def majority_correct(rows: Sequence[dict[str, Any]], train_rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per held-out row id: 1 when its family's majority training answer matches one of its gold answers (exact
    match after normalisation), else 0 (a family no training row has: 0)."""
    guess = majority_answers(train_rows)
    out = {}
    for r in rows:
        answer = guess.get(r["metadata"]["family"])
        golds = {normalize_answer(g) for g in r["golden_answers"]}
        out[str(r["id"])] = int(answer is not None and normalize_answer(answer) in golds)
    return out


def subject_of(row: dict[str, Any]) -> str:
    """The subject (entity) a world's QA row asks about: the cluster the intervals resample
    (:mod:`searchr1_lab.stats.bootstrap`). KeyError naming the key when the row has none."""
    meta = row.get("metadata") or {}
    if SUBJECT_KEY not in meta:
        raise KeyError(f"QA row {row.get('id')!r} has no metadata[{SUBJECT_KEY!r}]: not a synthetic world's row?")
    return str(meta[SUBJECT_KEY])


def hops_of(row: dict[str, Any]) -> int:
    """How many searches a world's QA row needs (1: single-hop; 2: a bridge entity first)."""
    return int(row["metadata"][HOPS_KEY])


def question_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the report needs of each held-out question: id, hops, family, subject, whether its answer is a training
    answer."""
    return [{"id": str(r["id"]), "hops": hops_of(r), "family": r["metadata"]["family"], "subject": subject_of(r),
             "train_answer": bool(r["metadata"].get("train_answer"))} for r in rows]


def subjects(questions: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Question id -> subject, from :func:`question_table`'s rows (the clusters of the intervals)."""
    return {q["id"]: q["subject"] for q in questions if q.get("subject") is not None}


def slice_em(correct: dict[str, float], questions: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """EM over ``all`` questions and over the ``not_guessable`` slice (None for an empty slice); ``correct``: id ->
    0/1 for every question."""
    ids = {"all": [q["id"] for q in questions],
           "not_guessable": [q["id"] for q in questions if not q["train_answer"]]}
    return {name: (sum(float(correct[i]) for i in sel) / len(sel) if sel else None) for name, sel in ids.items()}


def correct_by_id(eval_dir: str | Path) -> dict[str, int]:
    """Per question id, the greedy EM (0/1) of the evaluation in ``eval_dir`` (its trajectories file)."""
    return {str(r["id"]): int(r["em"] > 0.5) for r in read_records(Path(eval_dir) / TRAJECTORIES)}
