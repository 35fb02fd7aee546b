"""The in-process dense retriever beside a ZeRO-3 learner: 2 CPU processes under `accelerate launch` with the shipped
configs/accelerate/cpu_2proc_zero3.yaml (tests/zero3_dense_run.py). Under ZeRO-3 transformers partitions every model
it loads while accelerate's DeepSpeed config is registered; the trainer loads the retriever's encoder outside it
(the DeepSpeed training engine's outside_partitioning), so on each rank the encoder is whole and searches as it does in a plain process. The
same encoder loaded without the guard is the control: partitioned, its forward fails. Both ranks release the process
group together before they exit (a rank exiting with it could abort in gloo's teardown)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, free_port

QUERIES = ["Where was Krith Louslothsil born?", "Which river flows through the city?"]


@pytest.mark.slow
def test_the_dense_retriever_is_whole_and_searches_alike_on_zero3_ranks(tiny_dense_index, tmp_path):
    from retriever import InProcessRetriever

    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
                "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions")})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / "cpu_2proc_zero3.yaml"), "--main_process_port", str(free_port()),
           "tests/zero3_dense_run.py", str(tiny_dense_index), str(tmp_path), *QUERIES]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    alone = InProcessRetriever(tiny_dense_index)
    expected = [[h["id"] for h in q] for q in alone.search(QUERIES, 3)]
    numel = sum(p.numel() for p in alone.backend.encoder.model.parameters())
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["guarded"] == {"numel": numel, "partitioned": False, "hits": expected}, (rank, res)
        assert res["process_group"] is False, rank  # released on every rank before it exits
        control = res["control"]  # ZeRO-3 was in force: without the guard the encoder is partitioned
        assert control.get("partitioned") or ("error" in control and control["zero3_enabled"]), (rank, control)
