"""Slurm: the sweeps' and the grid's job arrays (searchr1_lab/slurm.py) and the multi-node training script
(scripts/slurm/train_multinode.sbatch), on a real one-node cluster (tests/slurm_cluster.py: Debian's slurm-wlm,
started here as root): a 2-task array of tiny runs, each with its own retriever service, completes; a task cancelled
mid-run and submitted again resumes from its checkpoint; the training script runs 2 ranks over gloo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, free_port, world_args
from searchr1_lab import slurm, sweep
from searchr1_lld.config import ConfigError
from slurm_cluster import slurm_cluster  # noqa: F401  (the fixture)

TINY = REPO_ROOT / "configs" / "tiny.yaml"
# a run of a few seconds a step on the tiny test world
SMALL = ["trainer.train_batch_size=2", "trainer.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_turns=1",
         "rollout.max_tokens_per_turn=16", "rollout.max_obs_length=60", "trainer.micro_batch_token_budget=400",
         "logging.progress_bar=false", "logging.plot_every=0", "trainer.probe_every=0", "trainer.eval_limit=2",
         "trainer.device=cpu"]


def test_the_cluster_is_skipped_with_one_line_where_it_cannot_start(monkeypatch):
    import slurm_cluster as cluster

    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    assert cluster.why_not() == "the Slurm tests start munged, slurmctld and slurmd as root; not root here"
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster.shutil, "which", lambda b: None if b in ("slurmd", "sbatch") else f"/usr/bin/{b}")
    assert cluster.why_not() == "Slurm is not installed (slurmd, sbatch missing): apt-get install slurm-wlm munge"


def test_array_indices_and_the_script():
    assert slurm.index_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert slurm.index_ranges([3]) == "3" and slurm.index_ranges([]) == ""


def test_the_array_files_name_each_task_its_done_file_and_the_options(tmp_path):
    from searchr1_lab.driver import Task

    tasks = [Task("a", ["python", "-c", "pass"], tmp_path / "a.done"),
             Task("b", ["python", "-c", "pass"], tmp_path / "b.done", after=("a",))]
    settings = slurm.ArraySettings(("--partition=gpu", "--time=1:00:00"), retriever_url="http://node0:8000")
    script = slurm.write_array(tasks, tmp_path / "slurm", "sweep-x", settings, cwd=tmp_path, then={"a": ["report"]})
    text = script.read_text()
    for line in ("#SBATCH --job-name=sweep-x", "#SBATCH --array=0-1", "#SBATCH --partition=gpu",
                 "#SBATCH --time=1:00:00", f"#SBATCH --output={tmp_path / 'slurm' / 'logs'}/%a.log",
                 "#SBATCH --open-mode=append"):
        assert line in text.splitlines(), line
    assert text.rstrip().endswith('"$SLURM_ARRAY_TASK_ID"') and os.access(script, os.X_OK)
    record = slurm.read_tasks(tmp_path / "slurm" / "tasks.json")
    assert record["env"] == {"SEARCHR1_RETRIEVER_URL": "http://node0:8000"} and record["retriever_index"] is None
    assert [(t["name"], t["done"], t["after"], t["then"]) for t in record["tasks"]] == [
        ("a", str(tmp_path / "a.done"), [], ["report"]), ("b", str(tmp_path / "b.done"), ["a"], None)]
    assert slurm.run_task(tmp_path / "slurm" / "tasks.json", 1) == 1  # a is not done: b does not start
    assert not (tmp_path / "b.done").exists()
    (tmp_path / "a.done").write_text("")
    assert slurm.run_task(tmp_path / "slurm" / "tasks.json", 0) == 0  # done earlier: nothing runs


def test_slurm_options_are_refused_without_slurm_and_retrievers_need_http_runs(tmp_path, capsys):
    base = ["expand", "--base", str(TINY), "--grid", "algorithm.llds.lam=0,0.2"]
    assert sweep.main([*base, "--submit"]) == 2
    assert "--submit: options of --slurm; add --slurm" in capsys.readouterr().err
    assert sweep.main([*base, "--slurm", "--retriever-url", "http://node0:8000", "--out", str(tmp_path)]) == 2
    assert "tiny-lam=0, tiny-lam=0.2 use retriever.mode=inprocess" in capsys.readouterr().err
    assert sweep.main([*base, "--slurm", "--retriever-url", "node0:8000", "--out", str(tmp_path)]) == 2
    assert "must start with http://" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="one or the other"):
        slurm.ArraySettings.from_args(type("A", (), {"retriever_url": "http://x", "retriever_index": "i",
                                                     "sbatch": None})())


def test_the_registered_grid_as_an_array_names_its_tasks_and_report(tmp_path, capsys):
    """``grid --registration ... --slurm`` (not submitted): one array task per registered cell and the baselines,
    done when its committed compact result exists (every one of this study's), each followed by the study's report
    command; --commit and --fresh are refused with it."""
    from searchr1_lab.cli import main as lab_main
    from searchr1_lab.grid import registered_tasks
    from searchr1_lab.registered.registration import load_registration

    registration = REPO_ROOT / "docs" / "lab" / "stepsize" / "registration.json"
    argv = ["grid", "--registration", str(registration), "--runs-dir", str(tmp_path / "train"), "--slurm"]
    assert lab_main(argv) == 0
    tasks = registered_tasks(registration, load_registration(str(registration)))
    assert f"{len(tasks)} task(s), {len(tasks)} done earlier" in capsys.readouterr().out
    record = slurm.read_tasks(tmp_path / "train" / "slurm" / "tasks.json")
    assert [t["name"] for t in record["tasks"]] == [t.name for t in tasks]
    assert [t["done"] for t in record["tasks"]] == [str(t.done.resolve()) for t in tasks]
    (then,) = {tuple(t["then"]) for t in record["tasks"]}
    assert then[1:5] == ("-m", "searchr1_lab", "stepsize-report", "--registration")
    assert lab_main([*argv, "--commit"]) == 2 and lab_main([*argv, "--fresh", str(tmp_path / "f")]) == 2
    assert lab_main(argv[:-1] + ["--submit"]) == 2
    assert "--submit: options of --slurm" in capsys.readouterr().err


@pytest.mark.slow
def test_tasks_that_wait_for_others_are_submitted_after_them(slurm_cluster, tmp_path, capsys):
    """Three tasks, the third waiting for the first two (as the demo's final run waits for its selection runs):
    the first two as one array job, the third with --dependency=afterok on their array tasks; each task's follow-up
    runs once it is done. Submitted again, nothing is."""
    from searchr1_lab.driver import Task

    def writes(name: str) -> list[str]:
        return [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(tmp_path / name)!r}).write_text("
                                      f"str(time.time()))"]

    tasks = [Task("a", writes("a.done"), tmp_path / "a.done"), Task("b", writes("b.done"), tmp_path / "b.done"),
             Task("c", writes("c.done"), tmp_path / "c.done", after=("a", "b"))]
    then = {"a": [sys.executable, "-c", f"open({str(tmp_path / 'then.txt')!r}, 'a').write('a')"]}
    assert slurm.write_and_submit(tasks, tmp_path / "slurm", "waits", slurm.ArraySettings(("--cpus-per-task=1",)),
                                  True, cwd=tmp_path, then=then) == 0
    first, second = re.findall(r"submitted job (\d+): array tasks (\S+)", capsys.readouterr().out)
    assert first[1] == "0-1" and second[1] == "2"
    slurm_cluster.wait_idle(300)
    done = {name: float((tmp_path / f"{name}.done").read_text()) for name in "abc"}
    assert done["c"] > max(done["a"], done["b"])
    assert (tmp_path / "then.txt").read_text() == "a"
    assert slurm.submit(tmp_path / "slurm" / slurm.SCRIPT_FILE) == []


def _expand(out: Path, runs: Path, world: Path, grid: str, *extra: str) -> list[str]:
    return ["expand", "--base", str(TINY), "--grid", grid, "--slurm", "--submit", "--out", str(out),
            "--sbatch=--cpus-per-task=1", *extra, "--set", *SMALL, f"trainer.output_dir={runs}",
            *world_args(world)]


@pytest.mark.slow
def test_a_two_task_array_of_tiny_runs_completes_each_with_its_retriever(slurm_cluster, tiny_world, tmp_path,
                                                                        capsys):
    """Two 1-step runs, one per array task, each asking a retriever service its task started on the world's index;
    the same command again submits nothing; the printed collect command makes the table."""
    out, runs = tmp_path / "sweep", tmp_path / "runs"
    argv = _expand(out, runs, tiny_world, "algorithm.llds.lam=0,0.2", "--retriever-index", str(tiny_world / "index"))
    argv += ["trainer.total_steps=1", "trainer.save_every=0", "retriever.mode=http"]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out
    (job,) = re.findall(r"submitted job (\d+): array tasks 0-1", printed)
    slurm_cluster.wait_idle(600)
    for index, name in enumerate(["tiny-lam=0", "tiny-lam=0.2"]):
        marker = runs / name / sweep.SWEEP_MARKER
        log = (out / "slurm" / "logs" / f"{index}.log").read_text()
        assert marker.is_file(), log[-3000:]
        assert f"[slurm] task {index} ({name}) on {slurm_cluster.node}, 1 thread(s)" in log
        assert "[slurm] retriever: serving" in log and f"[slurm] task {index} ({name}): done" in log
        assert json.loads(marker.read_text())["name"] == name
    assert sweep.main(argv) == 0  # everything done: nothing submitted again
    again = capsys.readouterr().out
    assert "2 task(s), 2 done earlier" in again and "every task is done: nothing submitted" in again
    (collect,) = re.findall(r"once the array has finished: python -m searchr1_lab\.sweep (collect .*)", again)
    assert sweep.main(collect.split()) == 0
    assert [r["run"] for r in json.loads((out / "sweep.json").read_text())] == ["tiny-lam=0", "tiny-lam=0.2"]
    submitted = (out / "slurm" / "submitted.txt").read_text().splitlines()
    assert submitted == [f"{job}\t0-1"]


@pytest.mark.slow
def test_a_cancelled_task_submitted_again_resumes_from_its_checkpoint(slurm_cluster, tiny_world, tmp_path, capsys):
    out, runs = tmp_path / "sweep", tmp_path / "runs"
    argv = _expand(out, runs, tiny_world, "algorithm.llds.lam=0.2")
    argv += ["trainer.total_steps=6", "trainer.save_every=1", "trainer.keep_last_k=10", "trainer.resume=auto"]
    assert sweep.main(argv) == 0
    (job,) = re.findall(r"submitted job (\d+)", capsys.readouterr().out)
    checkpoints = runs / "tiny-lam=0.2" / "checkpoints"
    deadline = time.monotonic() + 600
    while not (checkpoints / "step_000002").is_dir():
        assert time.monotonic() < deadline and slurm_cluster.jobs(), (out / "slurm" / "logs" / "0.log").read_text()
        time.sleep(0.2)
    slurm_cluster.run("scancel", job)
    slurm_cluster.wait_idle(120)
    marker = runs / "tiny-lam=0.2" / sweep.SWEEP_MARKER
    assert not marker.exists()  # cut off: not finished
    saved = max(int(p.name.split("_")[1]) for p in checkpoints.glob("step_*"))
    assert 2 <= saved < 6
    assert sweep.main(argv) == 0  # the same command: the unfinished task is submitted again
    assert "1 task(s), 0 done earlier" in capsys.readouterr().out
    slurm_cluster.wait_idle(600)
    log = (out / "slurm" / "logs" / "0.log").read_text()
    assert marker.is_file(), log[-3000:]
    resumed = [int(k) for k in re.findall(r"resumed from \S+step_0*(\d+) at step (\d+)", log) for k in k[:1]]
    assert resumed == [saved], log[-3000:]
    steps = [json.loads(line)["step"] for line in (runs / "tiny-lam=0.2" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))  # each step once: the second pass trained saved+1 .. 6
    assert log.count("[slurm] task 0 (tiny-lam=0.2) on") == 2


@pytest.mark.slow
def test_the_multinode_script_trains_two_ranks_over_gloo(slurm_cluster, tiny_world, tmp_path):
    """scripts/slurm/train_multinode.sbatch on one node with the 2-process CPU config: srun starts one task, whose
    accelerate launch starts 2 ranks (gloo) with machine rank SLURM_NODEID and the job's first host as the main
    address; they train one step together (each rank's state in its checkpoint)."""
    log = tmp_path / "train.log"
    env = {**slurm_cluster.env, "ACCELERATE_CONFIG": "configs/accelerate/cpu_2proc_ddp.yaml", "PROCS_PER_NODE": "2",
           "MAIN_PROCESS_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=2", f"--output={log}",
         "scripts/slurm/train_multinode.sbatch", "--config", "configs/tiny.yaml", *SMALL, "trainer.total_steps=1",
         "trainer.save_every=1", "trainer.resume=never", f"trainer.output_dir={tmp_path / 'runs'}",
         "trainer.run_name=two-ranks", *world_args(tiny_world)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    slurm_cluster.wait_idle(600)
    text = log.read_text()
    assert f"1 node(s) x 2 process(es), main process on {slurm_cluster.node}:" in text, text[-3000:]
    assert f"[slurm] node 0 ({slurm_cluster.node}): accelerate launch, machine rank 0" in text
    state = slurm_cluster.run("scontrol", "show", "job", submitted.stdout.strip())
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, text[-4000:]
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "two-ranks" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    checkpoint = tmp_path / "runs" / "two-ranks" / "checkpoints" / "step_000001"  # each rank saved its RNG state
    assert sorted(p.name for p in checkpoint.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
