"""Fixed subsets of QA rows, the same for every run, seed and method that asks, whatever the files' row order: the
validation split held out of the training rows (:func:`hold_out`, ``data.val_holdout``) and a fixed sample of a
split stratified by source and number of hops (:func:`fixed_subsample`, ``trainer.val_subsample``).

Both rank the rows of a stratum by the SHA-256 of their id (salted by the hold-out's seed) and take the smallest, so
a row's membership depends on its id, its stratum and the seed alone."""

from __future__ import annotations

import hashlib
from typing import Any, Hashable, Sequence

from searchr1_lld.rewards import normalize_answer

Row = dict[str, Any]


def id_digest(row: Row, salt: str = "") -> str:
    """SHA-256 (hex) of ``salt + str(row["id"])``: the rank of a row within its stratum."""
    return hashlib.sha256((salt + str(row["id"])).encode()).hexdigest()


def source_of(row: Row) -> str:
    """The benchmark a row comes from (``data_source``; '' without one)."""
    return str(row.get("data_source") or "")


def question_key(question: str) -> str:
    """A question as duplicates compare: SQuAD-normalised (lower case, no punctuation, no articles, spaces
    squeezed), so "Who wrote Hamlet?" and "who wrote hamlet" are one question."""
    return normalize_answer(question)


def hold_out(rows: Sequence[Row], per_source: int, seed: int) -> tuple[list[Row], list[Row]]:
    """(training rows, validation rows) of ``rows``.

    Validation: in each source (:func:`source_of`) the ``per_source`` rows with the smallest
    ``id_digest(row, f"{seed}:")``. Training: every other row, less those whose question (:func:`question_key`) is
    a validation question, so that no validation question is trained on. Both keep the order of ``rows``;
    ``per_source`` 0 gives ``(rows, [])``. A source with ``per_source`` rows or fewer would leave nothing of it to
    train on: ValueError naming it."""
    if per_source <= 0:
        return list(rows), []
    by_source: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_source.setdefault(source_of(row), []).append(i)
    small = {s: len(ix) for s, ix in by_source.items() if len(ix) <= per_source}
    if small:
        raise ValueError(f"data.val_holdout.size={per_source} holds out every row of source(s) {small} "
                         f"(rows per source): lower it below the smallest source's row count")
    salt = f"{seed}:"
    chosen = {i for ix in by_source.values() for i in sorted(ix, key=lambda i: id_digest(rows[i], salt))[:per_source]}
    held_questions = {question_key(rows[i]["question"]) for i in chosen}
    train = [r for i, r in enumerate(rows) if i not in chosen and question_key(r["question"]) not in held_questions]
    return train, [r for i, r in enumerate(rows) if i in chosen]


def stratum(row: Row) -> tuple[str, Hashable]:
    """The stratum of a row in :func:`fixed_subsample`: (its source, its number of hops, ``metadata.hops``)."""
    return source_of(row), (row.get("metadata") or {}).get("hops")


def fixed_subsample(rows: Sequence[Row], size: int) -> list[Row]:
    """``size`` of ``rows``, the same whatever run, seed or method asks: the rows grouped by :func:`stratum` (source
    and number of hops), each group given its share of ``size`` (largest remainders, ties to the larger group), and
    within a group the rows whose id has the smallest SHA-256. In the order of ``rows``; all of them when ``size``
    is 0 or at least ``len(rows)``."""
    if size <= 0 or size >= len(rows):
        return list(rows)
    groups: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(stratum(row), []).append(i)
    quota = {g: size * len(ix) / len(rows) for g, ix in groups.items()}
    take = {g: int(q) for g, q in quota.items()}
    for g in sorted(groups, key=lambda g: (take[g] - quota[g], -len(groups[g])))[: size - sum(take.values())]:
        take[g] += 1
    chosen = {i for g, ix in groups.items() for i in sorted(ix, key=lambda i: id_digest(rows[i]))[: take[g]]}
    return [row for i, row in enumerate(rows) if i in chosen]
