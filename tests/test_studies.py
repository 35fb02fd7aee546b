"""Every committed study can be rebuilt from its docs: the world config and commit its docs name build the world its
results record (compared by the config's hash, nothing is built), and every committed file that records a world
belongs to a study of the table (searchr1_lab/studies.py); a registered report lists every commit that changed the
code that writes it, and the readings it added after a split was read."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import REPO_ROOT
from searchr1_lab.studies import (STUDIES, CommitUnavailable, Study, analysis_changes, current_command, current_path,
                                  earlier_paths, imported_files, late_readings, path_names, recorded_config,
                                  recorded_hashes, result_files, world_identity)


def _identity(study: Study) -> dict:
    try:
        return world_identity(study.world, study.commit)
    except CommitUnavailable as e:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True,
                                 text=True)
        if shallow.stdout.strip() == "true":
            pytest.skip(f"shallow clone: {e}")
        raise


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.name)
def test_the_world_a_studys_docs_name_builds_the_world_its_results_record(study: Study):
    identity = _identity(study)
    if study.recorded_config:
        assert identity["config"] == recorded_config(study), f"{study.world} at {study.commit} is another world"
        return
    recorded = recorded_hashes(study.results)
    if not result_files(study.results):  # a registered study before its first result lands
        pytest.skip(f"{study.name}: no result yet")
    assert recorded, f"{study.results} records no world hash"
    moved = {path: sorted(h) for path, h in recorded.items() if h != {identity['hash']}}
    assert not moved, (f"{study.world}{f' at commit {study.commit}' if study.commit else ''} builds world "
                       f"{identity['hash']}, but these results record another: {moved}")


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.name)
def test_a_studys_docs_give_the_command_that_builds_its_world(study: Study):
    text = re.sub(r"\s*\\\n\s*", " ", (REPO_ROOT / study.doc).read_text())  # continuation lines joined
    assert study.build in text, f"{study.doc} does not give {study.name}'s world command: {study.build}"
    assert f"--config {study.world} " in study.build + " "
    if study.commit:
        assert study.commit[:7] in text, f"{study.doc} does not name the commit {study.commit[:7]} of {study.name}"


def test_every_committed_result_that_records_a_world_belongs_to_a_study():
    listed = {p for s in STUDIES for p in result_files(s.results)}
    recording = recorded_hashes(("docs",))
    missing = sorted(path for path in recording if REPO_ROOT / path not in listed)
    assert not missing, f"add the studies of these results to searchr1_lab/studies.py: {missing}"


def test_the_check_catches_a_world_config_that_moved_on():
    """The comparison's world config builds another world today (held-out splits of 70, recipe 4): named without
    the commit its results came from, the check fails."""
    (comparison,) = [s for s in STUDIES if "docs/lab/summary.json" in s.results]
    today = world_identity(comparison.world)["hash"]
    assert {today} not in recorded_hashes(comparison.results).values()
    assert {_identity(comparison)["hash"]} == set().union(*recorded_hashes(comparison.results).values())


REGISTRATIONS = ("docs/lab/preregistration.json", "docs/lab/stepsize/registration.json",
                 "docs/lab/trustregion/registration.json")


@pytest.mark.parametrize("path", REGISTRATIONS)
def test_a_registrations_commands_and_files_are_found_where_they_live_today(path: str):
    """A registration keeps the commands and analysis files it was registered with: each command maps to one that
    runs today, and each analysis file is in the commit the registration pins."""
    import importlib.util

    block = json.loads((REPO_ROOT / path).read_text())["registration"]
    for key in ("analysis_command", "grid_command"):
        if key in block:
            module = current_command(block[key]).split()[2]
            assert module.startswith("searchr1_lab") and importlib.util.find_spec(module) is not None, block[key]
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO_ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone: run `git fetch --unshallow` to read the registered analysis commit")
    for file in block.get("analysis_code", []):
        found = subprocess.run(["git", "cat-file", "-e", f"{block['analysis_commit']}:{file}"], cwd=REPO_ROOT)
        assert found.returncode == 0, f"{file} is not in the registered analysis commit {block['analysis_commit']}"


def test_current_command_and_path_rename_the_moved_modules_only():
    assert current_command("python -m searchr1_lld.lab grid --jobs 2") == "python -m searchr1_lab grid --jobs 2"
    assert current_command("python -m searchr1_lld.demo --select-lr 1e-3") == "python -m searchr1_lab.demo --select-lr 1e-3"
    assert current_command("python -m searchr1_lld.world build") == "python -m searchr1_lld.world build"
    assert current_command("python -m searchr1_lld.labels") == "python -m searchr1_lld.labels"
    # the README's result blocks moved to the results page; another --readme target is left alone
    assert current_command("python -m searchr1_lld.lab stepsize-report --readme README.md") == (
        "python -m searchr1_lab stepsize-report --readme docs/lab/results.md")
    assert current_command("x --readme README.md.bak") == "x --readme README.md.bak"
    assert current_command("python -m searchr1_lab.demo --readme docs/README.md") == (
        "python -m searchr1_lab.demo --readme docs/README.md")
    assert current_path("searchr1_lld/lab/stepsize/survival.py") == "searchr1_lab/stats/survival.py"
    assert current_path("searchr1_lld/lab/stepsize/analysis.py") == "searchr1_lab/stepsize/analysis.py"
    assert current_path("searchr1_lld/sweep.py") == "searchr1_lab/sweep.py"
    assert current_path("searchr1_lld/algo/llds.py") == "searchr1_lld/algo/llds.py"


def test_earlier_paths_undo_every_move():
    assert earlier_paths("searchr1_lab/stepsize/report.py") == ["searchr1_lab/stepsize/report.py",
                                                                "searchr1_lld/lab/stepsize/report.py"]
    # followed through successive moves (a name that never existed, searchr1_lld/lab/registered/report.py, comes
    # along from the folder's move: git log finds nothing under it)
    assert {"searchr1_lab/registered/report.py", "searchr1_lab/stepsize/study_report.py",
            "searchr1_lld/lab/stepsize/study_report.py"} <= set(earlier_paths("searchr1_lab/registered/report.py"))
    assert set(earlier_paths("searchr1_lab/demo/command.py")) == {
        "searchr1_lab/demo/command.py", "searchr1_lld/demo.py", "searchr1_lld/lab/demo/command.py"}
    assert earlier_paths("searchr1_lld/algo/llds.py") == ["searchr1_lld/algo/llds.py"]
    for path in ("searchr1_lab/report.py", "searchr1_lab/demo/command.py"):
        assert path in map(current_path, earlier_paths(path))


def _write(root, files: dict) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_change_to_the_code_a_report_imports_is_listed(tmp_path, scratch_git):
    """The registered analysis file is not all that writes a report: a change to the formatter its report module
    imports (through another module, and before the formatter moved out of searchr1_lld/lab/) is listed too; a module
    it does not import is not; nor is a package's __init__ for its submodules' sake."""
    git = scratch_git
    _write(tmp_path, {"searchr1_lab/__init__.py": "from searchr1_lab.other import y\n",
                      "searchr1_lab/study/__init__.py": "",
                      "searchr1_lab/study/analysis.py": "x = 1\n",
                      "searchr1_lab/study/report.py": "from . import readings\nimport searchr1_lab.study.analysis\n",
                      "searchr1_lab/study/readings.py": "def f():\n    from ..fmt import line\n",
                      "searchr1_lab/other.py": "y = 1\n",
                      "searchr1_lld/lab/fmt.py": "def line(): pass\n"})
    git("add", ".")
    git("commit", "-q", "-m", "registered")
    block = {"analysis_commit": git("rev-parse", "HEAD").stdout.strip(),
             "analysis_code": ["searchr1_lab/study/analysis.py"]}
    for path, subject in (("searchr1_lld/lab/fmt.py", "the formatter before its move"),
                          ("searchr1_lab/other.py", "a module the report does not import"),
                          ("searchr1_lab/study/__init__.py", "the package's init")):
        _write(tmp_path, {path: f"z = '{subject}'\n"})
        git("commit", "-q", "-am", subject)
    git("mv", "searchr1_lld/lab/fmt.py", "searchr1_lab/fmt.py")
    git("commit", "-q", "-m", "the move")
    _write(tmp_path, {"searchr1_lab/fmt.py": "def line(): return 1\n"})
    git("commit", "-q", "-am", "the formatter after its move")
    assert imported_files("searchr1_lab.study.report", tmp_path) == [
        "searchr1_lab/fmt.py", "searchr1_lab/study/analysis.py", "searchr1_lab/study/readings.py",
        "searchr1_lab/study/report.py"]
    assert analysis_changes(block, tmp_path) == []  # the registered file alone never changed
    listed = [c["subject"] for c in analysis_changes(block, tmp_path, report_module="searchr1_lab.study.report")]
    assert listed == ["the formatter before its move", "the move", "the formatter after its move"]


def test_a_reading_added_after_a_split_was_read_is_marked_in_the_list(tmp_path):
    from searchr1_lab.report import analysis_change_lines

    assert late_readings({"report_dir": str(tmp_path)}) == {} and late_readings({}) == {}
    entry = {"added": "8ac3ab37b4b94b23e2d17be97f8d63bdcbba65a0", "split": "test",
             "read": "c8e8d5d2e88dbac8b6e595a844cca6ec847cdeee"}
    (tmp_path / "late_readings.json").write_text(json.dumps({"readings": {"baselines": entry}}))
    late = late_readings({"report_dir": str(tmp_path)})
    assert late == {"baselines": entry}
    lines = analysis_change_lines([{"commit": "1234567890", "subject": "a"}, {"commit": "8ac3ab37b4", "subject": "b"}],
                                  late)
    assert lines[2] == "- `1234567890` a"
    assert lines[3] == ("- `8ac3ab37b4` b (**added after the test split was read (in `8ac3ab37b4`; its scores first "
                        "shown in `c8e8d5d2e8`), not registered**)")
    (tmp_path / "late_readings.json").write_text(json.dumps({"readings": {"baselines": {"added": "8ac3ab37b4"}}}))
    with pytest.raises(ValueError, match="lacks \\['read', 'split'\\]"):
        late_readings({"report_dir": str(tmp_path)})


def test_a_registered_file_is_followed_through_every_move_and_into_the_files_its_functions_moved_to():
    assert path_names("searchr1_lld/lab/stepsize/survival.py") == [
        "searchr1_lld/lab/stepsize/survival.py", "searchr1_lab/stepsize/survival.py", "searchr1_lab/stats/survival.py"]
    assert path_names("searchr1_lld/lab/stepsize/alarms.py") == [
        "searchr1_lld/lab/stepsize/alarms.py", "searchr1_lab/stepsize/alarms.py", "searchr1_lab/stats/bootstrap.py"]
    assert path_names("searchr1_lld/lab/prereg/") == [  # a folder: the files split out of its files count too
        "searchr1_lld/lab/prereg/", "searchr1_lab/prereg/", "searchr1_lab/stats/proportions.py"]
    assert path_names("searchr1_lld/algo/llds.py") == ["searchr1_lld/algo/llds.py"]
