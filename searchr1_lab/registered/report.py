"""What the report command of a registered study does, whatever its analysis: read the registration, analyse the
grid's compact results, write ``summary.json``, ``README.md`` and the figures into the report directory, and replace
the study's block of a README (``stepsize-report``, ``frontier-report``).

``summary.json`` records every float to :data:`SUMMARY_DIGITS` significant digits (:func:`summary_json`): the last
bits of a statistic depend on the library versions and the machine (SciPy's special functions, a BLAS kernel's order
of summation), and a committed report must regenerate byte for byte on any of them. The report and the figures are
drawn from the full-precision summary (rounding twice would move a value that ends in 5 to the other side).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from searchr1_lab.comparison.claims import clean, replace_readme_block
from searchr1_lab.methods import REPO_ROOT
from searchr1_lab.registered.registration import load_registration

Summary = Mapping[str, Any]
SUMMARY_DIGITS = 10  # significant digits of every float a registered study's summary.json records


def rounded(x: Any, digits: int = SUMMARY_DIGITS) -> Any:
    """``x`` with every finite float rounded to ``digits`` significant digits, recursively through dicts, lists and
    tuples (a tuple becomes a list, as JSON writes it); anything else as it is."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


def summary_json(summary: Summary) -> str:
    """The text of a registered study's ``summary.json``: ``summary`` with its floats :func:`rounded`, keys sorted."""
    return json.dumps(rounded(summary), indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class StudyReport:
    """A registered study's report: its command's name, its default registration, and its analysis's parts:
    ``analyse(reg, runs_dir)``, ``render(summary, reg)``, ``write_figures(summary, reg, runs_dir, out)``,
    ``readme_block(summary, reg)`` and ``readme_markers(reg)``."""

    prog: str
    default_registration: str
    analyse: Callable[[Mapping[str, Any], Path], dict[str, Any]]
    render: Callable[[Summary, Mapping[str, Any]], str]
    write_figures: Callable[[Summary, Mapping[str, Any], Path, Path], Any]
    readme_block: Callable[[Summary, Mapping[str, Any]], str]
    readme_markers: Callable[[Mapping[str, Any]], tuple[str, str]]

    def summary(self, reg: Mapping[str, Any], runs_dir: str | Path) -> dict[str, Any]:
        """The analysis of the runs in ``runs_dir``, JSON-safe (full precision: :func:`summary_json` rounds)."""
        return clean(self.analyse(reg, Path(runs_dir)))

    def write(self, registration: str | Path, runs_dir: str | Path, out_dir: str | Path,
              readme: str | Path | None = None) -> dict[str, Any]:
        """``summary.json``, ``README.md`` and the figures in ``out_dir``; with ``readme``, its block replaced."""
        reg = load_registration(registration)
        summary = self.summary(reg, runs_dir)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(summary_json(summary))
        (out / "README.md").write_text(self.render(summary, reg))
        self.write_figures(summary, reg, Path(runs_dir), out)
        if readme is not None:
            path = Path(readme)
            path.write_text(replace_readme_block(path.read_text(), self.readme_block(summary, reg),
                                                 *self.readme_markers(reg)))
        return summary

    def main(self, argv: Sequence[str], description: str) -> int:
        """The command line: ``--registration``, ``--runs``, ``--out``, ``--readme``."""
        p = argparse.ArgumentParser(prog=self.prog, description=description)
        p.add_argument("--registration", default=str(REPO_ROOT / self.default_registration),
                       help="the registration's JSON")
        p.add_argument("--runs", help="the grid's compact results (default: the registration's runs_dir)")
        p.add_argument("--out", help="report dir (default: the registration's report_dir)")
        p.add_argument("--readme", help="also replace this page's block of the study (the committed one: "
                                        "docs/lab/results.md)")
        args = p.parse_args(list(argv))
        reg = load_registration(args.registration)["registration"]
        s = self.write(args.registration, args.runs or REPO_ROOT / reg["runs_dir"],
                       args.out or REPO_ROOT / reg["report_dir"], args.readme)
        print(f"{s['runs_finished']} of {s['runs_planned']} runs; report in {args.out or reg['report_dir']}")
        return 0
