"""Sharded evaluation on one node: each shard's device and port, and eval.py --gpus N (CPU processes here, HF
backend) merging into the unsharded result; --wandb logs the results table (offline)."""

from __future__ import annotations

import json
import re

import pytest

from searchr1_lld import evaluation as ev
from searchr1_lld.distributed import free_ports
from searchr1_lld.evaluation import shards

from test_eval_e2e import _args, _cli


@pytest.mark.parametrize("shard, gpus, device, local_rank", [((0, 4), 2, "cuda:0", "0"), ((3, 4), 2, "cuda:1", "1"),
                                                             ((5, 8), 8, "cuda:5", "5"), ((1, 2), 0, "cpu", "0")])
def test_a_shard_takes_its_own_device(shard, gpus, device, local_rank):
    environ = {"RANK": "3", "WORLD_SIZE": "4"}  # a launcher's values: each shard's engine is a group of its own
    assert shards.prepare_shard_process(shard, environ, gpu_count=gpus) == device
    assert (environ["LOCAL_RANK"], environ["RANK"], environ["WORLD_SIZE"]) == (local_rank, "0", "1")
    assert environ["MASTER_ADDR"] == "127.0.0.1" and 0 < int(environ["MASTER_PORT"]) < 65536


def test_a_port_set_by_a_launcher_is_kept_and_free_ports_differ():
    env = shards.shard_env((1, 2), 2, {"MASTER_PORT": "29999", "MASTER_ADDR": "10.0.0.1"})
    assert "MASTER_PORT" not in env and "MASTER_ADDR" not in env
    ports = free_ports(8)
    assert len(set(ports)) == 8


def test_shard_command_drops_gpus_and_wandb():
    cmd = shards.shard_command(["--model", "m", "--gpus", "2", "--wandb", "--gpus=3", "--out", "o"], (1, 2), "eval.py")
    assert cmd[1:] == ["eval.py", "--model", "m", "--out", "o", "--shard", "1/2", "--no-progress"]


@pytest.mark.slow
def test_gpus_spawns_shards_and_merges_to_the_unsharded_result(tiny_world, tmp_path, monkeypatch):
    """Two CPU shard processes, each with its own port, one question per batch (so that batching cannot change a
    greedy token), give the same records and EM as one process; --wandb logs the merged table."""
    cli = _cli()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert cli.main(_args(tiny_world, tmp_path / "one", "--batch-size", "1")) == 0
    out = tmp_path / "two"
    assert cli.main(_args(tiny_world, out, "--batch-size", "1", "--gpus", "2", "--wandb")) == 0
    logs = [(out / f"shard-{i}-of-2.log").read_text() for i in range(2)]
    seen = [re.search(r"shard (\d)/2 on (\S+) \(LOCAL_RANK=(\d+), MASTER_PORT=(\d+)\)", log) for log in logs]
    assert all(seen), logs
    assert [m.group(1) for m in seen] == ["0", "1"] and {m.group(2) for m in seen} == {"cpu"}
    assert seen[0].group(4) != seen[1].group(4)  # two rendezvous ports
    assert [len(ev.read_records(out / f"trajectories.shard-{i}-of-2.jsonl")) for i in range(2)] == [2, 2]
    one, two = (json.loads((d / ev.RESULTS_JSON).read_text()) for d in (tmp_path / "one", out))
    assert two["datasets"] == one["datasets"]
    key = lambda r: r["id"]  # noqa: E731
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time")}  # noqa: E731
    assert ([strip(r) for r in sorted(ev.read_records(out / ev.TRAJECTORIES), key=key)]
            == [strip(r) for r in sorted(ev.read_records(tmp_path / "one" / ev.TRAJECTORIES), key=key)])
    # --wandb: the merged results as a wandb.Table in an offline run whose id is kept in --out
    from searchr1_lld.bookkeeping.tracking import WANDB_RUN_FILE, eval_table_rows

    run_id = json.loads((out / WANDB_RUN_FILE).read_text())["id"]
    tables = list((out / "wandb").glob(f"offline-run-*-{run_id}/files/media/table/eval/results_*.table.json"))
    assert len(tables) == 1
    logged = json.loads(tables[0].read_text())
    assert logged["columns"][:4] == ["name", "dataset", "n", "em"]
    assert logged["data"] == json.loads(json.dumps(eval_table_rows([(two["name"], two)])))


def test_gpus_refuses_shard_flags(tiny_world, tmp_path):
    assert _cli().main(_args(tiny_world, tmp_path, "--gpus", "2", "--shard", "0/2")) == 2


def test_a_failing_shard_stops_the_others_and_is_named(tmp_path):
    """run_shards with a stand-in script: shard 1 fails at once, shard 0 would run for a minute; the error names
    shard 1 and its last log line, and shard 0 is stopped instead of waited for."""
    import time

    script = tmp_path / "fake_eval.py"
    script.write_text("import sys, time\n"
                      "i = sys.argv[sys.argv.index('--shard') + 1].split('/')[0]\n"
                      "if i == '1':\n    print('boom: out of memory'); sys.exit(3)\n"
                      "time.sleep(60)\n")
    start = time.monotonic()
    with pytest.raises(ev.EvalError, match=r"shard 1/2 failed \(exit status 3\): boom: out of memory"):
        shards.run_shards(["--out", str(tmp_path)], 2, tmp_path, script, poll_s=0.1)
    assert time.monotonic() - start < 30
