"""Multi-node set-up: the shipped accelerate / DeepSpeed configs (launcher, fp32 gradient reduction and accumulation,
partitioned loading), the retriever address from the environment, and on 2 CPU ranks over gloo
(tests/multinode_run.py): the shared-run-directory check, partitioned loading, the engine's gradient dtypes and the
checkpoint guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, free_port

ACCEL = REPO_ROOT / "configs" / "accelerate"
GPU_CONFIGS = ("zero2_8gpu.yaml", "zero3_8gpu.yaml", "zero3_offload_8gpu.yaml", "multinode_zero3_2x8.yaml")


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_accelerate_configs_point_at_fp32_reducing_deepspeed_json(name):
    acc = yaml.safe_load((ACCEL / name).read_text())
    ds = acc["deepspeed_config"]
    assert set(ds) <= {"deepspeed_config_file", "zero3_init_flag", "deepspeed_multinode_launcher"}  # accelerate
    # refuses the other keys beside a JSON file
    js = json.loads((REPO_ROOT / ds["deepspeed_config_file"]).read_text())
    assert js["communication_data_type"] == "fp32" and js["data_types"]["grad_accum_dtype"] == "fp32"
    stage = js["zero_optimization"]["stage"]
    assert ds["zero3_init_flag"] is (stage == 3)  # ZeRO-3 loads partitioned
    assert "mixed_precision" not in acc and js["bf16"]["enabled"] == "auto"  # accelerate refuses it beside a JSON;
    # the trainer's Accelerator sets bf16 from model.dtype and accelerate fills the JSON's "auto" from it
    if acc["num_machines"] > 1:
        assert ds["deepspeed_multinode_launcher"] == "standard"  # not pdsh


def test_retriever_address_from_the_environment(monkeypatch):
    from retriever import RetrieverError, service_address
    from searchr1_lld.learner import factories
    from searchr1_lld.config import load_config

    cfg = load_config("configs/paper/base.yaml")
    monkeypatch.delenv("SEARCHR1_RETRIEVER_URL", raising=False)
    monkeypatch.delenv("SEARCHR1_RETRIEVER_TOKEN", raising=False)
    assert service_address(cfg.retriever) == ("http://127.0.0.1:8000", None)
    monkeypatch.setenv("SEARCHR1_RETRIEVER_URL", "http://node0:8000")
    monkeypatch.setenv("SEARCHR1_RETRIEVER_TOKEN", "s3cret")
    client = factories.make_retriever(cfg)
    assert client.url == "http://node0:8000"
    assert service_address(cfg.retriever) == ("http://node0:8000", "s3cret")
    monkeypatch.setenv("SEARCHR1_RETRIEVER_URL", "node0:8000")
    with pytest.raises(RetrieverError, match=r"\$SEARCHR1_RETRIEVER_URL='node0:8000': must start with http"):
        service_address(cfg.retriever)


def test_single_process_run_dir_check_is_a_no_op(tmp_path):
    from searchr1_lld.bookkeeping.resume import check_run_dir_shared

    class One:
        num_processes, process_index = 1, 0

    check_run_dir_shared(One(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_two_ranks_shared_dir_check_partitioned_load_fp32_reduction(tmp_path, tiny_world):
    cfg = yaml.safe_load((ACCEL / "cpu_2proc_zero3.yaml").read_text())
    cfg["deepspeed_config"] = {"deepspeed_config_file": str(REPO_ROOT / "configs/deepspeed/zero3.json"),
                               "zero3_init_flag": True}
    cfg.pop("mixed_precision")  # as in the GPU configs
    cfg["main_process_port"] = free_port()
    accel = tmp_path / "accelerate.yaml"
    accel.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
           "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions")}
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel),
                          "tests/multinode_run.py", str(tmp_path), str(tiny_world)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-6000:])
    for r in (0, 1):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["world_size"] == 2 and res["shared_ok"]
        assert res["local_error"].startswith("trainer.output_dir: the run directory")
        assert "not shared by the 2 processes" in res["local_error"] and "\n" not in res["local_error"]
        assert res["loaded_partitioned"] and res["zero_stage"] == 3
        assert res["communication_data_type"] == "torch.float32" and res["grad_accum_dtype"] == "torch.float32"
        assert res["plugin_communication"] == "fp32" and res["reduce_bucket_size"] == 200_000_000  # the JSON's
        assert "not visible on every rank" in res["checkpoint_error"] and res["checkpoint_files"] == []
    assert not Path(tmp_path / "shared" / ".ranks").exists()
