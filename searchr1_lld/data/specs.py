"""Dataset specs: how a run or an evaluation names the datasets it evaluates on (a benchmark name, or ``NAME=PATH``
of a rows file), checked without reading anything; the config's validation and the evaluator both parse them here."""

from __future__ import annotations

from typing import Sequence

BENCHMARKS: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
KNOWN_DATASETS: tuple[str, ...] = BENCHMARKS


class EvalError(ValueError):
    """A problem with evaluation inputs or outputs; the message says what and where."""


def dataset_name(spec: str) -> str:
    """The name a dataset spec is reported under: ``"nq"`` -> ``nq``; ``"synthetic=world/qa/test.jsonl"`` ->
    ``synthetic``."""
    return spec.partition("=")[0].strip()


def parse_datasets(text: str | Sequence[str]) -> list[str]:
    """``"nq,hotpotqa"`` or ``["nq", "hotpotqa"]`` or ``"all"`` -> checked list of dataset specs (order kept).

    A spec is a benchmark name (:data:`BENCHMARKS`, case-insensitive) or ``NAME=PATH``: the rows of a JSONL/parquet
    file in the project's QA schema, reported as NAME (e.g. ``synthetic=.cache/world/qa/test.jsonl``)."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    specs = [t if "=" in t else t.lower() for t in items]
    if specs == ["all"]:
        return list(BENCHMARKS)
    if not specs:
        raise EvalError("no dataset given")
    for spec in specs:
        name, sep, path = spec.partition("=")
        if sep and not (name.strip() and path.strip()):
            raise EvalError(f"dataset {spec!r}: a file dataset is NAME=PATH, both non-empty")
        if not sep and spec not in KNOWN_DATASETS:
            raise EvalError(f"unknown dataset {spec!r}; known: {list(KNOWN_DATASETS)} (or 'all', or NAME=PATH of a "
                            f"rows file)")
    names = [dataset_name(s) for s in specs]
    if len(set(names)) != len(names):
        raise EvalError(f"dataset listed twice in {names}")
    return specs
