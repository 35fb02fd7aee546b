"""The shape of the code: no import cycle among first-party modules, the core never imports the synthetic world, no
first-party package under a generic top-level name, modules of one job each (a few hundred lines)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("searchr1_lld", "retriever")
# the synthetic world's own package and its consumers (the demo and the lab run on it); train.py, an entry point,
# may build it too (--world). Everything else is the core, which takes a model, a retriever and rows files.
WORLD = "searchr1_lld.world"
WORLD_USERS = ("searchr1_lld.world", "searchr1_lld.lab", "searchr1_lld.demo")
MAX_MODULE_LINES = 500


def first_party_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO_ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the first-party modules it imports anywhere in its body (function-level imports included: a lazy
    import that closes a loop is a cycle too)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, f in modules.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_first_party_modules():
    assert cycles(import_graph(first_party_modules())) == []


def test_the_core_never_imports_the_synthetic_world():
    graph = import_graph(first_party_modules())
    offenders = {m: sorted(t for t in targets if t == WORLD or t.startswith(WORLD + "."))
                 for m, targets in graph.items() if not m.startswith(WORLD_USERS)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_first_party_package_under_a_generic_top_level_name():
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(p.rstrip("*") for p in include) == sorted(PACKAGES)
    assert not (REPO_ROOT / "data" / "__init__.py").exists()


def test_modules_stay_small():
    long = {m: n for m, f in first_party_modules().items() if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split by job: modules over {MAX_MODULE_LINES} lines: {long}"
