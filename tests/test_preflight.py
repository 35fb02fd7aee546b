"""train.py --preflight: the checks (data files, retriever index, model dir, hub id offline) with one line per problem
and exit 2, and the resource plan's arithmetic on hand-computed cases."""

from __future__ import annotations

import importlib.util
import json

from searchr1_lld import preflight as pre
from searchr1_lld.config import load_config

from conftest import REPO_ROOT

GiB = 1 << 30
QWEN25_3B = {"model_type": "qwen2", "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
             "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True}


def _train_cli():
    spec = importlib.util.spec_from_file_location("train_cli", REPO_ROOT / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(capsys, *args):
    code = _train_cli().main(["--config", str(REPO_ROOT / "configs" / "tiny.yaml"), "--preflight", *args])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def test_parameter_count_from_the_config_equals_the_weights_on_disk(tiny_world):
    """The formula on the tiny world's config against its safetensors; and Qwen2.5-3B's published 3,085,938,688."""
    shape = pre.shape_from_config(json.loads((tiny_world / "model" / "config.json").read_text()))
    assert shape.params == pre.safetensors_params(tiny_world / "model")
    assert pre.shape_from_config(QWEN25_3B).params == 3_085_938_688


def test_learner_bytes_hand_computed():
    p = 1000
    ddp = pre.learner_bytes(p, pre.Launch(processes=4), reference=True, hf_engine_copy=False)
    assert ddp == {"weights": 4000, "optimizer": 8000, "gradients": 4000, "gradient partition": 0.0,
                   "reference": 4000, "engine copy": 0.0}
    z2 = pre.learner_bytes(p, pre.Launch(processes=4, deepspeed=True, zero_stage=2, bf16=True), reference=True,
                           hf_engine_copy=False)
    bucket = 5e8 * 2
    assert z2 == {"weights": 2000, "optimizer": 3000, "gradients": 1000 + bucket, "gradient partition": 1000 + bucket,
                  "reference": 2000, "engine copy": 0.0}
    z3 = pre.learner_bytes(p, pre.Launch(processes=4, deepspeed=True, zero_stage=3, bf16=True,
                                         offload_optimizer=True), reference=False, hf_engine_copy=True)
    assert z3 == {"weights": 500, "optimizer": 0.0, "gradients": 1000 + bucket, "gradient partition": 1000 + bucket,
                  "reference": 0.0, "engine copy": 2000}


def test_kv_cache_activations_and_checkpoint_bytes_hand_computed():
    shape = pre.ModelShape(params=10, vocab=100, hidden=8, layers=3, kv_heads=2, head_dim=4)
    assert pre.kv_cache_bytes(shape, sequences=5, length=7, bytes_per=2) == 5 * 7 * 2 * 3 * 2 * 4 * 2
    assert pre.activation_bytes(shape, 16, bytes_per=2, checkpointing=False) == 2 * 16 * 100 * 2
    assert pre.activation_bytes(shape, 16, bytes_per=2, checkpointing=True) == 2 * 16 * 100 * 2 + 3 * 16 * 8 * 2
    assert pre.checkpoint_bytes(10, pre.Launch()) == 4 * 10 + 8 * 10
    assert pre.checkpoint_bytes(10, pre.Launch(deepspeed=True, bf16=True, zero_stage=2)) == 2 * 10 + 2 * 10 + 12 * 10


def test_read_launch_of_the_repository_configs():
    z2 = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
    assert (z2.processes, z2.deepspeed, z2.zero_stage, z2.bf16, z2.offload_optimizer) == (8, True, 2, True, False)
    off = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero3_offload_8gpu.yaml")
    assert off.zero_stage == 3 and off.offload_optimizer


def test_a_good_config_passes_and_prints_the_plan(tiny_world, capsys):
    code, out, err = _run(capsys, "--world-dir", str(tiny_world), "--world", "configs/world/default.yaml")
    assert code == 0 and err == [], err
    assert "preflight: the run can start" in out
    for head in ("data.train_files", "data.test_files", "retriever:", "model.path", "rollout:", "update:",
                 "host RAM per node:", "disk:", "evaluation:"):
        assert head in out, head
    assert "(CPU run: host memory)" in out  # no GPU here and none asked for


def test_missing_files_are_one_line_each_and_exit_2(tiny_world, tmp_path, capsys):
    code, out, err = _run(capsys, *[f"{k}={v}" for k, v in {
        "model.path": tiny_world / "model", "model.tokenizer_path": tiny_world / "tokenizer",
        "data.train_files": f"[{tmp_path / 'train.jsonl'}]", "data.test_files": f"[{tmp_path / 'test.jsonl'}]",
        "retriever.index_dir": tmp_path / "index"}.items()])
    assert code == 2
    assert len(err) == 3 and all(line.startswith("train.py: preflight: ") for line in err), err
    assert [line.split(": ")[2] for line in err] == ["data.train_files", "data.test_files", "retriever.index_dir"]
    assert "3 problem(s): the run cannot start" in out


def test_a_hub_id_offline_and_a_model_dir_without_tokenizer(tiny_world, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    world = [f"data.train_files=[{tiny_world / 'qa' / 'train.jsonl'}]", "data.test_files=[]",
             f"retriever.index_dir={tiny_world / 'index'}"]
    code, _, err = _run(capsys, *world, "model.path=Qwen/Qwen2.5-3B", "model.tokenizer_path=")
    assert code == 2 and len(err) == 1 and "not in the HF cache, and HF_HUB_OFFLINE=1" in err[0], err
    # the same hub id once in the HF cache (its layout: refs/main -> snapshots/<revision>/config.json): verified
    snapshot = tmp_path / "hub-cache" / "models--Qwen--Qwen2.5-3B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN25_3B))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    code, out, err = _run(capsys, *world, "model.path=Qwen/Qwen2.5-3B", "model.tokenizer_path=")
    assert "hub id, in the HF cache (3.09 B parameters)" in out and not [e for e in err if "model.path" in e], err
    assert "rollout:" in out  # its plan (whether this machine's disk holds its checkpoints is another line)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(QWEN25_3B))
    code, _, err = _run(capsys, *world, f"model.path={bare}", "model.tokenizer_path=")
    assert code == 2 and len(err) == 1 and "its tokenizer" in err[0] and "tokenizer.json" in err[0], err


def test_the_plan_of_a_3b_cell_and_an_engine_that_never_sleeps(tiny_world, tmp_path):
    """Qwen2.5-3B's config, ZeRO-2 on 8 GPUs of 80 GiB, vLLM at 0.6: the rollout total by hand; without sleep mode
    on a 40 GiB GPU the update cannot fit: a problem naming the phase."""
    model = tmp_path / "qwen3b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_3B))
    (model / "tokenizer_config.json").write_text("{}")
    cfg = load_config(REPO_ROOT / "configs" / "paper" / "qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml", [
        f"model.path={model}", "retriever.mode=inprocess", f"retriever.index_dir={tiny_world / 'index'}",
        f"trainer.output_dir={tmp_path / 'runs'}"])
    launch = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
    p = 3_085_938_688
    expected = 2 * p + 12 * p / 8 + (4 * p / 8 + 5e8 * 2) + 2 * p + 0.6 * 80 * GiB + 1 * GiB
    result = pre.run_preflight(cfg, launch=launch, device_gib=80)
    rollout = next(line for line in result.plan if line.startswith("rollout:"))
    assert rollout.startswith(f"rollout: {expected / GiB:.1f} GiB per GPU of 80 GiB"), rollout
    assert not [x for x in result.problems if x.startswith("plan")]
    cfg = load_config(None, [f"model.path={model}", "rollout.backend=vllm", "rollout.vllm_enable_sleep_mode=false",
                             "rollout.vllm_gpu_memory_utilization=0.6", "model.gradient_checkpointing=true",
                             f"trainer.output_dir={tmp_path / 'runs'}", f"retriever.index_dir={tiny_world / 'index'}",
                             f"data.train_files=[{tiny_world / 'qa' / 'train.jsonl'}]"])
    result = pre.run_preflight(cfg, launch=launch, device_gib=40)
    assert any(x.startswith("plan: the update needs") for x in result.problems), result.problems
    assert any("vllm_enable_sleep_mode=false" in x for x in result.notes)


def test_the_retriever_service_is_asked_for_its_health_and_encoder(tmp_path):
    """retriever.mode=http: a stand-in /health on loopback (the service's answer keys); its encoder against
    retriever.expect_encoder; a port nobody listens on is a problem."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from conftest import free_port

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"status": "ok", "retriever": "e5", "num_docs": 21015324,
                               "encoder": "intfloat/e5-base-v2"}).encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for expect, problems in (("intfloat/e5-base-v2", 0), ("e5-base-v2", 0), ("BAAI/bge-base-en", 1)):
            pf = pre.Preflight()
            pre.check_retriever(pf, load_config(None, ["retriever.mode=http", f"retriever.url={url}",
                                                       f"retriever.expect_encoder={expect}"]))
            assert len(pf.problems) == problems, (expect, pf.problems)
            assert problems or "e5 index of 21015324 docs, encoder intfloat/e5-base-v2" in pf.ok[0]
    finally:
        server.shutdown()
    pf = pre.Preflight()
    pre.check_retriever(pf, load_config(None, ["retriever.mode=http", f"retriever.url=http://127.0.0.1:{free_port()}"]))
    assert len(pf.problems) == 1 and "not reachable" in pf.problems[0]
