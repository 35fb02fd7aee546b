"""Ctrl-C (SIGINT) prints one line and leaves nothing half-built that a rerun would trust: the retriever service, the
world build and the lab, each as a user starts it."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, TEST_WORLD_CONFIG

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _start(*args: str) -> subprocess.Popen:
    """The command as a user's terminal starts it: SIGINT at its default action, which Python turns into
    KeyboardInterrupt (a suite run in the background, as CI may run it, inherits SIGINT ignored, and Python keeps an
    ignored SIGINT ignored)."""
    return subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt(proc: subprocess.Popen) -> tuple[str, list[str]]:
    """SIGINT (what Ctrl-C sends) to ``proc``; its stdout and its stderr's lines (progress bars' redraws split off)."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return out, [line for line in err.replace("\r", "\n").splitlines() if line.strip()]


def _wait_for(what, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_ctrl_c_stops_the_retriever_service_with_one_line(tiny_world):
    proc = _start("-m", "retriever", "serve", "--index", str(tiny_world / "index"), "--port", "0")
    assert "retriever ready on http://127.0.0.1:" in proc.stdout.readline() + proc.stdout.readline()
    _, err = _interrupt(proc)
    assert err == ["python -m retriever serve: interrupted"]


@pytest.mark.parametrize("entry", ["searchr1_lld.world", "searchr1_lab"])
def test_ctrl_c_during_a_world_build_is_one_line_and_leaves_no_half_built_world(entry, tmp_path):
    """Interrupted once the world's files are written (its index, tokenizer and policy still to come): the build
    removes what it wrote, so the next run builds it anew."""
    world = tmp_path / "world"
    if entry == "searchr1_lld.world":
        config = tmp_path / "world.yaml"  # the test world, built anew in a dir of its own
        config.write_text(yaml.safe_dump(dataclasses.asdict(TEST_WORLD_CONFIG)))
        proc = _start("-m", "searchr1_lld.world", "build", "--config", str(config), "--out", str(world), "--quiet")
    else:
        proc = _start("-m", "searchr1_lab", "--quick", "--world-dir", str(world), "--runs-dir",
                      str(tmp_path / "runs"), "--out", str(tmp_path / "report"))
    _wait_for(lambda: (world / "qa" / "test.jsonl").is_file(), proc)
    _, err = _interrupt(proc)
    assert err[-1] == f"python -m {entry}: interrupted"
    assert all(line.startswith("build world:") for line in err[:-1]), err  # its progress bar, if any
    assert not world.exists() or not any(world.iterdir())
    assert not (tmp_path / "runs").exists() and not (tmp_path / "report").exists()


def test_a_ctrl_c_whose_interrupt_python_dropped_stops_the_world_build_at_its_next_stage(capsys):
    """Python drops a KeyboardInterrupt raised inside a callback of its own (an import lock's): run_main records the
    Ctrl-C, and the world build's next stage boundary raises it again."""
    from tqdm import tqdm

    from searchr1_lld import cli
    from searchr1_lld.world.build import _Stages

    entered = []

    def main(argv):
        try:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C ...
        except KeyboardInterrupt:
            pass  # ... whose KeyboardInterrupt is lost, as in an import lock's callback
        stages = _Stages(tqdm(total=2, disable=True))
        with stages.stage("world", "world"):
            entered.append("world")
        return 0

    assert cli.run_main(main, [], prog="build") == 130
    assert entered == [] and capsys.readouterr().err == "build: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    assert cli.run_main(lambda argv: 0, [], prog="build") == 0  # a later run starts without the old Ctrl-C
