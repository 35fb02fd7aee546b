"""Result tables in the paper's layout (markdown, CSV) and the results files of an evaluation."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.evaluation.metrics import (DISPLAY_NAMES, KNOWN_DATASETS, RESULTS_CSV, RESULTS_JSON, RESULTS_MD, EvalError,
                                             relative_gain)


def table_cells(methods: Sequence[tuple[str, dict[str, Any]]],
                columns: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Shared layout of the markdown and CSV tables: rows = methods, columns = datasets + Avg. (+ gain vs row 0).

    ``columns``: the datasets to show, in order (default: every dataset of any row, the benchmarks first in the
    paper's order); a row without one shows ``-``."""
    if not methods:
        raise EvalError("no results to tabulate")
    present: list[str] = []
    for _, res in methods:
        for d in res["datasets"]:
            if d not in present:
                present.append(d)
    order = list(columns) if columns is not None else (
        [d for d in KNOWN_DATASETS if d in present] + [d for d in present if d not in KNOWN_DATASETS])
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


def render_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the first column left-aligned, the rest right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def markdown_table(methods: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Paper layout (EM): rows = methods/checkpoints, columns = datasets + Avg.; Gain = relative to the first row."""
    return render_markdown(*table_cells(methods))


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
    return render_csv(*table_cells(methods))


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
