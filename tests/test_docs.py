"""The documentation speaks to users: no numbered work sessions or issues, a README a user reads top to bottom, links
that resolve, and README figures taken from the files the repository regenerates (not typed in)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from searchr1_lld.lab.analysis import mean_std

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LAB_DIR = ROOT / "docs" / "lab"
DEMO_DIR = ROOT / "docs" / "demo"  # written by `python -m searchr1_lld.demo --report docs/demo`
MARKDOWN = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MAX_README_LINES = 300

SESSION_OR_ISSUE = re.compile(r"session[ -]?[0-9]+|sessions? [0-9]|issue[ #-]?[0-9]+|issues? #[0-9]", re.IGNORECASE)
# Source files the world/data refactor moves out of the tree; they are cleaned where they land.
MOVING = {"searchr1_lld/config/sections.py"}
MOVING_DIRS = {"data"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".c", ".cfg", ".ini", ".sh"}
SKIP_DIRS = {".git", ".venv", ".cache", "runs", "__pycache__", ".pytest_cache", "node_modules"}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_readme_is_short_enough_to_read():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail into docs/"


def test_no_numbered_sessions_or_issues_in_the_docs():
    hits = [f"{rel(p)}:{i}: {line.strip()}" for p in MARKDOWN
            for i, line in enumerate(p.read_text().splitlines(), 1) if SESSION_OR_ISSUE.search(line)]
    assert not hits, "documents state what is, not who did what when:\n" + "\n".join(hits)


def _tree_text_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
                       and not (here == ROOT and d in MOVING_DIRS)]
        for name in filenames:
            path = here / name
            if (path.suffix in TEXT_SUFFIXES or name == "Makefile") and rel(path) not in MOVING:
                yield path


def test_no_numbered_sessions_or_issues_in_code_configs_or_tests():
    hits = []
    for path in _tree_text_files():
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SESSION_OR_ISSUE.search(line):
                hits.append(f"{rel(path)}:{i}: {line.strip()}")
    assert not hits, "state the finding, not the session or issue it came from:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_should():
    # written as (word, rest) pairs so that this file does not match its own pattern
    for word, rest in (("session", " 12"), ("Session", "-4"), ("sessions", " 22-23"), ("issue", " 14"),
                       ("issue", " #11"), ("Issue", "-3"), ("issues", " #54, #57")):
        assert SESSION_OR_ISSUE.search(word + rest), word + rest
    for text in ("the session's run", "issues with the retriever", "sessions of training"):
        assert not SESSION_OR_ISSUE.search(text), text


# ---------------------------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def links(markdown: str) -> list[str]:
    """Targets of the inline links and images of ``markdown``, outside code blocks and code spans."""
    return _LINK.findall(_CODE_SPAN.sub("", _FENCE.sub("", markdown)))


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown`` (lower case, punctuation dropped, spaces to hyphens)."""
    out = set()
    for line in _FENCE.sub("", markdown).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_link_helpers():
    md = "[a](x.md#part) ![b](img.png) [c](https://e.org) `[d](no.md)`\n```\n[e](no2.md)\n```\n## Part: one, two\n"
    assert links(md) == ["x.md#part", "img.png", "https://e.org"]
    assert anchors(md) == {"part-one-two"}


@pytest.mark.parametrize("doc", MARKDOWN, ids=rel)
def test_relative_links_resolve(doc: Path):
    text = doc.read_text()
    broken = []
    for target in links(text):
        if _SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
            continue
        if anchor and path.is_file() and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{rel(doc)}: " + "; ".join(broken)


# ---------------------------------------------------------------------------------------------------------------
# Figures the README quotes come from generated files
# ---------------------------------------------------------------------------------------------------------------

def _table_after(markdown: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and body rows of the first table whose header row starts with ``header_start``."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[start]), rows


def _ms(values: list[float]) -> str:
    """Mean ± sample std over seeds, computed and printed as the lab's report does (``lab.analysis.mean_std``; a mean
    that lies on a rounding tie prints as the report prints it)."""
    mu, sd, _ = mean_std(values)
    return f"{mu:.3f} ± {sd:.3f}"


def test_readme_lab_table_is_computed_from_the_lab_summary():
    summary = json.loads((LAB_DIR / "summary.json").read_text())
    readme = README.read_text()
    assert "docs/lab/summary.json" in readme, "the README names the file its lab figures come from"
    header, rows = _table_after(readme, "| method | greedy test EM")
    warm = summary["warm_start"]
    assert header[1] == f"greedy test EM (warm start {warm['eval']['em']:.3f})"
    assert header[3] == f"sampled test EM (warm start {warm['eval_sampled']['em']:.3f})"
    report_rows = {r[0]: r for r in _table_after((LAB_DIR / "README.md").read_text(), "| Method | seeds |")[1]}
    aggregate = {a["method"]: a for a in summary["aggregate"]}

    expected = []
    for method in summary["methods"]:
        runs = sorted((r for r in summary["runs"] if r["method"] == method["key"]), key=lambda r: r["seed"])
        assert [r["seed"] for r in runs] == summary["seeds"]
        em = [r["eval"]["em"] for r in runs]
        sampled = [r["eval_sampled"]["em"] for r in runs]
        row = [method["label"], _ms(em), ", ".join(f"{x:.2f}" for x in em), _ms(sampled),
               ", ".join(r["verdict"] for r in runs)]
        expected.append(row)
        # the same figures as the lab's own report and aggregate (the report's "All (avg.) EM" column)
        agg = aggregate[method["key"]]["em"]
        assert (agg["mean"], agg["std"]) == pytest.approx(mean_std(em)[:2])
        assert report_rows[method["label"]][4] == row[1]
    assert rows == expected


DEMO_LINE = re.compile(r"^Demo result: (\d+\.\d\d) -> (\d+\.\d\d) \(seed (\d+), ([^()]+)\)$")


def test_readme_demo_result_is_one_line_that_names_seed_and_machine():
    lines = [line for line in README.read_text().splitlines() if line.startswith("Demo result:")]
    assert len(lines) == 1, "exactly one line begins with 'Demo result:'"
    m = DEMO_LINE.match(lines[0])
    assert m, f"'Demo result: BEFORE -> AFTER (seed N, MACHINE)', got {lines[0]!r}"
    assert "docs/demo/README.md" in links(README.read_text())
    # the demo's generated report (python -m searchr1_lld.demo --report docs/demo): the quoted figures are its own
    summary = json.loads((DEMO_DIR / "summary.json").read_text())
    em = summary["test_em"]
    assert m.group(1, 2, 3) == (f"{em['warm_start']['all']:.2f}", f"{em['trained']['all']:.2f}", str(summary["seed"]))
    assert summary["machine"].startswith(m.group(4).split("2-core ")[-1]), (m.group(4), summary["machine"])
