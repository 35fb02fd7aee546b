"""A newcomer's mistakes get one actionable line (exit status 2), not a traceback; bugs keep their traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from searchr1_lld import cli
from searchr1_lld.evaluation import EvalError

from conftest import REPO_ROOT


def _run(*args, env=None, timeout=240):
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def _one_line_error(proc, prog):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr[-2000:]
    return lines[0]


def test_eval_missing_model_dir_is_one_clear_line(tiny_world, tmp_path):
    missing = "runs/no-such-run/checkpoints/step_000020/policy"
    proc = _run("eval.py", "--model", missing, "--datasets", f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", "--index", str(tiny_world / "index"),
                "--out", str(tmp_path / "e"), "--limit", "2", "--no-progress")
    line = _one_line_error(proc, "eval.py")
    assert f"--model: {missing} does not exist" in line and "Repo id" not in line
    # --debug: the same error with its traceback
    proc = _run("eval.py", "--model", missing, "--datasets", f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", "--index", str(tiny_world / "index"),
                "--out", str(tmp_path / "e"), "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "does not exist" in proc.stderr


def test_eval_compare_with_a_missing_checkpoint(tiny_world, tmp_path):
    proc = _run("eval.py", "--compare", f"warm={tiny_world / 'model'}", f"trained={tmp_path / 'nope' / 'policy'}",
                "--datasets", f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", "--index", str(tiny_world / "index"), "--out", str(tmp_path / "c"))
    assert "--compare trained:" in _one_line_error(proc, "eval.py")


def test_a_checkpoint_dir_instead_of_its_policy_is_pointed_out(tmp_path):
    (tmp_path / "step_000003" / "policy").mkdir(parents=True)
    (tmp_path / "step_000003" / "policy" / "config.json").write_text("{}")
    with pytest.raises(cli.UserError, match="did you mean .*step_000003/policy"):
        cli.check_model_source(str(tmp_path / "step_000003"), "--model")
    cli.check_model_source(str(tmp_path / "step_000003" / "policy"), "--model")  # fine
    cli.check_model_source("Qwen/Qwen2.5-3B", "--model")  # a hub id is left to from_pretrained
    (tmp_path / "tok").mkdir()
    with pytest.raises(cli.UserError, match="not a tokenizer directory"):
        cli.check_model_source(str(tmp_path / "tok"), "--tokenizer", tokenizer=True)
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    cli.check_model_source(str(tmp_path / "tok"), "--tokenizer", tokenizer=True)


def test_train_missing_model_path_fails_before_any_work(tmp_path):
    proc = _run("train.py", "model.path=./no/such/model", f"trainer.output_dir={tmp_path}", timeout=180)
    assert "model.path: ./no/such/model does not exist" in _one_line_error(proc, "train.py")
    assert not any(tmp_path.iterdir())  # nothing built, no run dir


def test_train_config_error_is_one_line(tmp_path):
    proc = _run("train.py", "trainer.no_such_key=1", timeout=180)
    assert "trainer.no_such_key" in _one_line_error(proc, "train.py")


def test_benchmark_offline_hint_names_the_eval_flag(tiny_world, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLASHRAG_LOCAL_DIR"}
    proc = subprocess.run([sys.executable, "eval.py", "--model", str(tiny_world / "model"), "--datasets", "bamboogle",
                           "--out", str(tmp_path / "e")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    line = _one_line_error(proc, "eval.py")
    assert "--flashrag-dir" in line


def test_bugs_keep_their_traceback():
    def buggy(argv):
        raise TypeError("a genuine bug")

    with pytest.raises(TypeError):
        cli.run_main(buggy, [], prog="x")

    def user_error(argv):
        raise EvalError("bad input")

    assert cli.run_main(user_error, [], prog="x") == 2
    with pytest.raises(EvalError):
        cli.run_main(user_error, ["--debug"], prog="x")


def test_eval_malformed_rows_files_are_one_line(tiny_world, tmp_path):
    """--datasets NAME=FILE and --data FILE: a file that is not JSON lines, or not parquet, names itself and the
    line, and no output is written."""
    common = ("--model", str(tiny_world / "model"), "--index", str(tiny_world / "index"), "--template", "tiny",
              "--no-progress")
    proc = _run("eval.py", *common, "--datasets", "synthetic=README.md", "--out", str(tmp_path / "a"))
    assert "README.md:1: not valid JSON" in _one_line_error(proc, "eval.py")
    (tmp_path / "test.parquet").write_text("not parquet\n")
    proc = _run("eval.py", *common, "--data", str(tmp_path / "test.parquet"), "--out", str(tmp_path / "b"))
    assert "test.parquet: not a readable parquet file" in _one_line_error(proc, "eval.py")
    (tmp_path / "lists.jsonl").write_text('["a question", "an answer"]\n')
    proc = _run("eval.py", *common, "--data", str(tmp_path / "lists.jsonl"), "--out", str(tmp_path / "c"))
    assert "lists.jsonl: row 1 is not a JSON object" in _one_line_error(proc, "eval.py")
    assert not any(tmp_path.glob("[abc]"))


def test_train_malformed_train_file_is_one_line(tiny_world, tmp_path):
    from conftest import world_args

    proc = _run("train.py", *world_args(tiny_world), "data.train_files=[README.md]",
                f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", timeout=180)
    assert "README.md:1: not valid JSON" in _one_line_error(proc, "train.py")
    assert not any(tmp_path.iterdir())  # no run dir


def test_demo_seeds_that_are_not_integers_are_one_line():
    proc = _run("-m", "searchr1_lab.demo", "--seeds", "abc", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ["config error: --seeds must be comma-separated integers, got 'abc'"]


def test_eval_with_a_retriever_url_nobody_answers_fails_in_seconds_and_leaves_nothing(tiny_world, tmp_path):
    """A mistyped --retriever-url (nothing listens there): one line naming the URL after retriever.first_contact_s
    (20 s), not after max_wait_s (300 s); no provenance of an evaluation that never started is left behind."""
    from conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    proc = _run("eval.py", "--model", str(tiny_world / "model"), "--template", "tiny", "--datasets",
                f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", "--retriever-url", url, "--limit", "2",
                "--no-progress", "--out", str(tmp_path / "e"))
    elapsed = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith(f"eval.py: error: RetrieverError: retriever at {url} never answered"), lines[-1]
    assert "retriever.first_contact_s=20" in lines[-1] and elapsed < 90
    assert all("not answering" in line for line in lines[:-1])  # one line per wait
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("flag, value, message", [("--limit", "-5", "--limit must be >= 0 (0 = all) (got -5)"),
                                                  ("--topk", "0", "--topk must be >= 1 (got 0)")])
def test_eval_count_flags_out_of_range_are_refused(tiny_world, tmp_path, flag, value, message):
    proc = _run("eval.py", "--model", str(tiny_world / "model"), "--index", str(tiny_world / "index"), "--datasets",
                f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", flag, value, "--out", str(tmp_path / "e"))
    assert message in _one_line_error(proc, "eval.py")
    assert not (tmp_path / "e").exists()
