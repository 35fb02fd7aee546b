"""The lab's command line (searchr1_lab/cli.py): argparse subcommands, ``run`` the default, each other command
handed the arguments after its name, and ``--help`` listing every command and run's options."""

from __future__ import annotations

import re

import pytest

from searchr1_lab import cli


def test_help_lists_every_command_and_the_default_commands_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for name in ("run", "grid", "task", "report", "prereg-report", "stepsize-report", "step-kl-target", "lr-curve",
                 "frontier-report"):
        assert re.search(rf"^    {name}\b", text, re.M), name
    for flag in ("--quick", "--config", "--seeds", "--methods", "--runs-dir", "--report-only", "--extend-from"):
        assert flag in text, flag


def test_a_command_gets_the_arguments_after_its_name(monkeypatch):
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "grid", ("help", lambda rest: seen.append(("grid", rest)) or 3))
    monkeypatch.setitem(cli.COMMANDS, "report", ("help", lambda rest: seen.append(("report", rest)) or 0))
    assert cli.main(["grid", "--registration", "r.json", "--jobs", "2", "--slurm"]) == 3
    assert cli.main(["report", "--help"]) == 0  # the command's own parser prints its help
    assert seen == [("grid", ["--registration", "r.json", "--jobs", "2", "--slurm"]), ("report", ["--help"])]


def test_without_a_command_the_lab_runs_with_its_flags_and_overrides(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "run_lab", lambda **kw: calls.append(kw))
    assert cli.main(["--quick", "--seeds", "0,1", "trainer.lr=1e-3", "rollout.n=8"]) == 0
    assert cli.main(["run", "--config", "configs/lab/lab.yaml", "--sampled", "0"]) == 0
    quick, full = calls
    assert quick["config_path"].endswith("configs/lab/quick.yaml") and quick["seeds"] == [0, 1]
    assert quick["overrides"] == ["trainer.lr=1e-3", "rollout.n=8"] and quick["train_eval"] == cli.QUICK_TRAIN_EVAL
    assert quick["command"] == "python -m searchr1_lab --quick --seeds 0,1 trainer.lr=1e-3 rollout.n=8"
    assert full["config_path"] == "configs/lab/lab.yaml" and full["sampled"] == 0 and full["out_dir"] == "docs/lab"
    assert full["command"] == "python -m searchr1_lab --config configs/lab/lab.yaml --sampled 0"


def test_an_unknown_flag_of_the_lab_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(cli, "run_lab", lambda **kw: pytest.fail("must not run"))
    with pytest.raises(SystemExit) as done:
        cli.main(["--quick", "--no-such-flag"])
    assert done.value.code == 2 and "--no-such-flag" in capsys.readouterr().err
