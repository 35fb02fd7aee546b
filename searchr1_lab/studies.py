"""The committed studies and the world each ran on: what a reader needs to rebuild that world.

Every committed result names its world by a hash of the world's config and recipe version
(:func:`searchr1_lld.world.build.world_config_hash`), recorded as ``world_hash`` in a run's or a baseline's file,
``config_hash`` in a world card, or, for a study that ran before worlds were hashed, the world's whole config. A config
file can later build another world (a field added or changed, the recipe version bumped): :data:`STUDIES` names, for
each study, the world config and the commit whose code builds the recorded world from it (None: this checkout), the
command that builds it, and the document that gives that command. ``tests/test_studies.py`` checks each entry against
the results, and that every committed file recording a world belongs to one entry.

A world at another commit is identified by that commit's own code (:func:`world_identity`): its ``*.py`` files and
configs are read from git into a scratch directory and asked for the config's hash there, so nothing is built and the
working tree is not touched; the commit must be in this clone's history.

A registered study's report also says what changed after its registration: the commits that changed the code that
writes it (:func:`analysis_changes`: the registered analysis files and every module of the package its report
imports) and the readings it added after a held-out split had been read (:func:`late_readings`).
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Iterator, Mapping

from searchr1_lab.methods import REPO_ROOT
from searchr1_lld.world.build import world_config_hash
from searchr1_lld.world.config import load_world_config

# The experiments' modules before they moved out of the library into this package. A registration keeps the
# commands and analysis files it was registered with (changing it would void the runs'); today's are these.
MOVED_MODULES = {"searchr1_lld.lab": "searchr1_lab", "searchr1_lld.demo": "searchr1_lab.demo",
                 "searchr1_lld.sweep": "searchr1_lab.sweep"}
# Files and folders (ending in "/") that moved, oldest move first: a registered path is followed through each.
MOVED_PATHS = (("searchr1_lld/lab/", "searchr1_lab/"), ("searchr1_lld/demo.py", "searchr1_lab/demo/command.py"),
               ("searchr1_lld/sweep.py", "searchr1_lab/sweep.py"),
               ("searchr1_lab/stepsize/survival.py", "searchr1_lab/stats/survival.py"),
               ("searchr1_lab/stepsize/smallsample.py", "searchr1_lab/stats/smallsample.py"),
               ("searchr1_lab/intervals.py", "searchr1_lab/stats/bootstrap.py"),
               ("searchr1_lab/stepsize/registration.py", "searchr1_lab/registered/registration.py"),
               ("searchr1_lab/stepsize/study_report.py", "searchr1_lab/registered/report.py"))
# Files some of whose functions moved into another file (file -> that file): the registered code lives in both since.
SPLIT_PATHS = {"searchr1_lab/prereg/detection.py": "searchr1_lab/stats/proportions.py",
               "searchr1_lab/stepsize/alarms.py": "searchr1_lab/stats/bootstrap.py"}
# The page that holds the studies' generated result blocks (the README holds the findings table that summarises them);
# registrations name the README, where the blocks were when they were registered.
RESULTS_PAGE = "docs/lab/results.md"
MOVED_ARGUMENTS = {"--readme README.md": f"--readme {RESULTS_PAGE}"}


def current_command(command: str) -> str:
    """``command`` as registered (e.g. ``python -m searchr1_lld.lab stepsize-report --readme README.md``) -> the
    command that runs it today (``python -m searchr1_lab stepsize-report --readme docs/lab/results.md``); a command of
    today is returned as is."""
    command = re.sub(r"\b(" + "|".join(re.escape(m) for m in MOVED_MODULES) + r")\b",
                     lambda m: MOVED_MODULES[m.group(1)], command)
    for old, new in MOVED_ARGUMENTS.items():
        command = re.sub(re.escape(old) + r"(?![\w./-])", new, command)
    return command


def _moved_names(path: str) -> list[str]:
    """``path``, then its name after each move of :data:`MOVED_PATHS` that applies, oldest first."""
    names = [path]
    for old, new in MOVED_PATHS:
        if names[-1].startswith(old):
            names.append(new + names[-1][len(old):])
    return names


def current_path(path: str) -> str:
    """A registered repository path (``searchr1_lld/lab/stepsize/analysis.py``) -> where that file lives today."""
    return _moved_names(path)[-1]


def path_names(path: str) -> list[str]:
    """Every name a registered repository path has had, oldest first (``searchr1_lld/lab/stepsize/survival.py``,
    ``searchr1_lab/stepsize/survival.py``, ``searchr1_lab/stats/survival.py``), then the files that functions of one
    of these files, or of a folder among them, moved into (:data:`SPLIT_PATHS`)."""
    names = _moved_names(path)
    split = [part for file, part in SPLIT_PATHS.items()
             if any(file == name or (name.endswith("/") and file.startswith(name)) for name in names)]
    return list(dict.fromkeys([*names, *split]))


def earlier_paths(path: str) -> list[str]:
    """A repository path of today -> it and every place it had before a move of :data:`MOVED_PATHS` (the inverse of
    :func:`current_path`, followed through successive moves): ``searchr1_lab/report.py`` ->
    ``[searchr1_lab/report.py, searchr1_lld/lab/report.py]``."""
    out, todo = [], [path]
    while todo:
        here = todo.pop()
        if here not in out:
            out.append(here)
            todo += [old + here[len(new):] for old, new in MOVED_PATHS if here.startswith(new)]
    return out


# What a result records of its world: the hash (runs, baselines, the demo's files) or a card's own hash.
HASH_KEYS = ("world_hash", "config_hash")


@dataclass(frozen=True)
class Study:
    """One committed study: ``results`` (files or directories of JSON / gzipped JSON files, repository-relative)
    record the world it ran on; ``world`` is the world config that builds it, with the code of ``commit`` (None:
    this checkout); ``build``: the command that builds it, given in ``doc``. ``recorded_config``: for a study whose
    results record the world's config instead of a hash, the JSON path (keys) to that config in ``results``."""

    name: str
    results: tuple[str, ...]
    world: str
    build: str
    doc: str
    commit: str | None = None
    recorded_config: tuple[str, ...] = ()


def _card(name: str) -> Study:
    """A warm-start build whose card is committed (docs/lab/warm-start/NAME.json): the build command is its config's
    own ``# Build:`` line."""
    return Study(f"warm start {name}", (f"docs/lab/warm-start/{name}.json",), f"configs/world/{name}.yaml",
                 f"python -m searchr1_lld.world build --config configs/world/{name}.yaml --out .cache/world-{name}",
                 f"configs/world/{name}.yaml")


COMPARISON_COMMIT = "c7727291dbeed96e73e0062d72f9c3528796d423"  # the code the comparison's runs and world came from
SMOLLM2_COMMIT = "cefae78fde65dc4a1419f6c6b98bb537d8abaca7"  # the SmolLM2 runs', on the default world of the time

STUDIES = (
    Study("the comparison", ("docs/lab/runs", "docs/lab/summary.json"), "configs/world/large-quoted.yaml",
          "PYTHONPATH=$PWD python -m searchr1_lld.world build --config configs/world/large-quoted.yaml "
          "--out .cache/lab-world-c1823703dda8", "docs/lab.md", commit=COMPARISON_COMMIT),
    Study("the pre-registered comparison", ("docs/lab/prereg/runs",), "configs/world/registered.yaml",
          "python -m searchr1_lld.world build --config configs/world/registered.yaml "
          "--out .cache/lab-world-73b546bd45b1", "docs/lab.md"),
    *(Study(name, (results,), "configs/world/balanced-seed2.yaml",
            "python -m searchr1_lld.world build --config configs/world/balanced-seed2.yaml "
            "--out .cache/lab-world-2eabc7e23c51", "docs/lab.md")
      for name, results in (("the step-size study", "docs/lab/stepsize/runs"),
                            ("the step-size pilot", "docs/lab/stepsize/pilot"),
                            ("the trust-region study", "docs/lab/trustregion/runs"),
                            ("the learning-stability frontier", "docs/lab/frontier/runs"))),
    Study("the demo", ("docs/demo",), "configs/world/default.yaml",
          "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world", "README.md"),
    Study("the demo's protocol on world seed 1", ("docs/lab/balanced-seed1",), "configs/world/balanced-seed1.yaml",
          "python -m searchr1_lld.world build --config configs/world/balanced-seed1.yaml "
          "--out .cache/world-balanced-seed1", "docs/lab.md"),
    Study("SmolLM2-135M-Instruct", ("docs/lab/smollm2/summary.json",), "configs/world/default.yaml",
          "PYTHONPATH=$PWD python -m data.build_world --config configs/world/default.yaml --out .cache/world",
          "docs/lab.md", commit=SMOLLM2_COMMIT, recorded_config=("world", "config")),
    Study("the death-spiral calibration on the default world", ("docs/lab/spiral/calibration/default/runs",),
          "configs/world/default.yaml",
          "python -m searchr1_lld.world build --config configs/world/default.yaml --out .cache/world",
          "docs/lab/spiral/calibration.md"),
    Study("the death-spiral calibration on the harder task",
          ("docs/lab/spiral/calibration/hard/runs", "docs/lab/spiral/calibration/hard-more/runs"),
          "configs/world/spiral-hard.yaml",
          "python -m searchr1_lld.world build --config configs/world/spiral-hard.yaml "
          "--out .cache/lab-world-5fb4c383877d", "docs/lab/spiral/calibration.md"),
    *(_card(name) for name in ("registered", "repeat-phase", "practice", "balanced", "balanced-seed1",
                               "balanced-seed2", "spiral-hard")),
)


def _read(path: Path) -> Any:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text())


def result_files(results: tuple[str, ...]) -> list[Path]:
    """The JSON and gzipped JSON files of ``results`` (files, or directories searched recursively)."""
    out = []
    for name in results:
        path = REPO_ROOT / name
        out += [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                   if p.is_file() and p.name.endswith((".json", ".json.gz")))
    return out


def _hashes(obj: Any) -> Iterator[str]:
    """Every value of a :data:`HASH_KEYS` key anywhere in ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in HASH_KEYS and isinstance(value, str):
                yield value
            else:
                yield from _hashes(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _hashes(value)


def recorded_hashes(results: tuple[str, ...]) -> dict[str, set[str]]:
    """Repository-relative file -> the world hashes it records, for each file of ``results`` that records one."""
    out = {}
    for path in result_files(results):
        found = set(_hashes(_read(path)))
        if found:
            out[str(path.relative_to(REPO_ROOT))] = found
    return out


def recorded_config(study: Study) -> dict[str, Any]:
    """The world config ``study``'s results record (:attr:`Study.recorded_config`)."""
    (path,) = result_files(study.results)
    obj = _read(path)
    for key in study.recorded_config:
        obj = obj[key]
    return obj


# Run by the interpreter inside a commit's code: the world config's identity there. Before the world had its own
# package (searchr1_lld.world), its config lived in searchr1_lld.config and worlds were not hashed by their config.
_IDENTITY_SCRIPT = """
import dataclasses, json, sys
try:
    from searchr1_lld.world.config import load_world_config
    from searchr1_lld.world.build import world_config_hash
except ImportError:
    from searchr1_lld.config import load_world_config
    world_config_hash = None
cfg = load_world_config(sys.argv[1])
print(json.dumps({"hash": world_config_hash(cfg) if world_config_hash else None, "config": dataclasses.asdict(cfg)}))
"""


class CommitUnavailable(RuntimeError):
    """The commit a study's world needs is not in this clone (a shallow clone, or no git)."""


def _extract(commit: str, into: Path) -> None:
    """The ``*.py`` files and ``configs/`` of ``commit`` into ``into`` (``git archive``: the working tree untouched)."""
    out = subprocess.run(["git", "archive", "--format=tar", commit, "--", "*.py", "configs"], cwd=REPO_ROOT,
                         capture_output=True)
    if out.returncode != 0:
        raise CommitUnavailable(f"commit {commit} is not in this clone's history ({out.stderr.decode().strip()}): "
                                "`git fetch --unshallow` fetches it")
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(into, filter="data")


def world_identity(world: str, commit: str | None = None) -> dict[str, Any]:
    """``{"hash": ..., "config": ...}`` of the world config ``world`` (repository-relative) as the code of ``commit``
    reads it (None: this checkout, in this process). ``hash`` is None for a commit from before worlds were hashed."""
    if commit is None:
        cfg = load_world_config(world)
        return {"hash": world_config_hash(cfg), "config": dataclasses.asdict(cfg)}
    with tempfile.TemporaryDirectory(prefix="world-at-commit-") as tmp:
        _extract(commit, Path(tmp))
        out = subprocess.run([sys.executable, "-c", _IDENTITY_SCRIPT, world], cwd=tmp, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": tmp}, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"the code of commit {commit} could not read {world}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _module_file(repo: Path, module: str) -> str | None:
    """The repository-relative file of ``module`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``), None if neither."""
    base = module.replace(".", "/")
    return next((f for f in (f"{base}.py", f"{base}/__init__.py") if (repo / f).is_file()), None)


def _imported_modules(root: Path, path: str, module: str) -> set[str]:
    """The modules with a file under ``root`` that the source of ``module`` (at ``path``) imports, anywhere in it (a
    function's imports too): ``import a.b`` -> ``a.b``; ``from a import b`` -> ``a.b`` where that is a module, else
    ``a``; relative imports resolved against ``module``."""
    here = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse((root / path).read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])])
                    if node.level else node.module)
            out |= {f"{base}.{a.name}" if _module_file(root, f"{base}.{a.name}") else base for a in node.names}
    return {name for name in out if _module_file(root, name)}


def imported_files(module: str, repo: str | Path = REPO_ROOT, package: str = "searchr1_lab") -> list[str]:
    """The repository-relative files of ``module`` and of every module of ``package`` it imports, directly or
    through each other, read from the source in ``repo`` (nothing is imported; a package's ``__init__.py`` counts
    only where a module imports the package itself, not for each of its submodules). Sorted."""
    root, seen, todo = Path(repo), set(), [module]
    while todo:
        name = todo.pop()
        path = _module_file(root, name)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo += [n for n in _imported_modules(root, path, name) if n == package or n.startswith(package + ".")]
    return sorted(seen)


def analysis_changes(block: Mapping[str, Any], repo: str | Path = REPO_ROOT,
                     report_module: str | None = None) -> list[dict[str, str]] | None:
    """The commits since a registration's ``analysis_commit`` that changed the code that writes its report, oldest
    first, each ``{"commit": short hash, "subject": ...}``: its ``analysis_code`` (at every name its files have had and in the
    files their functions moved into, :func:`path_names`) and, with ``report_module``, every file :func:`imported_files` finds for that
    module (at its places today and before any move, :func:`earlier_paths`): the formatters and readings a report
    prints change its text as much as the registered analysis does. None for a registration that records no analysis
    commit (a hand-made one). A report lists them so that a reader sees every change made to what it prints after
    its runs began. Raises when the commit is not in this clone's history (a shallow clone): the list would silently
    be empty."""
    commit = block.get("analysis_commit")
    if not commit:
        return None
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, capture_output=True)
    if known.returncode != 0:
        raise RuntimeError(f"analysis commit {commit} is not in the history of {repo} (a shallow clone?): the changes "
                           "to the registered analysis cannot be listed")
    registered = block.get("analysis_code", [])
    reporting = imported_files(report_module, repo) if report_module else []
    # a moved file: its commits under every name
    paths = sorted({*(name for path in registered for name in path_names(path)),
                    *(p for f in reporting for p in earlier_paths(f))})
    log = subprocess.run(["git", "log", "--no-merges", "--reverse", "--format=%h%x09%s", "--abbrev=10",
                          f"{commit}..HEAD", "--", *paths], cwd=repo, capture_output=True, text=True, check=True)
    return [dict(zip(("commit", "subject"), line.split("\t", 1))) for line in log.stdout.splitlines() if line]


LATE_READINGS_FILE = "late_readings.json"  # beside a study's report: the readings added after a split was read


def late_readings(block: Mapping[str, Any], repo: str | Path = REPO_ROOT) -> dict[str, dict[str, str]]:
    """The readings a registered study's report added after one of its held-out splits had been read, from
    ``<report_dir>/late_readings.json`` (``{}`` without one): reading name (the report's key for it) ->
    ``{"added": the commit that added it, "split": the split, "read": the commit whose report first showed that
    split's scores}``. A report labels each such reading where it prints it and in its list of analysis changes: it
    was chosen knowing the split's results."""
    path = Path(repo) / block.get("report_dir", "") / LATE_READINGS_FILE
    if not block.get("report_dir") or not path.is_file():
        return {}
    readings = json.loads(path.read_text())["readings"]
    for name, entry in readings.items():
        missing = {"added", "split", "read"} - set(entry)
        if missing:
            raise ValueError(f"{path}: reading {name!r} lacks {sorted(missing)}")
    return readings
