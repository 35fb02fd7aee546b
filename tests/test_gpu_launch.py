"""What an 8-GPU launch needs at its start, checked on CPU with fakes where a GPU would be: each rank's in-process
FAISS index on its own GPU only; the start-up preflight (the launch read from the accelerator, one line per problem
on rank 0, the same exit on every rank); the learner's expandable_segments; the engine's batch limits and its
LOCAL_RANK; a level-2 wake without a weight load refused; per-request seeds that make a rollout independent of the
order in which requests enter the engine; the generation config's eos ids counted as eos stops."""

from __future__ import annotations

import dataclasses
import io
import random
import types

import pytest
import torch

import retriever
from searchr1_lld.config import RetrieverConfig, RolloutConfig, VLLMConfig, load_config
from searchr1_lld.distributed import DistributedFacts
from searchr1_lld.preflight import allocator
from searchr1_lld.preflight import memory_plan as mp
from searchr1_lld.preflight import startup
from searchr1_lld.rollout import run_agent_loop
from searchr1_lld.rollout.backends.base import BackendBase, GenerationOutput
from searchr1_lld.rollout.backends.vllm_settings import EngineBatch, engine_batch, local_rank
from searchr1_lld.rollout.turn_rules import request_seed
from scripted_backends import ScriptedBackend
from test_rollout_backends import FakeLLM, _vllm_backend
from test_rollout_support import DictRetriever, enc, make_tokenizer, row

# ------------------------------------------------------------------------------------- the in-process index, per rank


class FakeGpuFaiss:
    """faiss-gpu's cloners as far as the dense kind calls them: records which GPU each clone goes to and hands the
    CPU index back (so the index still searches)."""

    def __init__(self, gpus: int):
        self.gpus, self.clones, self.all_gpu_clones = gpus, [], 0

    def install(self, monkeypatch):
        import faiss

        monkeypatch.setattr(faiss, "get_num_gpus", lambda: self.gpus, raising=False)
        monkeypatch.setattr(faiss, "StandardGpuResources", lambda: object(), raising=False)
        monkeypatch.setattr(faiss, "GpuClonerOptions", types.SimpleNamespace, raising=False)
        monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", types.SimpleNamespace, raising=False)
        monkeypatch.setattr(faiss, "index_cpu_to_gpu", self.to_gpu, raising=False)
        monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", self.to_all, raising=False)

    def to_gpu(self, resources, device, index, options):
        self.clones.append((device, resources, options.useFloat16))
        return index

    def to_all(self, index, co=None):
        self.all_gpu_clones += 1
        return index


def test_eight_ranks_of_a_node_each_put_the_index_on_their_own_gpu(tiny_dense_index, monkeypatch):
    """8 ranks on one host, each with its current CUDA device set to its local index (as accelerate does): the
    trainer's in-process retriever clones the index onto that device alone, never onto all 8, and searches as the
    CPU index does."""
    fake = FakeGpuFaiss(gpus=8)
    fake.install(monkeypatch)
    cfg = RetrieverConfig(mode="inprocess", index_dir=str(tiny_dense_index), device="cpu", use_gpu_index=True)
    expected = [[h["id"] for h in q] for q in retriever.InProcessRetriever(tiny_dense_index).search(["Lake Varo"], 2)]
    for rank in range(8):
        monkeypatch.setattr(torch.cuda, "current_device", lambda rank=rank: rank)
        r = retriever.retriever_mode(cfg).build(cfg)
        assert r.info()["load_mode"] == f"gpu:{rank}"
        assert [[h["id"] for h in q] for q in r.search(["Lake Varo"], 2)] == expected
    assert [device for device, _, _ in fake.clones] == list(range(8)) and fake.all_gpu_clones == 0
    assert len({id(res) for _, res, _ in fake.clones}) == 8 and all(fp16 for _, _, fp16 in fake.clones)
    # the service (one per node) still shards over every GPU
    served = retriever.InProcessRetriever(tiny_dense_index, device="cpu", use_gpu=True)
    assert served.info()["load_mode"] == "gpu x8" and fake.all_gpu_clones == 1
    with pytest.raises(ValueError, match="gpu_placement"):
        retriever.InProcessRetriever(tiny_dense_index, device="cpu", use_gpu=True, gpu_placement="each")


def test_the_plan_counts_the_in_process_index_once_per_gpu():
    """wiki-18 in fp16 (21,015,324 x 768 x 2 B = 32.28 GB) whole on each rank's GPU, with one FAISS temporary
    memory and one context: 34.4 GB; the old placement (8 ranks each sharding over the 8 GPUs) put 8 x (4.03 + 1.61 +
    0.5) = 49.2 GB on every GPU, and the service per node 6.1 GB."""
    facts = retriever.modes.IndexFacts(num_docs=21_015_324, dim=768, index_type="Flat")
    shards, copies, _ = retriever.retriever_mode(RetrieverConfig(use_gpu_index=True)).gpu_index_copies(
        RetrieverConfig(use_gpu_index=True), facts, 8)
    per_gpu = mp.faiss_flat_shard_bytes(21_015_324, 768, shards, processes=copies)
    assert per_gpu == 21_015_324 * 768 * 2 + mp.FAISS_TEMP_BYTES + mp.RETRIEVER_CONTEXT_BYTES
    assert round(per_gpu / mp.GB, 1) == 34.4
    assert round(mp.faiss_flat_shard_bytes(21_015_324, 768, 8, processes=8) / mp.GB, 1) == 49.2
    assert round(mp.faiss_flat_shard_bytes(21_015_324, 768, 8) / mp.GB, 1) == 6.1


# ------------------------------------------------------------------------------------------- the start-up preflight


class FakeAccelerator:
    """What the start-up preflight asks of accelerate's Accelerator."""

    def __init__(self, device="cuda", deepspeed_config=None, zero3_init=False, mixed="bf16"):
        self.device = torch.device(device)
        self.mixed_precision = mixed
        plugin = types.SimpleNamespace(deepspeed_config=deepspeed_config or {}, zero3_init_flag=zero3_init)
        self.state = types.SimpleNamespace(deepspeed_plugin=plugin)
        self.ended = False

    def wait_for_everyone(self):
        pass

    def end_training(self):
        self.ended = True


def facts(world_size=1, rank=0, deepspeed=False, zero_stage=0):
    return DistributedFacts(deepspeed=deepspeed, zero_stage=zero_stage, world_size=world_size, rank=rank,
                            is_main=rank == 0)


def test_the_launch_is_read_from_the_running_accelerator(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto",
            "stage3_max_live_parameters": 1e9}
    launch = startup.launch_of(FakeAccelerator(deepspeed_config={"zero_optimization": zero}, zero3_init=True),
                               facts(16, 3, True, 3))
    assert (launch.processes, launch.machines, launch.zero_stage, launch.offload_optimizer, launch.zero3_init,
            launch.bf16) == (16, 2, 3, True, True, True)
    assert launch.buckets == mp.Buckets(max_live=1e9)  # "auto": DeepSpeed's default, as the plan counts it


def test_one_rank_with_problems_stops_with_one_line_each():
    out, acc = io.StringIO(), FakeAccelerator()
    startup.agree(acc, facts(), [], out)  # nothing found: the run goes on
    assert out.getvalue() == ""
    with pytest.raises(startup.PreflightRefused) as refused:
        startup.agree(acc, facts(), ["data.train_files: missing.jsonl not found", "plan: the update needs 90 GB"], out)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["train.py: preflight: data.train_files: missing.jsonl not found",
                         "train.py: preflight: plan: the update needs 90 GB"]
    assert len(lines) == 3 and "2 problem(s)" in lines[2] and refused.value.problems == [l.split(": ", 2)[2]
                                                                                          for l in lines[:2]]


def _agree_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` of 2 (gloo): rank 1 alone finds a problem, both find a shared one; each writes its outcome."""
    import json
    import os
    import sys

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    problems = ["plan: shared"] + (["data.train_files: /node1/train.jsonl not found"] if rank == 1 else [])
    stream = io.StringIO()
    outcome = "went on"
    acc = FakeAccelerator(device="cpu")
    acc.end_training = torch.distributed.destroy_process_group
    try:
        startup.agree(acc, facts(2, rank), problems, stream)
    except startup.PreflightRefused:
        outcome = "refused"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"outcome": outcome, "printed": stream.getvalue().splitlines(),
                   "group_down": not torch.distributed.is_initialized()}, f)
    sys.stdout.flush()


def test_two_ranks_agree_rank_zero_prints_every_problem_both_stop(tmp_path):
    import json

    import torch.multiprocessing as tmp
    from conftest import free_port

    tmp.spawn(_agree_on_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["outcome"] for r in ranks] == ["refused", "refused"] and all(r["group_down"] for r in ranks)
    assert ranks[1]["printed"] == []  # only rank 0 prints
    assert ranks[0]["printed"][:2] == ["train.py: preflight: plan: shared",
                                       "train.py: preflight: data.train_files: /node1/train.jsonl not found (rank 1)"]


def test_the_start_up_check_runs_on_a_gpu_only_and_refuses_a_kv_cache_the_wake_up_cannot_hold(tiny_world, tmp_path,
                                                                                               monkeypatch):
    """A launch whose device is a CPU is not checked; on a (faked) 80 GB GPU the paper's 3B engine with a KV cache of
    6e10 bytes set beside its 0.55 claim: vLLM would start (its claim is free then) and fail at its first wake-up. The
    same plan from the utilisation alone fits, which is what the plan said before it read the KV-cache bytes."""
    from test_preflight import _qwen3b_dir

    cfg = load_config("configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml", [
        f"model.path={_qwen3b_dir(tmp_path)}", "retriever.mode=inprocess",
        f"retriever.index_dir={tiny_world / 'index'}",
        f"data.train_files=[{tiny_world / 'qa' / 'train.jsonl'}]", "data.val_holdout.size=10", "eval.datasets=[]",
        f"trainer.output_dir={tmp_path / 'runs'}", "rollout.vllm.kv_cache_memory_bytes=60000000000"])
    from searchr1_lld.preflight import run as pre

    zero2 = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8, "allgather_bucket_size": 2e8}}
    startup.check_at_start(cfg, FakeAccelerator(device="cpu"), facts(8, 0, True, 2), mp.H100_80GB)  # CPU: no check
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setattr(pre.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=10**15))  # checkpoints fit
    monkeypatch.setattr(startup, "gather", lambda dist, mine: [mine] * dist.world_size)  # 8 ranks, the same inputs
    out = io.StringIO()
    with pytest.raises(startup.PreflightRefused) as refused:
        startup.check_at_start(cfg, FakeAccelerator(deepspeed_config=zero2), facts(8, 0, True, 2), mp.H100_80GB, out)
    assert [p.split(" needs")[0] for p in refused.value.problems] == ["plan: the rollout"], refused.value.problems
    assert out.getvalue().splitlines()[0].startswith("train.py: preflight: plan: the rollout needs ")
    ok = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, vllm=VLLMConfig(kv_cache_memory_bytes=0)))
    startup.check_at_start(ok, FakeAccelerator(deepspeed_config=zero2), facts(8, 0, True, 2), mp.H100_80GB)


# ------------------------------------------------------------------------------------------------- the allocator


def test_expandable_segments_is_added_to_what_the_user_set_never_over_it():
    env: dict[str, str] = {}
    assert allocator.use_expandable_segments(env) == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert allocator.expandable_segments_note(env) is None
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    allocator.use_expandable_segments(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:True"
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "PYTORCH_CUDA_ALLOC_CONF": "x:1"}  # the first one wins
    allocator.use_expandable_segments(env)
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:False" and env["PYTORCH_CUDA_ALLOC_CONF"] == "x:1"
    assert "PYTORCH_ALLOC_CONF='expandable_segments:False'" in allocator.expandable_segments_note(env)


# --------------------------------------------------------------------------------- the engine's settings, its rank


def test_the_training_engine_passes_its_batch_limits_and_the_plan_reads_them():
    """The paper's cell: 512 prompts x 5 responses on 8 ranks = 320 trajectories a rank, evaluation batches of 512:
    max_num_seqs 640, max_num_batched_tokens max(4,096, 640)."""
    from searchr1_lld.rollout.backends import backend_kind
    from searchr1_lld.rollout.backends.vllm import build_llm_kwargs

    cfg = load_config("configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml")
    batch = engine_batch(cfg, 8)
    assert batch == EngineBatch(640, 4096)
    assert engine_batch(cfg, 16) == EngineBatch(512, 4096)  # 160 trajectories a rank: the evaluation batch decides
    kw = build_llm_kwargs("/m", cfg.rollout, batch=batch)
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"], kw["sleep_mode_offload_cudagraph"]) == (640, 4096, False)
    assert "max_num_seqs" not in build_llm_kwargs("/m", cfg.rollout)  # an evaluation engine: vLLM's defaults
    engine = mp.EngineSettings.of(backend_kind(cfg.rollout).engine_memory(cfg, 8))
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, engine.graph_pool_bytes) == (
        640, 4096, mp.CUDA_GRAPH_POOL_BYTES)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineBatch(640, 100)


def test_local_rank_is_the_launchers_local_index_never_the_global_rank():
    assert local_rank(9, 16, {"LOCAL_RANK": "1"}) == 1
    assert local_rank(9, 16, {"SLURM_LOCALID": "1"}) == 1
    assert local_rank(9, 16, {"LOCAL_WORLD_SIZE": "8"}) == 1
    assert local_rank(0, 1, {}) == 0
    with pytest.raises(ValueError, match="rank 9 of 16: the launcher gives no local index"):
        local_rank(9, 16, {})


def test_set_launcher_env_takes_the_local_index(monkeypatch):
    import os

    from searchr1_lld.rollout.backends.vllm import set_launcher_env

    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in launcher})  # restored after
    os.environ["LOCAL_WORLD_SIZE"] = "8"
    set_launcher_env(8, 16)  # node 1's first rank
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("8", "0")


# --------------------------------------------------------------------------------------- the engine's sleep and wake


def test_a_level_two_wake_without_a_weight_load_is_refused(monkeypatch):
    llm = FakeLLM(held={"w": (1,)})
    be = _vllm_backend(llm, monkeypatch, names=["w"])  # sleep level 2 (the default)
    be.sleep()
    with pytest.raises(RuntimeError, match="level-2 sleep without load_weights"):
        be.wake_up()
    assert llm.log == [("sleep", 2)]  # nothing was woken
    be.load_weights([("w", torch.zeros(1))])
    be.wake_up()
    be.generate([[1]], max_new_tokens=1, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False)
    level1 = _vllm_backend(FakeLLM(), monkeypatch, vllm=VLLMConfig(sleep_level=1))  # level 1 parks the weights: no load needed
    level1.sleep()
    level1.wake_up()


# ------------------------------------------------------------------------------------------- per-request seeds


def test_request_seeds_are_fixed_by_step_trajectory_and_turn():
    seeds = {request_seed(s, t, k) for s in (0, 1) for t in range(50) for k in range(4)}
    assert len(seeds) == 400 and all(0 <= x < 2**63 for x in seeds)
    assert request_seed(7, 3, 1) == request_seed(7, 3, 1)


def test_the_vllm_backend_gives_each_request_its_seed(monkeypatch):
    llm = FakeLLM()
    be = _vllm_backend(llm, monkeypatch)
    be.generate([[1, 2], [3]], max_new_tokens=4, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False,
                seeds=[11, 12])
    _, _, params = llm.log[0]
    assert [p["seed"] for p in params] == [11, 12]
    be.generate([[1]], max_new_tokens=4, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True, seeds=[5])
    assert "seed" not in llm.log[1][2][0]  # greedy: no sampling, no seed
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        be.generate([[1]], max_new_tokens=4, stop_strings=[], temperature=1.0, top_p=1.0, greedy=False, seeds=[1, 2])


class OrderedStream(BackendBase):
    """An engine whose unseeded requests draw from one generator when they enter (as Model Runner V2 seeds them from
    numpy's global generator in ``add_request``), entering in an order shuffled by ``order_seed`` at each step; a
    seeded request draws from its own seed. A request's output: ``k`` ids from a fixed vocabulary, finished ``k``
    steps after it entered."""

    def __init__(self, order_seed: int):
        self.order, self.shared = random.Random(order_seed), random.Random(0)
        self.pending: list[tuple[str, list[int], int | None]] = []
        self.running: dict[str, tuple[int, GenerationOutput]] = {}
        self.vocab = [enc(t) for t in ("<search> Lake Varo </search>", "<search> Brelm Tower </search>",
                                       "<answer> Ostria </answer>", "<answer> Brelm </answer>", "no idea")]

    def add_request(self, request_id, prompt, *, max_new_tokens, stop_strings, temperature, top_p, greedy, seed=None):
        self.pending.append((request_id, list(prompt), seed))

    def step(self):
        self.order.shuffle(self.pending)
        for request_id, prompt, seed in self.pending:
            draw = random.Random(seed) if seed is not None else random.Random(self.shared.random())
            ids = list(draw.choice(self.vocab))
            self.running[request_id] = (1 + draw.randrange(3), GenerationOutput(ids, [-0.1] * len(ids), "stop"))
        self.pending = []
        done = [(r, out) for r, (left, out) in self.running.items() if left <= 1]
        self.running = {r: (left - 1, out) for r, (left, out) in self.running.items() if left > 1}
        return done

    def has_unfinished_requests(self):
        return bool(self.pending or self.running)

    def abort_requests(self, request_ids):
        for r in request_ids:
            self.running.pop(r, None)

    def generate(self, prompts, **kw):
        raise AssertionError("the continuous scheduler drives add_request / step")

    def load_weights(self, named_tensors):
        pass


def _stream_rollout(order_seed: int, seed: int | None):
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=24, max_obs_length=60, max_total_length=400, topk=2,
                        scheduler="continuous")
    trajs = run_agent_loop([row(i, question=f"Where is Lake Varo? ({i})") for i in range(6)],
                           backend=OrderedStream(order_seed), tokenizer=make_tokenizer(), retriever=DictRetriever(),
                           cfg=cfg, n=4, seed=seed)
    return [t.response_ids for t in trajs]


def test_a_seeded_rollout_samples_the_same_whatever_order_requests_enter():
    """Two replays of a step, the engine taking its requests in two different orders: with the step's seed the
    same tokens; without it (each request drawing from a shared generator in arrival order) not."""
    assert _stream_rollout(order_seed=1, seed=123) == _stream_rollout(order_seed=2, seed=123)
    assert _stream_rollout(order_seed=1, seed=None) != _stream_rollout(order_seed=2, seed=None)
    assert _stream_rollout(order_seed=1, seed=123) != _stream_rollout(order_seed=1, seed=124)


def test_the_turn_batched_loop_sends_one_seed_per_request():
    tok = make_tokenizer()
    backend = ScriptedBackend([[enc("<search> Lake Varo </search>")] * 2, [enc("<answer> Ostria </answer>")] * 2],
                              tok)
    run_agent_loop([row(0)], backend=backend, tokenizer=tok, retriever=DictRetriever(),
                   cfg=RolloutConfig(max_turns=2, max_obs_length=60, max_total_length=400, topk=2), n=2, seed=9)
    assert [c["seeds"] for c in backend.calls] == [[request_seed(9, 0, 0), request_seed(9, 1, 0)],
                                                   [request_seed(9, 0, 1), request_seed(9, 1, 1)]]


# ----------------------------------------------------------------------------------------------------- eos stops


def test_the_engines_eos_ids_count_as_eos_stops(monkeypatch):
    """An Instruct model's generation config names more eos ids than its tokenizer (Qwen2.5: <|im_end|> and
    <|endoftext|>); the engine stops on all of them, and a turn that ends in one is an eos stop."""
    tok = make_tokenizer()
    llm = FakeLLM()
    llm.generation_config = {"eos_token_id": [7, tok.eos_token_id]}
    assert _vllm_backend(llm, monkeypatch).eos_ids == {7, tok.eos_token_id}
    backend = ScriptedBackend([[enc("<think> hmm") + [7]]], tok)
    cfg = RolloutConfig(max_turns=0, max_obs_length=60, max_total_length=400, topk=2)
    plain = run_agent_loop([row(0)], backend=backend, tokenizer=tok, retriever=DictRetriever(), cfg=cfg)
    backend = ScriptedBackend([[enc("<think> hmm") + [7]]], tok)
    backend.eos_ids = {7, tok.eos_token_id}
    counted = run_agent_loop([row(0)], backend=backend, tokenizer=tok, retriever=DictRetriever(), cfg=cfg)
    assert (plain[0].eos_stops, counted[0].eos_stops) == (0, 1)


def test_the_launchs_preflight_waits_for_a_service_still_starting():
    """A service answering 503 twice (still loading its index) is asked again when waiting, as its client would be,
    and refused at once when not; a port nobody listens on is given up after retriever.first_contact_s."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import httpx

    from conftest import free_port

    answers = [503, 503, 200]

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            status = answers.pop(0) if answers else 200
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"status": "ok" if status == 200 else "loading", "num_docs": 3}).encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    http = retriever.retriever_mode(RetrieverConfig(mode="http"))
    try:
        cfg = RetrieverConfig(mode="http", url=f"http://127.0.0.1:{server.server_address[1]}", backoff_s=0.01,
                              max_wait_s=5.0)
        assert http.health(cfg, wait=False)["status"] == "loading"  # as before: one request, whatever it says
        assert http.health(cfg, wait=True) == {"status": "ok", "num_docs": 3} and answers == []
    finally:
        server.shutdown()
    nobody = RetrieverConfig(mode="http", url=f"http://127.0.0.1:{free_port()}", backoff_s=0.05, first_contact_s=0.3)
    with pytest.raises(httpx.ConnectError):
        http.health(nobody, wait=True)


def test_train_py_runs_the_check_unless_told_not_to_and_a_refusal_exits_2(monkeypatch):
    """train.py hands ``--no-preflight`` to the trainer, and a refused start-up preflight is exit status 2 (the
    problems were printed by rank 0); its launch path turns on expandable_segments first."""
    from searchr1_lld.learner import command

    seen: list[bool] = []

    class RefusingTrainer:
        def __init__(self, cfg, run_dir=None, preflight=True):
            seen.append(preflight)
            raise startup.PreflightRefused(["plan: the rollout needs 90 GB"])

    monkeypatch.setattr(command, "Trainer", RefusingTrainer)
    monkeypatch.setattr(command, "check_model_sources", lambda cfg: None)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    world = types.SimpleNamespace(reference=lambda: "", overrides=lambda *a: [])
    assert command.run_train(command.TrainOptions(config="configs/tiny.yaml"), world) == 2
    assert command.run_train(command.TrainOptions(config="configs/tiny.yaml", no_preflight=True), world) == 2
    assert seen == [True, False]
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
