"""The documentation speaks to users: no numbered work sessions or issues, a README a user reads top to bottom, links
that resolve, and README figures taken from the files the repository regenerates (not typed in)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from searchr1_lab import studies

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LAB_DIR = ROOT / "docs" / "lab"
RESULTS_PAGE = ROOT / studies.RESULTS_PAGE  # the studies' generated blocks
DEMO_DIR = ROOT / "docs" / "demo"  # written by `python -m searchr1_lab.demo --report docs/demo`
MARKDOWN = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MAX_README_LINES = 160  # about 150: pitch, commands, quick starts, findings, where things are

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


def collapsed_continuations(source: str) -> list[str]:
    """The docstrings of a Python source whose shell examples end a line in a backslash that the string literal
    swallows (``\\`` + newline in a non-raw string joins the lines: ``--help`` then prints them as one)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            continue
        text = ast.get_source_segment(source, body[0]) or ""
        if re.search(r"(?<!\\)(\\\\)*\\\n", text) and "\\\n" not in body[0].value.value:
            found.append(getattr(node, "name", "<module>"))
    return found


def test_docstrings_keep_the_line_continuations_of_their_examples():
    assert collapsed_continuations('"""Run\n    python x.py --a \\\n        --b\n"""\n') == ["<module>"]
    assert collapsed_continuations('r"""Run\n    python x.py --a \\\n        --b\n"""\n') == []
    assert collapsed_continuations('"""A literal backslash \\\\\n ends this line."""\n') == []
    hits = [f"{rel(p)}: {name}" for p in _tree_text_files() if p.suffix == ".py"
            for name in collapsed_continuations(p.read_text())]
    assert not hits, "make these docstrings raw (r\"\"\"), or their --help joins the example lines:\n" + "\n".join(hits)


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


# Pointers from code and configs into a document's section: ``docs/x.md, "Section"`` or ``docs/x.md, section "..."``
_POINTER = re.compile(r"(docs/[\w/.-]+\.md),? (?:section )?\"([^\"\n]+)\"")
POINTER_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".cfg"}


def section_pointers(text: str) -> list[tuple[str, str]]:
    """Every ``(doc, section)`` that ``text`` points at in the ``docs/x.md, "Section"`` style."""
    return _POINTER.findall(text)


def section_exists(markdown: str, section: str) -> bool:
    """A heading of ``markdown`` begins with ``section``, or a paragraph or list item does (a bold or plain
    lead-in such as ``**The detector, measured.**``), ignoring case."""
    want = section.strip().lower()
    for line in _FENCE.sub("", markdown).splitlines():
        text = re.sub(r"^(#{1,6}\s+|[-*]\s+)?(\*\*)?", "", line.strip()).lower()
        if text.startswith(want):
            return True
    return False


def test_section_pointer_helpers():
    code = 'x = 1  # see docs/lab.md, "The detector, measured" and docs/design.md, section "The science"\n'
    assert section_pointers(code) == [("docs/lab.md", "The detector, measured"), ("docs/design.md", "The science")]
    md = "# Title\n\n## The science in one page\n\n**The detector, measured.** Over every run\n- Item lead: x\n"
    assert section_exists(md, "The science") and section_exists(md, "The detector, measured")
    assert section_exists(md, "item lead") and not section_exists(md, "Over every run")
    assert not section_exists("```\n## Hidden\n```\n", "Hidden")


def _pointer_sources() -> list[Path]:
    out = []
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if (path.is_file() and path.suffix in POINTER_SUFFIXES and not set(parts) & SKIP_DIRS
                and path != Path(__file__).resolve()):  # this file's examples point at docs/x.md
            out.append(path)
    return out


def test_section_pointers_in_code_and_configs_resolve():
    broken = []
    for path in _pointer_sources():
        for doc, section in section_pointers(path.read_text(errors="replace")):
            target = ROOT / doc
            if not target.is_file():
                broken.append(f"{rel(path)}: {doc} (no such file)")
            elif not section_exists(target.read_text(), section):
                broken.append(f"{rel(path)}: {doc}, {section!r} (no heading or lead-in begins so)")
    assert not broken, "\n".join(broken)


# ---------------------------------------------------------------------------------------------------------------
# Figures the README quotes come from generated files
# ---------------------------------------------------------------------------------------------------------------

def test_the_results_pages_lab_block_is_what_the_report_command_computes(tmp_path):
    """The results page's lab figures equal what `python -m searchr1_lab report --runs docs/lab/runs` computes from
    the committed compact results (whatever part of the grid has finished), and so do docs/lab's summary and report."""
    from searchr1_lab.comparison.claims import readme_block, readme_block_of
    from searchr1_lab.comparison.report import report_markdown, write_outputs

    page = RESULTS_PAGE.read_text()
    assert "](summary.json)" in page, "the results page names the file its lab figures come from"
    summary = write_outputs(LAB_DIR / "runs", tmp_path)
    assert readme_block_of(page) == readme_block(summary)
    assert json.loads((LAB_DIR / "summary.json").read_text()) == summary
    assert (LAB_DIR / "README.md").read_text() == report_markdown(summary)


def test_the_results_pages_prereg_block_is_what_the_registered_analysis_computes(tmp_path):
    """The results page's block of the pre-registered comparison, docs/lab/prereg's summary, report and figures equal what
    `python -m searchr1_lab prereg-report` computes from the committed compact results (finished or not)."""
    from searchr1_lab.comparison.claims import readme_block_of
    from searchr1_lab.prereg.registration import load_preregistration
    from searchr1_lab.prereg.report import (PHENOMENA_FIGURES, README_BEGIN, README_END, readme_block, render,
                                            write_report)
    from searchr1_lab.registered.report import summary_json

    reg = load_preregistration()["registration"]
    summary = write_report(ROOT / "docs" / "lab" / "preregistration.json", ROOT / reg["runs_dir"], tmp_path)
    report_dir = ROOT / reg["report_dir"]
    assert readme_block_of(RESULTS_PAGE.read_text(), README_BEGIN, README_END) == readme_block(summary)
    assert (report_dir / "summary.json").read_text() == summary_json(summary)
    assert (report_dir / "README.md").read_text() == render(summary)
    # the registered files were split into a package: a commit that changed only the package's files is listed
    assert any(c["subject"].startswith("one registry of alarms") for c in summary["analysis_changes"])
    for stem in PHENOMENA_FIGURES:  # the report links one figure per phenomenon, each committed
        assert (report_dir / f"{stem}.png").is_file() and f"({stem}.png)" in render(summary)


def test_lab_summary_holds_what_a_reader_checks_first():
    summary = json.loads((LAB_DIR / "summary.json").read_text())
    assert {"selection", "baselines", "detector", "test_em_ci", "runs"} <= set(summary)
    for run in summary["runs"]:
        assert {"method", "seed", "lr", "val_em", "test_em", "phases", "verdict", "alarms"} <= set(run)
    if not summary["complete"]:  # nothing is selected, and no test figure claimed, before the grid is complete
        assert summary["selection"]["chosen"] == {} and summary["test_em_ci"] == {} and summary["difference"] is None


def test_readme_demo_result_is_one_line_copied_from_the_demo_report():
    from searchr1_lab.demo.report import readme_line

    lines = [line for line in README.read_text().splitlines() if line.startswith("Demo result:")]
    assert len(lines) == 1, "exactly one line begins with 'Demo result:'"
    assert "docs/demo/README.md" in links(README.read_text())
    path = DEMO_DIR / "summary.json"  # python -m searchr1_lab.demo --report docs/demo
    if not path.is_file():
        assert lines[0].startswith("Demo result: pending"), lines[0]
        return
    summary = json.loads(path.read_text())
    assert lines[0] == readme_line(summary)
    assert summary["selection"] is not None, "the demo's settings were chosen on validation"


def test_readme_shows_the_demo_figure_drawn_from_the_demo_report():
    """README.md and docs/demo/README.md show the demo's figure; the committed one was drawn from the committed
    summary.json's numbers (``write_figure`` stores them in the PNG), so a rerun of the report replaces both."""
    from searchr1_lab.demo.report import RESULT_FIGURE, figure_rows, read_figure_rows

    assert f"docs/demo/{RESULT_FIGURE}" in links(README.read_text())
    assert RESULT_FIGURE in links((DEMO_DIR / "README.md").read_text())
    summary = json.loads((DEMO_DIR / "summary.json").read_text())
    assert read_figure_rows(DEMO_DIR / RESULT_FIGURE) == figure_rows(summary)


def test_the_architecture_page_names_every_module_of_the_lab_studies():
    """docs/architecture.md's row of the lab names each module of each study folder (`name`), so a module added to
    a study is described where a reader looks for it."""
    row = next(line for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
               if line.startswith("| `searchr1_lab/` "))
    missing = [f"{folder.name}/{f.name}" for folder in sorted((ROOT / "searchr1_lab").iterdir())
               if folder.is_dir() and (folder / "__init__.py").is_file()
               for f in sorted(folder.glob("*.py")) if f.stem not in ("__init__", "__main__") and f"`{f.stem}`" not in row]
    assert not missing, f"describe these in docs/architecture.md's lab row: {missing}"


def test_the_default_worlds_vocabulary_and_size_are_quoted_as_its_card_records_them():
    """docs/configs.md and docs/lab.md quote the default world's tokenizer (asked, built) and policy size from the
    card of its build (docs/lab/warm-start/balanced.json, the default world's: the same config hash)."""
    from searchr1_lld.world.build import world_config_hash
    from searchr1_lld.world.config import load_world_config

    card = json.loads((LAB_DIR / "warm-start" / "balanced.json").read_text())
    assert card["config_hash"] == world_config_hash(load_world_config("configs/world/default.yaml"))
    asked, built, parameters = (card["config"]["tokenizer_vocab_size"], card["policy"]["vocab_size"],
                                card["policy"]["parameters"])
    configs_md, lab_md = ((ROOT / "docs" / name).read_text() for name in ("configs.md", "lab.md"))
    assert f"asks for {asked:,} tokens" in configs_md and f"records {built:,}" in configs_md
    assert f"{built:,} tokens, {parameters:,} parameters" in lab_md


def test_every_page_quotes_the_same_size_of_wiki18s_flat_index():
    """The flat e5 index of wiki-18 is 21,015,324 x 768 x 4 bytes: every figure of 60-69 GB in the docs, the README
    and the code (the only thing that size here) is that one, rounded to 0.1 GB."""
    from retriever.download import FLAT_INDEX_BYTES

    size = f"{FLAT_INDEX_BYTES / 1e9:.1f} GB"
    figure = re.compile(r"(?<![\d.,])6\d(?:\.\d+)? ?GB\b")
    places = [*MARKDOWN, *(p for p in _tree_text_files() if p.suffix == ".py" and p != Path(__file__).resolve())]
    wrong = [f"{rel(p)}:{i}: {m.group(0)}" for p in places
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             for m in figure.finditer(line) if m.group(0).replace(" ", "") != size.replace(" ", "")]
    assert size == "64.6 GB" and not wrong, f"the flat index is {size}: " + "; ".join(wrong)
