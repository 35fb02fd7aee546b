"""train.py --preflight: the checks (data files, retriever index, model dir, hub id offline) with one line per problem
and exit 2, and the resource plan: memory_plan's arithmetic, the same numbers as docs/memory.md for the paper's 3B cell."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO_ROOT

from searchr1_lld.preflight import memory_plan as mp
from searchr1_lld.preflight import run as pre
from searchr1_lld.config import load_config
from searchr1_lld.rollout.backends.kinds import backend_kind

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
    """memory_plan's count on the tiny world's config against its safetensors; and Qwen2.5-3B's published
    3,085,938,688."""
    shape = mp.shape_from_hf_config(json.loads((tiny_world / "model" / "config.json").read_text()))
    assert shape.params == pre.safetensors_params(tiny_world / "model")
    assert mp.shape_from_hf_config(QWEN25_3B).params == 3_085_938_688 == mp.QWEN25["3b"].params


def test_checkpoint_bytes_hand_computed():
    assert pre.checkpoint_bytes(10, pre.Launch()) == 4 * 10 + 8 * 10
    assert pre.checkpoint_bytes(10, pre.Launch(deepspeed=True, bf16=True, zero_stage=2)) == 2 * 10 + 2 * 10 + 12 * 10


def test_read_launch_of_the_repository_configs():
    z2 = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
    assert (z2.processes, z2.deepspeed, z2.zero_stage, z2.bf16, z2.offload_optimizer) == (8, True, 2, True, False)
    assert z2.buckets == mp.Buckets()  # configs/deepspeed/zero2.json's bucket sizes are the ones docs/memory.md counts
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
    assert "3 problem(s), one a line below: the run cannot start" in out
    assert "PROBLEM" not in out and "rows file not found" not in out  # each problem once, on stderr
    assert "evaluation: not computed (its rows files cannot be read here" in out  # data.test_files named, missing


def test_missing_flashrag_files_name_the_command_that_writes_them(tiny_world, tmp_path, capsys):
    flash = tmp_path / "flashrag"
    code, out, err = _run(capsys, f"model.path={tiny_world / 'model'}", f"model.tokenizer_path={tiny_world / 'tokenizer'}",
                          f"retriever.index_dir={tiny_world / 'index'}", "data.test_files=[]", "trainer.eval_every=5",
                          f"data.train_files=[{flash / 'train' / 'nq.jsonl'}]",
                          f"eval.datasets=[nq={flash / 'test' / 'nq.jsonl'},bamboogle={flash / 'test/bamboogle.jsonl'}]")
    assert code == 2 and len(err) == 3, err
    assert (f"note     3 FlashRAG rows file(s) missing under {flash}: `python -m searchr1_lld.data.flashrag --out "
            f"{flash} --train-mix nq` writes them") in out
    assert "evaluation: not computed" in out and "evaluation: none" not in out


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


def _health_server(answer: dict):
    """A stand-in retriever service on loopback answering ``GET /health`` with ``answer``; returns (server, url)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(answer).encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


WIKI18_HEALTH = {"status": "ok", "retriever": "e5", "index_type": "Flat", "num_docs": 21015324, "dim": 768,
                 "encoder": "intfloat/e5-base-v2", "load_mode": "gpu x8"}


def _qwen3b_dir(tmp_path):
    model = tmp_path / "qwen3b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_3B))
    (model / "tokenizer_config.json").write_text("{}")
    return model


def test_the_plan_of_the_3b_paper_cell_is_the_one_docs_memory_shows(tmp_path):
    """The 3B paper config with Qwen2.5-3B's config.json, zero2_8gpu and a service reporting wiki-18's Flat index on
    8 GPUs: the preflight's plan is memory_plan's paper cell (docs/memory.md), and its lines print the same GB."""
    server, url = _health_server(WIKI18_HEALTH)
    try:
        cfg = load_config(REPO_ROOT / "configs" / "paper" / "qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml", [
            f"model.path={_qwen3b_dir(tmp_path)}", f"retriever.url={url}", f"trainer.output_dir={tmp_path / 'runs'}"])
        launch = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
        result = pre.run_preflight(cfg, launch=launch, device_gib=mp.H100_80GB / GiB)
        index = pre.check_retriever(pre.Preflight(), cfg)
    finally:
        server.shutdown()
    c7 = load_config(REPO_ROOT / "configs" / "paper" / "qwen2.5-7b-base_nq-hotpotqa_llds-ma.yaml")
    cell = mp.paper_cells(*mp.paper_engines({"3b": cfg, "7b": c7}))["3B ZeRO-2"]
    shape = mp.shape_from_hf_config(QWEN25_3B)
    assert pre.gpu_plan(pre.Preflight(), cfg, backend_kind(cfg.rollout), shape, launch, mp.H100_80GB, index) == cell
    lines = {line.split(":")[0]: line for line in result.plan}
    assert lines["engine start"].startswith(f"engine start: {cell.engine_start / mp.GB:.1f} GB per GPU of 85.5 GB ("), \
        lines
    assert lines["rollout"].startswith(f"rollout: {cell.rollout / mp.GB:.1f} GB per GPU of 85.5 GB ("), lines
    assert f"margin {cell.margin_at_wake_up / mp.GB:.1f} GB ({100 * cell.margin_at_wake_up_fraction:.1f} %)" in \
        lines["rollout"]
    assert lines["update"].startswith(f"update: {cell.update / mp.GB:.1f} GB per GPU"), lines
    assert "retriever 6.1 GB" in lines["rollout"] and f"KV cache {cell.kv_cache / mp.GB:.1f} GB" in lines["rollout"]
    assert not [x for x in result.problems if x.startswith("plan")], result.problems


def test_an_engine_that_never_sleeps_on_a_small_gpu_is_a_problem(tiny_world, tmp_path):
    """Without sleep mode vLLM's claim stays through the update: on a 40 GiB GPU the update cannot fit."""
    launch = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
    cfg = load_config(None, [f"model.path={_qwen3b_dir(tmp_path)}", "rollout.backend=vllm",
                             "rollout.vllm.enable_sleep_mode=false", "rollout.vllm.gpu_memory_utilization=0.6",
                             "model.gradient_checkpointing=true", f"trainer.output_dir={tmp_path / 'runs'}",
                             f"retriever.index_dir={tiny_world / 'index'}",
                             f"data.train_files=[{tiny_world / 'qa' / 'train.jsonl'}]"])
    result = pre.run_preflight(cfg, launch=launch, device_gib=40)
    assert any(x.startswith("plan: the update needs") for x in result.problems), result.problems
    assert any("rollout.vllm.enable_sleep_mode=false" in x for x in result.notes)


def test_the_retriever_service_is_asked_for_its_health_and_encoder(tmp_path):
    """retriever.mode=http: a stand-in /health on loopback (the service's answer keys); its encoder against
    retriever.expect_encoder; a port nobody listens on is a problem."""
    from conftest import free_port

    server, url = _health_server({**WIKI18_HEALTH, "num_docs": 21015324, "load_mode": "cpu"})
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


def test_an_in_process_gpu_index_that_does_not_fit_names_the_service_per_node(tiny_world, tmp_path, monkeypatch):
    """retriever.use_gpu_index puts wiki-18's whole Flat index (34.4 GB with FAISS's temporary memory and a context)
    on every rank's GPU: beside the 3B ZeRO-2 learner and its 0.55 engine neither the engine's start nor the wake-up
    fits, and each refusal names the command that serves the index once per node."""
    facts = pre.IndexFacts(host_bytes=64e9, num_docs=21_015_324, dim=768, index_type="Flat")
    monkeypatch.setattr(pre, "check_retriever", lambda pf, cfg, wait=False: facts)
    cfg = load_config(REPO_ROOT / "configs" / "paper" / "qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml", [
        f"model.path={_qwen3b_dir(tmp_path)}", "retriever.mode=inprocess", "retriever.use_gpu_index=true",
        f"retriever.index_dir={tiny_world / 'index'}", f"trainer.output_dir={tmp_path / 'runs'}"])
    launch = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "zero2_8gpu.yaml")
    result = pre.run_preflight(cfg, launch=launch, device_gib=mp.H100_80GB / GiB)
    plan = [p for p in result.problems if p.startswith("plan:")]
    assert [p.split(" ")[1] for p in plan] == ["vLLM", "the"] and "the rollout needs" in plan[1], plan
    serve = (f"`python -m retriever serve --index {tiny_world / 'index'} --gpu-index --port 8000` and "
             "retriever.mode=http")
    assert all(p.endswith(serve) and "(34.4 GB) on every rank's GPU" in p for p in plan), plan


def test_a_split_launch_plans_a_learner_gpu_and_a_rollout_gpu_apart(tmp_path):
    """trainer.placement.kind=split on 8 GPUs, 2 of them rollout: a learner GPU holds the learner's states over 6
    ranks and no engine; a rollout GPU its vLLM engine awake through the update (it never sleeps) and no learner."""
    launch = pre.read_launch(REPO_ROOT / "configs" / "accelerate" / "split_2rollout_6learner.yaml")
    split = ["trainer.staleness=1", "trainer.placement.kind=split", "trainer.placement.rollout_gpus=2",
             "algorithm.rollout_correction.preset=decoupled_token_is", "trainer.train_batch_size=48",
             "trainer.ppo_mini_batch_size=48"]
    common = [f"model.path={_qwen3b_dir(tmp_path)}", "rollout.backend=vllm", "rollout.vllm.gpu_memory_utilization=0.4",
              f"trainer.output_dir={tmp_path / 'runs'}", "retriever.mode=http", "model.gradient_checkpointing=true"]
    cfg = load_config(None, [*common, *split]).validate()
    result = pre.run_preflight(cfg, launch=launch, device_gib=mp.H100_80GB / GiB)
    lines = {line.split(":")[0]: line for line in result.plan}
    shape = mp.shape_from_hf_config(QWEN25_3B)
    six = mp.learner_bytes(shape, 2, 6, launch.buckets)
    assert f"learner states {six / mp.GB:.1f} GB" in lines["learner GPU update"], lines
    assert "vLLM" not in lines["learner GPU update"] and "vLLM" not in lines["learner GPU rollout"]
    assert "learner states" not in lines["rollout GPU update"] and "vLLM asleep" in lines["rollout GPU update"]
    awake = lines["rollout GPU rollout"].split("vLLM awake ")[1].split(" GB")[0]
    assert lines["rollout GPU update"].split("vLLM asleep ")[1].split(" GB")[0] == awake  # never sleeps
    assert not [x for x in result.problems if x.startswith("plan")], result.problems
    bad = load_config(None, [*common, *split[:-2], "trainer.train_batch_size=16", "trainer.ppo_mini_batch_size=16"])
    result = pre.run_preflight(bad.validate(), launch=launch, device_gib=mp.H100_80GB / GiB)
    assert any("must divide over them" in x for x in result.problems), result.problems
