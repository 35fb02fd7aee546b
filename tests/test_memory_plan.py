"""searchr1_lld.preflight.memory_plan: the arithmetic by hand on a small shape, Qwen2.5's parameter counts from their configs,
and every paper config leaves 10 % of an 80 GB GPU free at the engine's first wake-up and at the update, with the
wiki-18 retriever's GPU shards beside it (docs/memory.md prints the same plans)."""

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
    asleep = mp.ENGINE_ASLEEP_BYTES + 1024 * (100 + 4) * 4 + mp.CUDA_GRAPH_POOL_BYTES  # bin counts and mask, graphs
    assert plan.engine_asleep == pytest.approx(asleep)
    assert plan.update == pytest.approx(resident + asleep + 84000 + 4e6)
    assert plan.kv_cache == pytest.approx(50e9 - 2e9 - 2e9)
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
        vllm_gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization, reference=cfg.algorithm.kl_coef > 0,
        micro_batch_tokens=mp.pass_tokens(cfg.trainer.micro_batch_size, cfg.rollout.max_total_length,
                                          cfg.trainer.micro_batch_token_budget),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        retriever_bytes=mp.faiss_flat_shard_bytes(*WIKI18, 8))


@pytest.mark.parametrize("path", sorted(glob.glob("configs/paper/qwen2.5-*.yaml")))
def test_every_paper_config_keeps_ten_percent_free(path):
    plan = _paper_plan(path)
    assert plan.fits(), (path, plan.margin_at_wake_up_fraction, plan.margin_at_update_fraction)


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
    tokens = mp.pass_tokens(c3.trainer.micro_batch_size, c3.rollout.max_total_length,
                            c3.trainer.micro_batch_token_budget)
    assert c7.trainer.micro_batch_size == c3.trainer.micro_batch_size
    table = mp.markdown_table(mp.paper_cells(c3.rollout.vllm_gpu_memory_utilization,
                                             c7.rollout.vllm_gpu_memory_utilization, tokens))
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


def test_a_sleeping_vllm_engine_keeps_its_bin_counts_and_graph_pool():
    """Model Runner V2 allocates output bin counts of max_num_seqs x V int32 outside the sleep-mode pool: 0.62 GB at
    1,024 sequences x 151,936 (Qwen2.5); the CUDA-graph pool stays too, unless the engine runs eagerly."""
    qwen = mp.QWEN25["3b"]
    assert qwen.vocab == 151_936
    bins = mp.vllm_asleep_bytes(qwen, graph_pool_bytes=0.0) - mp.ENGINE_ASLEEP_BYTES
    assert bins == 1024 * (151_936 + 4_748) * 4 and round(bins / mp.GB, 2) == 0.64  # 0.62 counts + 0.02 mask
    common = dict(zero_stage=2, data_parallel=8, gpu_bytes=mp.H100_80GB, vllm_gpu_memory_utilization=0.5,
                  reference=True, micro_batch_tokens=16384)
    graphs, eager = mp.gpu_memory_plan(qwen, **common), mp.gpu_memory_plan(qwen, graph_pool_bytes=0.0, **common)
    assert graphs.engine_asleep - eager.engine_asleep == mp.CUDA_GRAPH_POOL_BYTES
    assert eager.engine_asleep == pytest.approx(mp.ENGINE_ASLEEP_BYTES + bins)
    assert graphs.update - eager.update == mp.CUDA_GRAPH_POOL_BYTES
