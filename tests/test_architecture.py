"""The shape of the code: no import cycle among first-party modules nor among their folders (imports inside functions
included), imports inside functions only where they defer a heavy optional dependency (and say which), the core never
imports the synthetic world, no first-party package under a generic top-level name, modules of one job each (a few
hundred lines), functions a reader holds in their head (at most 60 lines), no untyped config."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("searchr1_lld", "searchr1_lab", "retriever")
# the experiments (the studies, the demo, the sweeps), beside the library as verl keeps recipe/ beside verl/: they
# import the library; the library and its entry scripts import nothing from them
EXPERIMENTS = "searchr1_lab"
# the entry scripts: argument parsing and one typed function of the package each (held to the packages' rules too)
ENTRY_SCRIPTS = ("train.py", "eval.py")
# the synthetic world's own package and its consumers (the experiments run on it); train.py, an entry point,
# may build it too (--world). Everything else is the core, which takes a model, a retriever and rows files.
WORLD = "searchr1_lld.world"
WORLD_USERS = ("searchr1_lld.world", EXPERIMENTS, "train")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
# the optional dependencies heavy enough to defer: an import inside a function says which one it defers, as
# ``# deferred: <dependency>`` on its line, and the imported module must import that dependency at its top
HEAVY_DEPENDENCIES = ("vllm", "deepspeed", "faiss", "wandb", "bm25s", "matplotlib", "pyarrow", "uvicorn", "fastapi",
                      "datasets", "transformers", "torch")
MAX_DEFERRED_IMPORTS = 40


def first_party_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO_ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    for script in ENTRY_SCRIPTS:
        out[Path(script).stem] = REPO_ROOT / script
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


def test_no_import_cycle_among_the_benchmarks():
    """The benchmark scripts import each other by their bare names (benchmarks/ is their sys.path[0])."""
    scripts = {f.stem: f for f in (REPO_ROOT / "benchmarks").glob("*.py")}
    graph = import_graph(scripts)
    assert graph["gpu_check_e2e"] >= {"gpu_check_parts"}  # the graph sees their imports
    assert cycles(graph) == []


def folder_of(module: str, modules: dict[str, Path]) -> str:
    """The folder node of a module: a top-level package's sub-package (``searchr1_lld.rollout.backends.hf`` ->
    ``searchr1_lld.rollout``), or the module itself when it sits at a package's root (``searchr1_lld.cli``)."""
    parts = module.split(".")
    if len(parts) >= 2 and ".".join(parts[:2]) in modules and modules[".".join(parts[:2])].name == "__init__.py":
        return ".".join(parts[:2])
    return module


def folder_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for m, targets in import_graph(modules).items():
        src = folder_of(m, modules)
        graph.setdefault(src, set()).update(folder_of(t, modules) for t in targets)
        graph[src].discard(src)
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    return graph


def test_the_folder_graph_collapses_sub_packages():
    modules = first_party_modules()
    assert folder_of("searchr1_lld.rollout.backends.hf", modules) == "searchr1_lld.rollout"
    assert folder_of("searchr1_lab.stepsize.report", modules) == "searchr1_lab.stepsize"
    assert folder_of("searchr1_lld.cli", modules) == "searchr1_lld.cli"
    assert cycles({"searchr1_lab": {"searchr1_lab.demo"}, "searchr1_lab.demo": {"searchr1_lab"}}) != []


def test_no_import_cycle_among_folders():
    """A folder is one node (sub-packages included); imports inside functions count: a loop hidden behind a lazy
    import is a loop."""
    assert cycles(folder_graph(first_party_modules())) == []


def deferred_imports(modules: dict[str, Path]) -> list[tuple[str, int, str, str]]:
    """(file, line, imported first-party module, the line's ``# deferred:`` reason or "") of every first-party
    import inside a function."""
    out = []
    for m, f in modules.items():
        lines = f.read_text().splitlines()
        for fn in ast.walk(ast.parse(f.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if not node.level else [f"{m}.{node.module or ''}"]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    if node.__class__ is ast.ImportFrom and node.level:
                        name = "first-party (relative)"
                    elif name.split(".")[0] not in PACKAGES:
                        continue
                    line = lines[node.lineno - 1] if node.end_lineno == node.lineno else "\n".join(
                        lines[node.lineno - 1: node.end_lineno])
                    reason = line.split("# deferred:", 1)[1].strip() if "# deferred:" in line else ""
                    out.append((str(f.relative_to(REPO_ROOT)), node.lineno, name, reason))
    return out


def top_level_imports(path: Path) -> set[str]:
    """The top-level distributions a module imports outside any function (``import torch.nn`` -> ``torch``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_imports_inside_functions_defer_a_heavy_dependency():
    """A first-party import inside a function is there to defer a heavy optional dependency, and says which one
    (``# deferred: vllm``); the module it imports does import that dependency at its top. Any other belongs at the
    top of the file (a loop it would close is a design problem, not an import-order one)."""
    modules = first_party_modules()
    found = deferred_imports(modules)
    unexplained = [f"{f}:{n} {name}" for f, n, name, reason in found if not reason]
    assert unexplained == [], "move to the top of the file, or say what is deferred (# deferred: <dependency>)"
    wrong = []
    for f, n, name, reason in found:
        dep = reason.split()[0].rstrip(":,")
        target = name
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if dep not in HEAVY_DEPENDENCIES or not target or dep not in top_level_imports(modules[target]):
            wrong.append(f"{f}:{n} {name} # deferred: {reason}")
    assert wrong == [], f"the reason must name one of {HEAVY_DEPENDENCIES} that the imported module imports at its top"
    assert len(found) <= MAX_DEFERRED_IMPORTS, f"{len(found)} deferred imports: {found}"


def test_functions_fit_in_a_head():
    long = []
    for m, f in first_party_modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == [], f"cut into named stages (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_the_config_is_typed_where_it_is_passed():
    untyped = []
    for m, f in first_party_modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.args + node.args.kwonlyargs:
                    if (a.arg in ("cfg", "config") or a.arg.endswith("_cfg")) and (
                            a.annotation is None or ast.unparse(a.annotation) == "Any"):
                        untyped.append(f"{f.relative_to(REPO_ROOT)}:{node.lineno} {node.name}({a.arg})")
    assert untyped == [], f"annotate with the config's dataclass: {untyped}"


def test_the_core_never_imports_the_synthetic_world():
    graph = import_graph(first_party_modules())
    offenders = {m: sorted(t for t in targets if t == WORLD or t.startswith(WORLD + "."))
                 for m, targets in graph.items() if not m.startswith(WORLD_USERS)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_the_library_imports_nothing_from_the_experiments():
    """searchr1_lld, retriever and the entry scripts work without searchr1_lab (imports inside functions count)."""
    graph = import_graph(first_party_modules())
    assert graph["searchr1_lab.demo.command"] >= {"searchr1_lld.world"}  # the graph sees the experiments' imports
    offenders = {m: sorted(t for t in targets if t == EXPERIMENTS or t.startswith(EXPERIMENTS + "."))
                 for m, targets in graph.items() if not (m == EXPERIMENTS or m.startswith(EXPERIMENTS + "."))}
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


# the folders docs/architecture.md draws (leaf modules of the package root are listed there, not drawn); the
# experiments package is one node, "lab"
PICTURED = ("lab", "world", "learner", "preflight", "bookkeeping", "instruments", "evaluation",
            "rollout", "algo", "config", "data", "retriever")


def pictured_edges() -> set[tuple[str, str]]:
    """(importer, imported) among the pictured folders, from the code (retriever's modules are one node, the
    experiments' another)."""
    def node(name: str) -> str | None:
        if name == "retriever" or name.startswith("retriever."):
            return "retriever"
        if name == EXPERIMENTS or name.startswith(EXPERIMENTS + "."):
            return "lab"
        short = name.removeprefix("searchr1_lld.")
        return short if short in PICTURED else None

    edges = set()
    for src, targets in folder_graph(first_party_modules()).items():
        for t in targets:
            a, b = node(src), node(t)
            if a and b and a != b:
                edges.add((a, b))
    return edges


def test_the_architecture_picture_is_the_code():
    """docs/architecture.md's mermaid picture has exactly the folder dependencies of the code."""
    import re

    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no mermaid picture"
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.M))
    code = pictured_edges()
    expected = "\n".join(f"  {a} --> {b}" for a, b in sorted(code))
    assert drawn == code, f"redraw the picture from the code:\n{expected}"


# the registries that read a generation backend's or a retriever mode's name; nothing else compares the name
KIND_REGISTRIES = ("searchr1_lld/rollout/backends/kinds.py", "retriever/modes.py")
KIND_NAMES = {"hf", "vllm", "inprocess", "http"}
KIND_FIELDS = {"backend", "mode"}


def kind_name_tests(source: str) -> list[int]:
    """The lines of ``source`` that test a ``backend`` / ``mode`` value against a kind's name: a comparison
    (``==``, ``!=``, ``in``) of such a field with a kind name (or a collection of them), or a table keyed by kind
    names."""
    def is_field(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in KIND_FIELDS) or (
            isinstance(node, ast.Name) and node.id in KIND_FIELDS)

    def is_name(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in KIND_NAMES

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(is_field, operands)) and any(map(is_name, operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and sum(k is not None and is_name(k) for k in node.keys) >= 2:
            lines.append(node.lineno)
    return lines


def test_the_kind_test_finder_finds_string_tests():
    assert kind_name_tests("if cfg.rollout.backend == 'vllm': pass") == [1]
    assert kind_name_tests("x = 1\nok = rc.mode != 'http'") == [2]
    assert kind_name_tests("ok = backend in ('hf', 'vllm')") == [1]
    assert kind_name_tests("f = {'hf': a, 'vllm': b}[cfg.backend]") == [1]
    assert kind_name_tests("rc = replace(rc, mode='http')\nk = kind.streams_requests") == []


def test_no_string_test_on_a_backend_or_retriever_kind_outside_its_registry():
    """A generation backend or a retriever mode is chosen once, by its registry (rollout/backends/kinds.py,
    retriever/modes.py); every other module and the entry scripts ask the kind object, never the name."""
    files = [*first_party_modules().values(), *sorted(REPO_ROOT.glob("*.py"))]
    found = {str(f.relative_to(REPO_ROOT)): lines for f in files
             if str(f.relative_to(REPO_ROOT)) not in KIND_REGISTRIES and (lines := kind_name_tests(f.read_text()))}
    assert found == {}, f"ask the kind (backend_kind / retriever_mode) instead of testing its name: {found}"


def test_entry_scripts_are_thin():
    """train.py and eval.py parse their arguments and call one typed function of the package: they define
    ``build_parser`` and ``main`` and nothing else, and import no first-party module but the CLI helpers, the
    command module that does the work (and, for train.py, the synthetic world it may train on)."""
    for script in ENTRY_SCRIPTS:
        tree = ast.parse((REPO_ROOT / script).read_text())
        defined = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        assert defined == ["build_parser", "main"], f"{script}: move {defined} into the package"
        first_party = sorted(n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
                             and n.module.split(".")[0] in PACKAGES)
        assert set(first_party) - {"searchr1_lld.cli", "searchr1_lld.world.training"} in (
            {"searchr1_lld.evaluation.command"}, {"searchr1_lld.learner.command"}), f"{script}: {first_party}"


MAX_LOOSE_ROOT_MODULES = 6


def test_the_package_root_holds_few_loose_modules():
    """A subsystem's modules sit in its folder; the package root keeps a few shared leaves (the CLI helpers, the
    distributed facts, the protocols, the reward)."""
    loose = sorted(f.name for f in (REPO_ROOT / "searchr1_lld").glob("*.py") if f.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_ROOT_MODULES, f"move into the folder each belongs to: {loose}"


# where the training engine's kind may be asked: its own package, the facts it is resolved from, and the preflight,
# which plans the memory of the launch it is handed (its DeepSpeed stage and buffers)
ENGINE_HOME = ("searchr1_lld/learner/engines/", "searchr1_lld/distributed.py", "searchr1_lld/preflight/")


def test_no_branch_on_the_training_engine_outside_it():
    import re

    asks = re.compile(r"\bis_deepspeed\(|\.zero_stage\b|\bzero_stage\(|\bdist\.deepspeed\b|\.distributed_type\b")
    found = []
    for f in (REPO_ROOT / "searchr1_lld").rglob("*.py"):
        rel = str(f.relative_to(REPO_ROOT))
        if rel.startswith(ENGINE_HOME):
            continue
        found += [f"{rel}:{i}" for i, line in enumerate(f.read_text().splitlines(), 1) if asks.search(line)]
    assert found == [], f"ask the training engine (learner/engines), not which kind it is: {found}"


def test_no_literal_list_of_a_registrys_names():
    """A kind with a registry (losses, estimators, gates, modes, backends, templates, ...) is named by str in the
    config and checked against the registry's keys; a ``Literal[...]`` copy of those names would drift from it."""
    from retriever.modes import MODES
    from searchr1_lld.algo import advantages, aggregation, kl, llds, policy_loss
    from searchr1_lld.algo.objective import LOSS_SCALES
    from searchr1_lld.data.prompts import TEMPLATES
    from searchr1_lld.rollout.backends.kinds import BACKEND_KINDS

    registries = {"policy losses": policy_loss.POLICY_LOSSES, "advantages": advantages.ADVANTAGE_ESTIMATORS,
                  "aggregations": aggregation.AGGREGATIONS, "KL estimators": kl.KL_ESTIMATORS,
                  "LLDS gates": llds.GATES, "answer-mask modes": llds.ANSWER_MASK_MODES,
                  "adaptive rules": llds.ADAPTIVE_RULES, "loss scales": LOSS_SCALES, "retriever modes": MODES,
                  "backend kinds": BACKEND_KINDS, "prompt templates": TEMPLATES}
    copies = []
    for f in (REPO_ROOT / "searchr1_lld" / "config").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
                names = {e.value for e in ast.walk(node.slice) if isinstance(e, ast.Constant)}
                copies += [f"{f.name}:{node.lineno} {sorted(names & set(reg))} of the {what}"
                           for what, reg in registries.items() if names & set(reg)]
    assert copies == [], f"read the registry's keys instead: {copies}"
