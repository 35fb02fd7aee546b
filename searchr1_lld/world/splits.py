"""How the world's entities and questions are split: the shares of the held-out splits (validation, test), the
seeded split labels, and which held-out questions have an answer that is also a training answer."""

from __future__ import annotations

import random
from typing import Any

from searchr1_lld.rewards import normalize_answer
from searchr1_lld.world.config import WorldConfig

HELD_OUT_SPLITS = ("val", "test")


def held_out_shares(cfg: WorldConfig) -> dict[str, float]:
    """Share of the people, cities and companies that each held-out split gets (between 0.1 and 0.3 each, by its
    share of the questions)."""
    total = max(cfg.num_train_questions + cfg.num_val_questions + cfg.num_test_questions, 1)
    return {split: max(0.1, min(0.3, getattr(cfg, f"num_{split}_questions") / total)) for split in HELD_OUT_SPLITS}


def split_labels(rng: random.Random, n: int, shares: dict[str, float]) -> list[str]:
    """``n`` split labels in a seeded order: at least one entity per held-out split, the rest train."""
    labels: list[str] = []
    for split, share in shares.items():
        labels += [split] * max(1, round(n * share))
    if len(labels) >= n:
        raise ValueError(f"{n} entities of a kind cannot be split into train, validation and test; raise the counts")
    labels += ["train"] * (n - len(labels))
    rng.shuffle(labels)
    return labels


def answer_keys(row: dict[str, Any]) -> set[str]:
    """A row's gold answers, normalised as exact match compares them."""
    return {normalize_answer(g) for g in row["golden_answers"]} - {""}


def mark_train_answers(rows: list[dict[str, Any]], train_rows: list[dict[str, Any]]) -> None:
    """Set ``metadata["train_answer"]`` of every row: whether one of its gold answers is also the gold answer of a
    training question (in place)."""
    seen = set().union(*(answer_keys(r) for r in train_rows)) if train_rows else set()
    for r in rows:
        r["metadata"]["train_answer"] = bool(answer_keys(r) & seen)


def guessable(row: dict[str, Any]) -> bool:
    """A held-out row whose gold answer is also a training answer (``metadata["train_answer"]``)."""
    return bool(row["metadata"].get("train_answer"))
