"""searchr1_lld.preflight.memory_plan: the arithmetic by hand on a small shape, Qwen2.5's parameter counts from their configs,
and every paper config lets its engine start and leaves 10 % of an 80 GB GPU free at the engine's first wake-up and
at the update, with the wiki-18 retriever's GPU shards beside it (docs/memory.md prints the same plans); the engine
as vLLM 0.32 sizes it: its start-up check, kv_cache_memory_bytes, its batch limits, what it keeps asleep."""

from __future__ import annotations

import glob

import pytest

from searchr1_lld.preflight import memory_plan as mp
from searchr1_lld.config import load_config

WIKI18 = (21_015_324, 768)  # passages x e5-base dimensions


def test_parameter_counts_of_qwen25():
    assert mp.QWEN25["3b"].params == pytest.approx(3.086e9, rel=1e-3)  # Qwen2.5-3B: 3.09 B (tied embeddings)
    assert mp.QWEN25["7b"].params == pytest.approx(7.616e9, rel=1e-3)  # Qwen2.5-7B: 7.62 B


def test_hand_computed_plan():
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    b = mp.Buckets(reduce=1e6, allgather=1e6, max_live=1e6, prefetch=1e6)
    assert mp.learner_bytes(shape, 2, 4, b) == 2e9 + 16e9 / 4 + 8e6 + 2e6
    assert mp.learner_bytes(shape, 3, 4, b) == 18e9 / 4 + 8e6
    # 100 tokens: kept 2 x 100 x 10 x 2 = 4000; layer 2 x 100 x (40 + 60) x 2 = 40000; full logits 2 x 100 x 100 x 2
    assert mp.activation_bytes(shape, 100, fused_head=False, zero_stage=3, buckets=b) == 4000 + 40000 + 40000 + 4e6
    plan = mp.gpu_memory_plan(shape, zero_stage=3, data_parallel=4, gpu_bytes=100e9, vllm_gpu_memory_utilization=0.5,
                              reference=True, micro_batch_tokens=100, retriever_bytes=3e9, buckets=b)
    resident = 18e9 / 4 + 8e6 + 2e9 / 4 + mp.CONTEXT_BYTES + 3e9
    assert plan.rollout == pytest.approx(resident + 50e9)
    assert plan.margin_at_wake_up_fraction == pytest.approx((100e9 - resident - 50e9) / 100e9)
    asleep = mp.ENGINE_ASLEEP_BYTES + mp.CUDA_GRAPH_POOL_BYTES  # bookkeeping and the graph pool; V2's sampler sleeps
    assert plan.engine_asleep == pytest.approx(asleep)
    assert plan.update == pytest.approx(resident + asleep + 84000 + 4e6)
    # runtime at vLLM's defaults (1,024 sequences, 16,384 tokens): penalty state 1,024 x (100 + 4) x 4 = 425,984,
    # logits 2 x 1,024 x 100 x 4 = 819,200, one layer of the profile pass 16,384 x (40 + 40) x 2 = 2,621,440
    assert plan.engine_overhead == 425_984 + 819_200 + 2_621_440
    assert plan.kv_cache == pytest.approx(50e9 - 2e9 - 3_866_624 - mp.CUDA_GRAPH_POOL_BYTES)
    # at the engine's start ZeRO-3 holds bf16 2P / 4 + fp32 master 4P / 4 + gradient partitions 4P / 4 = 2.5e9 (no
    # Adam state yet, no buckets); beside it the reference, contexts, retriever and vLLM's check of 0.5 x 100e9
    assert plan.learner_at_start == 2.5e9
    assert plan.engine_start == pytest.approx(2.5e9 + 0.5e9 + mp.CONTEXT_BYTES + 3e9 + 50e9)
    with pytest.raises(ValueError, match="zero_stage"):
        mp.learner_bytes(shape, 1, 4)  # ZeRO-1 is not in the arithmetic


def test_the_engine_claims_its_fraction_of_the_total_memory():
    plan = mp.gpu_memory_plan(mp.QWEN25["3b"], zero_stage=2, data_parallel=8, gpu_bytes=mp.H100_80GB,
                              vllm_gpu_memory_utilization=0.6, reference=True, micro_batch_tokens=65536)
    assert plan.engine_awake / mp.GB == pytest.approx(51.3, abs=0.05)  # not 0.6 x 80 = 48


def test_zero3_init_keeps_the_node_host_memory_bounded():
    seven = mp.QWEN25["7b"]
    full = mp.host_bytes_at_load(seven, ranks_per_node=8, zero3_init=False, reference=True)
    assert full / mp.GB > 480  # 8 ranks x (fp32 policy + fp32 reference)
    assert mp.host_bytes_at_load(seven, ranks_per_node=8, zero3_init=True, reference=True) / mp.GB < 110


def _paper_plan(path: str) -> mp.MemoryPlan:
    cfg = load_config(path)
    seven = "7b" in cfg.model.path.lower()
    return mp.gpu_memory_plan(
        mp.QWEN25["7b" if seven else "3b"], zero_stage=3 if seven else 2, data_parallel=8, gpu_bytes=mp.H100_80GB,
        vllm_gpu_memory_utilization=cfg.rollout.vllm.gpu_memory_utilization, reference=cfg.algorithm.kl_coef > 0,
        micro_batch_tokens=mp.pass_tokens(cfg.trainer.micro_batch_size, cfg.rollout.max_total_length,
                                          cfg.trainer.micro_batch_token_budget),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        retriever_bytes=mp.faiss_flat_shard_bytes(*WIKI18, 8))


@pytest.mark.parametrize("path", sorted(glob.glob("configs/paper/qwen2.5-*.yaml")))
def test_every_paper_config_keeps_ten_percent_free(path):
    plan = _paper_plan(path)
    assert plan.fits(), (path, plan.margin_at_engine_start, plan.margin_at_wake_up_fraction,
                         plan.margin_at_update_fraction)


def test_settings_below_the_floor():
    three = _paper_plan("configs/paper/qwen2.5-3b-base_nq_llds.yaml")
    at_06 = mp.gpu_memory_plan(mp.QWEN25["3b"], zero_stage=2, data_parallel=8, gpu_bytes=mp.H100_80GB,
                               vllm_gpu_memory_utilization=0.6, reference=True, micro_batch_tokens=16 * 4096,
                               retriever_bytes=three.retriever)
    assert at_06.margin_at_wake_up_fraction < mp.MARGIN_FLOOR < three.margin_at_wake_up_fraction
    sixteen = mp.gpu_memory_plan(mp.QWEN25["7b"], zero_stage=3, data_parallel=8, gpu_bytes=mp.H100_80GB,
                                 vllm_gpu_memory_utilization=0.5, reference=True, micro_batch_tokens=16 * 4096,
                                 retriever_bytes=three.retriever)
    assert sixteen.margin_at_update_fraction < 0  # ZeRO-3's full logits of 16 x 4096 tokens in one forward pass


def test_pass_tokens():
    assert mp.pass_tokens(16, 4096, 16384) == 16384  # a micro-batch of 16 runs in passes within the budget
    assert mp.pass_tokens(2, 4096, 16384) == 8192
    assert mp.pass_tokens(16, 4096, 1000) == 4096  # one response longer than the budget: a pass of its own
    assert mp.pass_tokens(0, 4096, 16384) == 16384


def test_docs_memory_shows_the_plans_of_the_paper_configs():
    from conftest import REPO_ROOT

    c3 = load_config("configs/paper/qwen2.5-3b-base_nq-hotpotqa_llds-ma.yaml")
    c7 = load_config("configs/paper/qwen2.5-7b-base_nq-hotpotqa_llds-ma.yaml")
    assert c7.trainer.micro_batch_size == c3.trainer.micro_batch_size
    table = mp.markdown_table(mp.paper_cells(*mp.paper_engines({"3b": c3, "7b": c7})))
    assert table in (REPO_ROOT / "docs" / "memory.md").read_text()  # regenerate: python -m searchr1_lld.preflight.memory_plan


def test_shape_of_a_text_config_and_an_exact_count():
    """A hand-counted Llama layout (no attention biases): hidden 4, heads 2 of 2 dims, 1 KV head, MLP 6, vocab 10:
    attention 4x4 + 2 x 4x2 + 4x4 = 48, MLP 3 x 4 x 6 = 72, norms 8, per layer 128; embeddings 40 (tied) or 80."""
    text = {"model_type": "llama", "hidden_size": 4, "num_hidden_layers": 1, "intermediate_size": 6,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10}
    assert mp.shape_from_hf_config({**text, "tie_word_embeddings": True}).params == 40 + 128 + 4
    assert mp.shape_from_hf_config(text).params == 80 + 128 + 4  # untied unless the config says otherwise
    assert mp.shape_from_hf_config({"text_config": text, "tie_word_embeddings": True}).params == 172
    shape = mp.shape_from_hf_config({"text_config": text}, params=170)  # a checkpoint's tensors counted
    assert (shape.params, shape.head_dim, shape.kv_heads) == (170, 2, 1)


def test_learners_without_deepspeed_and_with_the_optimizer_offloaded():
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    b = mp.Buckets(reduce=1e6, allgather=1e6, max_live=1e6, prefetch=1e6)
    assert mp.learner_bytes(shape, 0, 4, b) == 16e9  # fp32 weights, Adam m, v, fp32 gradients, all replicated
    ddp = mp.gpu_memory_plan(shape, zero_stage=0, data_parallel=4, gpu_bytes=100e9, vllm_gpu_memory_utilization=0.5,
                             reference=True, micro_batch_tokens=100)
    assert (ddp.learner, ddp.reference) == (16e9, 4e9)  # the reference in the policy's fp32
    assert mp.learner_bytes(shape, 2, 4, b, offload_optimizer=True) == 2e9 + 8e6 + 2e6
    assert mp.learner_bytes(shape, 3, 4, b, offload_optimizer=True) == 2e9 / 4 + 8e6
    assert mp.host_bytes_steady(shape, ranks_per_node=8, data_parallel=16, offload_optimizer=True,
                                parked_weights=True, index_bytes=1e9) == 8 * (16e9 / 16 + 2e9 + 1e9)
    assert mp.host_bytes_steady(shape, ranks_per_node=8, data_parallel=16, offload_optimizer=False,
                                parked_weights=False) == 0


def test_the_hf_engine_an_engine_that_never_sleeps_and_in_process_gpu_indexes():
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    assert mp.kv_cache_bytes(shape, 100) == 100 * 2 * 2 * 1 * 5 * 2
    common = {"data_parallel": 4, "gpu_bytes": 100e9, "vllm_gpu_memory_utilization": 0.5, "reference": False,
              "micro_batch_tokens": 100, "contexts": 0.0}
    hf3 = mp.gpu_memory_plan(shape, zero_stage=3, hf_engine_tokens=100, **common)
    assert (hf3.engine_awake, hf3.kv_cache, hf3.engine_asleep) == (4000 + 2e9, 4000, 2e9)  # ZeRO-3: a full copy
    assert hf3.update == hf3.learner + 2e9 + hf3.activations
    hf2 = mp.gpu_memory_plan(shape, zero_stage=2, hf_engine_tokens=100, **common)
    assert (hf2.engine_awake, hf2.engine_asleep) == (4000, 0)  # generates with the learner's own weights
    awake = mp.gpu_memory_plan(shape, zero_stage=2, engine_sleeps=False, **common)
    assert awake.update == awake.learner + 50e9 + awake.activations
    one = mp.faiss_flat_shard_bytes(100, 10, 4)
    assert one == 100 * 10 * 2 / 4 + mp.FAISS_TEMP_BYTES + mp.RETRIEVER_CONTEXT_BYTES
    assert mp.faiss_flat_shard_bytes(100, 10, 4, processes=4) == 4 * one


def test_activations_without_deepspeed_are_fp32():
    """fp32 weights under autocast keep the residual stream fp32: the checkpointed layer inputs and the hidden
    states fed to the head count 4 B, the recomputed layer's bf16 products 2 B. Hidden 10, 2 layers, MLP 20,
    vocab 100, 256 tokens (one tile of 256 rows: fewer tokens than algo.logprobs.tile_shape's CUDA rows)."""
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    layer = 2 * 256 * (40 + 60) * 2  # 102,400
    # logits path: kept 2 x 256 x 10 x 4 = 20,480; full logits and their gradient 2 x 256 x 100 x 2 = 102,400
    assert mp.activation_bytes(shape, 256, fused_head=False, zero_stage=0) == 20480 + layer + 102400
    assert mp.activation_bytes(shape, 256, fused_head=False, zero_stage=2) == 10240 + layer + 102400  # bf16
    # fused head: hidden states + gradient 2 x 256 x 10 x 4 = 20,480; tile 3 x 256 x 100 x 4 = 307,200; the head's
    # gradient accumulated in fp32 100 x 10 x 4 = 4,000 (already the fp32 weights' dtype: no second copy)
    assert mp.activation_bytes(shape, 256, fused_head=True, zero_stage=0) == 20480 + layer + 20480 + 307200 + 4000


def test_fused_head_holds_the_heads_fp32_gradient():
    """bf16 weights (ZeRO-2): the fused head's backward accumulates dL/dW [V, H] in fp32 (4 B) and returns its bf16
    cast (2 B), both alive at its end. Same small shape, 256 tokens: kept 2 x 256 x 10 x 2 = 10,240, hidden states
    + gradient 2 x 256 x 10 x 2 = 10,240, tile 3 x 256 x 100 x 4 = 307,200, head gradient 100 x 10 x 6 = 6,000."""
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    layer = 2 * 256 * (40 + 60) * 2
    assert mp.activation_bytes(shape, 256, fused_head=True, zero_stage=2) == 10240 + layer + 10240 + 307200 + 6000


def test_fused_head_tiles_have_the_rows_the_code_uses():
    """Qwen2.5-3B, ZeRO-2, a pass of 16,384 tokens: the CUDA tile is the whole vocabulary and 256 MiB / (4 B x
    151,936) = 441.7 rows, rounded down to a multiple of 64: 384 rows. By hand:
    kept 36 x 16,384 x 2,048 x 2 = 2,415,919,104; layer 2 x 16,384 x (4 x 2,048 + 3 x 11,008) x 2 = 2,701,131,776;
    hidden states + gradient 2 x 16,384 x 2,048 x 2 = 134,217,728; tile 3 x 384 x 151,936 x 4 = 700,121,088;
    head gradient 151,936 x 2,048 x (4 + 2) = 1,866,989,568."""
    from searchr1_lld.algo.logprobs import tile_shape

    assert tile_shape(151936, "cuda") == (384, 151936)
    total = 2_415_919_104 + 2_701_131_776 + 134_217_728 + 700_121_088 + 1_866_989_568
    assert mp.activation_bytes(mp.QWEN25["3b"], 16384, fused_head=True, zero_stage=2) == total
    # a pass shorter than the tile's rows: a tile of 100 rows
    small = mp.activation_bytes(mp.QWEN25["3b"], 100, fused_head=True, zero_stage=2)
    assert small == 36 * 100 * 2048 * 2 + 2 * 100 * 41216 * 2 + 2 * 100 * 2048 * 2 + 3 * 100 * 151936 * 4 \
        + 151936 * 2048 * 6


def test_a_sleeping_vllm_engine_keeps_its_graph_pool_and_not_the_v2_sampler_state():
    """vLLM 0.32 builds Model Runner V2's sampler (its output bin counts) in load_model, inside the weights'
    sleep-mode pool: asleep the engine keeps its bookkeeping and its CUDA-graph pool, nothing per sequence; an eager
    engine or one that offloads its graphs (sleep_mode_offload_cudagraph) keeps only the bookkeeping."""
    qwen = mp.QWEN25["3b"]
    assert mp.vllm_asleep_bytes() == mp.ENGINE_ASLEEP_BYTES + mp.CUDA_GRAPH_POOL_BYTES
    assert mp.vllm_asleep_bytes(offload_cudagraph=True) == mp.vllm_asleep_bytes(graph_pool_bytes=0.0) == \
        mp.ENGINE_ASLEEP_BYTES
    common = dict(zero_stage=2, data_parallel=8, gpu_bytes=mp.H100_80GB, vllm_gpu_memory_utilization=0.5,
                  reference=True, micro_batch_tokens=16384)
    graphs, eager = mp.gpu_memory_plan(qwen, **common), mp.gpu_memory_plan(qwen, graph_pool_bytes=0.0, **common)
    offloaded = mp.gpu_memory_plan(qwen, engine=mp.EngineSettings(0.5, offload_cudagraph=True), **common)
    assert graphs.engine_asleep - eager.engine_asleep == mp.CUDA_GRAPH_POOL_BYTES
    assert eager.engine_asleep == offloaded.engine_asleep == mp.ENGINE_ASLEEP_BYTES
    assert graphs.update - eager.update == mp.CUDA_GRAPH_POOL_BYTES
    # the graph pool is inside the awake claim (vLLM profiles it since 0.21): the KV cache is smaller by it
    assert eager.kv_cache - graphs.kv_cache == mp.CUDA_GRAPH_POOL_BYTES
    # the sampler state a 1,024-sequence engine holds while awake: 1,024 x (151,936 + 4,748) x 4 B = 0.64 GB
    bins = 1024 * (151_936 + 4_748) * 4
    assert round(bins / mp.GB, 2) == 0.64
    assert mp.vllm_runtime_bytes(qwen, max_num_seqs=1024, max_num_batched_tokens=0) == bins + 2 * 1024 * 151_936 * 4


def test_kv_cache_bytes_size_the_engine_and_the_start_check_stays():
    """With kv_cache_memory_bytes vLLM 0.32 sizes its KV cache from it (gpu_worker.determine_available_memory) and
    still checks at start that utilisation x total is free (worker/utils.request_memory). Small shape, 100e9 GPU,
    ZeRO-2 on 4 ranks, no reference or context: learner 2e9 + 16e9 / 4 + buckets 8e6 + 2e6 = 6.01e9, at start 2e9 +
    4e9 / 4 = 3e9."""
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    b = mp.Buckets(reduce=1e6, allgather=1e6, max_live=1e6, prefetch=1e6)
    common = dict(zero_stage=2, data_parallel=4, gpu_bytes=100e9, vllm_gpu_memory_utilization=0.5, reference=False,
                  micro_batch_tokens=100, buckets=b, contexts=0.0)
    engine = mp.EngineSettings(0.5, kv_cache_memory_bytes=int(95e9), max_num_seqs=10, max_num_batched_tokens=100)
    plan = mp.gpu_memory_plan(shape, engine=engine, **common)
    runtime = 10 * 104 * 4 + 2 * 10 * 100 * 4 + 100 * 80 * 2  # penalties, logits, one profile layer: 28,160
    assert plan.engine_overhead == runtime
    assert plan.engine_awake == pytest.approx(2e9 + runtime + mp.CUDA_GRAPH_POOL_BYTES + 95e9)
    assert plan.kv_cache == pytest.approx(95e9)
    assert plan.learner_at_start == 3e9 and plan.engine_start == pytest.approx(3e9 + 50e9)
    assert plan.margin_at_engine_start > 0 and plan.margin_at_wake_up < 0 and not plan.fits()  # starts, then fails
    by_util = mp.gpu_memory_plan(shape, **common)  # the same run planned from the utilisation alone: it fits
    assert by_util.fits() and by_util.engine_awake == 50e9
    # a utilisation whose claim is not free at the start fails there, whatever the KV cache
    greedy = mp.gpu_memory_plan(shape, engine=mp.EngineSettings(0.98, kv_cache_memory_bytes=int(1e9)), **common)
    assert greedy.margin_at_engine_start == pytest.approx(100e9 - 3e9 - 98e9) and not greedy.fits()
    assert greedy.margin_at_wake_up_fraction > mp.MARGIN_FLOOR  # the wake-up itself would fit
    with pytest.raises(ValueError, match="vllm_kv_cache_memory_bytes"):
        mp.EngineSettings(0.5, kv_cache_memory_bytes=-1)


def test_learner_states_at_the_engines_start():
    """What DeepSpeed 0.19.8 has allocated when the engine is built (P = 1e9, N = 4): ZeRO-2 bf16 2P + fp32 master
    4P / N = 2e9 + 1e9; ZeRO-3 bf16 2P / N + fp32 master and gradient partitions 8P / N = 0.5e9 + 2e9; offloaded,
    the fp32 parts leave the GPU; without DeepSpeed fp32 weights 4P, and DDP's buckets 4P more on several ranks."""
    shape = mp.ModelShape(params=1e9, layers=2, hidden=10, intermediate=20, kv_heads=1, head_dim=5, vocab=100)
    assert mp.learner_bytes_at_start(shape, 2, 4) == 3e9
    assert mp.learner_bytes_at_start(shape, 3, 4) == 2.5e9
    assert mp.learner_bytes_at_start(shape, 2, 4, offload_optimizer=True) == 2e9
    assert mp.learner_bytes_at_start(shape, 3, 4, offload_optimizer=True) == 0.5e9
    assert (mp.learner_bytes_at_start(shape, 0, 1), mp.learner_bytes_at_start(shape, 0, 4)) == (4e9, 8e9)
    with pytest.raises(ValueError, match="zero_stage"):
        mp.learner_bytes_at_start(shape, 1, 4)


def test_the_engines_batch_sizes_its_runtime():
    """Qwen2.5-3B: the paper's engine (640 sequences, 4,096 batched tokens) against vLLM's 80 GB defaults (1,024,
    16,384). Penalties 640 x 156,684 x 4 = 401,111,040; logits 2 x 640 x 151,936 x 4 = 777,912,320; one layer of
    4,096 tokens x (4 x 2,048 + 2 x 11,008) x 2 = 247,463,936."""
    qwen = mp.QWEN25["3b"]
    paper = mp.vllm_runtime_bytes(qwen, max_num_seqs=640, max_num_batched_tokens=4096)
    assert paper == 401_111_040 + 777_912_320 + 247_463_936
    assert mp.vllm_runtime_bytes(qwen) - paper == 384 * 156_684 * 4 + 2 * 384 * 151_936 * 4 + 12288 * 30208 * 2
