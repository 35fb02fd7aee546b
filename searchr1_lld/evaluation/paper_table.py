"""The paper's results table from several evaluations: rows = runs, columns = the seven benchmarks + Avg., the
relative gain against a baseline row, and the paper's own average where the design notes quote one.

    python eval.py --compare-dirs runs/grpo/eval runs/llds-ma/eval --baseline <grpo row> --out runs/table

writes ``results.md`` (the table and its footnotes), ``results.csv`` (the same cells) and ``comparison.json`` (every
row's results, relative gain and paper average as numbers, and the table's cells).

Paper numbers: docs/design.md quotes four averages (EM over the seven benchmarks), all for runs trained on
NQ+HotpotQA: Qwen2.5-3B-Base 0.312 (GRPO) -> 0.430 (LLDS-MA), Qwen2.5-7B-Base 0.350 -> 0.462. A row gets one when
it evaluates a run of the matching paper config: the ``name`` in the run's ``config.yaml`` (the run is found from the
model path in the evaluation's provenance, ``RUN/checkpoints/step_N/policy``), else the row label's prefix
(``<config name>-<hash>-step_N``). Every other row shows ``—``, and the footnote says that no number is quoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from searchr1_lld.evaluation.metrics import BENCHMARKS, RESULTS_CSV, RESULTS_MD, relative_gain
from searchr1_lld.evaluation.tables import render_csv, render_markdown, table_cells

# Average EM over the seven benchmarks as the paper reports it, by the paper config that reproduces the run
# (docs/design.md, "Headline results to anchor against").
PAPER_AVERAGE_EM = {
    "qwen2.5-3b-base_nq-hotpotqa_grpo": 0.312,
    "qwen2.5-3b-base_nq-hotpotqa_llds-ma": 0.430,
    "qwen2.5-7b-base_nq-hotpotqa_grpo": 0.350,
    "qwen2.5-7b-base_nq-hotpotqa_llds-ma": 0.462,
}
NONE_QUOTED = "—"
PROVENANCE_FILE = "trajectories.provenance.json"


def run_config_name(result_dir: str | Path | None) -> str | None:
    """The config name of the training run whose checkpoint ``result_dir`` evaluated: ``name`` in RUN/config.yaml,
    RUN being the dir above ``checkpoints/`` in the provenance's model path; None when that cannot be found."""
    if result_dir is None:
        return None
    prov = Path(result_dir) / PROVENANCE_FILE
    if not prov.is_file():
        return None
    parts = Path(str(json.loads(prov.read_text()).get("model", ""))).parts
    if "checkpoints" not in parts[1:]:
        return None
    run_dir = Path(*parts[:len(parts) - 1 - parts[::-1].index("checkpoints")])
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    import yaml

    name = (yaml.safe_load(config.read_text()) or {}).get("name")
    return str(name) if name else None


def paper_config(label: str, result_dir: str | Path | None = None) -> str | None:
    """The paper config a row reproduces (a key of :data:`PAPER_AVERAGE_EM`), or None: the run's config name, else
    the config name the label starts with (``<config>`` or ``<config>-...``)."""
    name = run_config_name(result_dir)
    if name is not None:
        return name if name in PAPER_AVERAGE_EM else None
    matches = [c for c in PAPER_AVERAGE_EM if label == c or label.startswith(c + "-")]
    return max(matches, key=len) if matches else None


def _gain_cell(gain: float | None) -> str:
    return "n/a" if gain is None else f"{round(gain * 100, 1) + 0.0:+.1f}%"


def paper_table(methods: Sequence[tuple[str, dict[str, Any]]],
                result_dirs: Sequence[str | Path | None] | None = None) -> dict[str, Any]:
    """The table of ``methods`` (label, results), the first row the baseline of the Gain column.

    Returns ``{"header", "rows", "notes", "methods"}``: the cells (strings), the footnotes, and per row its results
    with ``relative_gain``, ``paper_config`` and ``paper_average_em`` (None where none is quoted). The seven
    benchmarks are columns whenever a row has one of them (``-`` where a row lacks it; its Avg. is then over fewer
    benchmarks and marked ``†``); other datasets follow them.
    """
    dirs = list(result_dirs) if result_dirs is not None else [None] * len(methods)
    present = [d for _, res in methods for d in res["datasets"]]
    paper_layout = any(d in BENCHMARKS for d in present)
    columns = (list(BENCHMARKS) if paper_layout else []) + list(dict.fromkeys(
        d for d in present if not paper_layout or d not in BENCHMARKS))
    header, rows = table_cells(methods, columns=columns)
    avg_col = header.index("Avg.")
    base_avg = methods[0][1]["average_em"]
    notes: list[str] = []
    out_methods: dict[str, Any] = {}
    partial = False
    for (name, res), row, result_dir in zip(methods, rows, dirs):
        covered = [d for d in BENCHMARKS if d in res["datasets"]]
        if paper_layout and len(covered) < len(BENCHMARKS):
            row[avg_col] += "†"
            partial = True
        config = paper_config(name, result_dir) if paper_layout else None
        quoted = PAPER_AVERAGE_EM.get(config) if config else None
        if paper_layout:
            row.append(NONE_QUOTED if quoted is None else f"{quoted:.3f}")
        out_methods[name] = {**res, "relative_gain": relative_gain(res["average_em"], base_avg),
                             "benchmarks_averaged": len(res["datasets"]), "paper_config": config,
                             "paper_average_em": quoted}
    if len(methods) > 1:
        notes.append(f"Gain: relative to {methods[0][0]}'s Avg., (avg - base) / base.")
    if partial:
        notes.append("†: averaged over the datasets the row has, fewer than the seven benchmarks; not comparable "
                     "with the paper's Avg.")
    if paper_layout:
        header.append("Paper Avg.")
        notes.append("Paper Avg.: the paper's average EM over the seven benchmarks for the row's config, as "
                     "docs/design.md quotes it (Qwen2.5-3B-Base / 7B-Base trained on NQ+HotpotQA: GRPO 0.312 / 0.350, "
                     f"LLDS-MA 0.430 / 0.462). {NONE_QUOTED}: the design notes quote no paper number for that row.")
    return {"header": header, "rows": rows, "notes": notes, "methods": out_methods}


def write_paper_table(out_dir: str | Path, methods: Sequence[tuple[str, dict[str, Any]]],
                      result_dirs: Sequence[str | Path | None] | None = None) -> str:
    """results.md (table + footnotes), results.csv and comparison.json in ``out_dir``; returns the Markdown."""
    table = paper_table(methods, result_dirs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = render_markdown(table["header"], table["rows"])
    if table["notes"]:
        md += "\n" + "\n".join(table["notes"]) + "\n"
    (out_dir / RESULTS_MD).write_text("## Exact match\n\n" + md)
    (out_dir / RESULTS_CSV).write_text(render_csv(table["header"], table["rows"]))
    summary = {"base": methods[0][0], "methods": table["methods"],
               "table": {"header": table["header"], "rows": table["rows"], "notes": table["notes"]}}
    (out_dir / "comparison.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return md
