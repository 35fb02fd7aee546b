"""What one GPU holds at each phase of a training step, and the host memory of the model load: pure arithmetic
(numbers in, numbers out; no I/O; torch is imported only for the CUDA log-prob tile's rows, which
algo.logprobs.tile_shape decides). docs/memory.md prints these plans for the paper's cells; the run's preflight
prints the plan of its own config.

    plan = gpu_memory_plan(QWEN25["3b"], zero_stage=2, data_parallel=8, gpu_bytes=H100_80GB,
                           vllm_gpu_memory_utilization=0.55, reference=True,
                           micro_batch_tokens=pass_tokens(16, 4096, 16384),
                           fused_head=True, retriever_bytes=faiss_flat_shard_bytes(21_015_324, 768, 8))
    plan.margin_at_wake_up_fraction   # what is left of the GPU when the engine wakes up after an update

Per GPU (N = data-parallel ranks, P = parameters, bf16 training under DeepSpeed, fp32 gradient reduction and
accumulation as configs/deepspeed/*.json set them):

    learner     ZeRO-2: bf16 weights 2P + (fp32 master 4P + Adam m, v 8P + fp32 gradients 4P) / N + buckets
                ZeRO-3: (bf16 weights 2P + fp32 master 4P + Adam 8P + fp32 gradients 4P) / N + buckets
                buckets: reduce bucket x (2 B bf16 x 2 double-buffered + 4 B fp32 copy) (+ ZeRO-2 all-gather x 2 B)
                offload_optimizer: the (4P + 8P + 4P) / N of master, Adam and gradient partition live in host memory
                no DeepSpeed (stage 0: DDP or one process): fp32 weights 4P (autocast), Adam 8P, gradients 4P
    reference   in the policy's dtype, when the KL term is on: bf16 2P (ZeRO-2) or 2P / N (ZeRO-3); fp32 4P without
                DeepSpeed
    contexts    CUDA context, NCCL and allocator slack of the training process (the engine runs in it)
    retriever   the FAISS shard the co-located `retriever serve --gpu-index` puts on this GPU (+ its temp memory
                and CUDA context), or the whole index an in-process retriever.use_gpu_index puts on its rank's GPU
    engine      vLLM (0.32, vllm/v1/worker/) first checks that gpu_memory_utilization x the GPU's *total* memory
                is free when it starts (worker/utils.py request_memory), whatever sizes its KV cache. Awake it holds
                that claim (weights 2P, its runtime, the CUDA-graph pool, the KV cache in what is left:
                determine_available_memory) or, with kv_cache_memory_bytes, weights + runtime + graph pool + exactly
                those bytes. Its runtime (vllm_runtime_bytes) grows with max_num_seqs and max_num_batched_tokens:
                Model Runner V2's per-request penalty state max_num_seqs x (V + V / 32) x 4 B, the fp32 logits of
                max_num_seqs rows twice, one layer of the profile pass over max_num_batched_tokens tokens. Asleep
                (level 1 or 2) it keeps its bookkeeping (ENGINE_ASLEEP_BYTES) and its CUDA-graph pool unless
                sleep_mode_offload_cudagraph backs it up to host memory; the V2 sampler state lives in the weights'
                sleep-mode pool (the model runner builds it in load_model) and goes with them. Without sleep mode its
                whole footprint stays through the update. The HF engine: the KV cache of its batch, tokens x 2 x
                layers x kv_heads x head_dim x 2 B (freed for the update), plus under ZeRO-3 a full bf16 copy of the
                weights 2P
    activations update phase, one forward pass of T padded tokens (pass_tokens), with a = the bytes of the
                weights' dtype (2: bf16 under DeepSpeed; 4: fp32 weights under autocast without it, whose residual
                stream, norms and final hidden states stay fp32): checkpointed layer inputs L T H a, one layer
                recomputed 2 T (4H + 3I) 2 B (autocast's matrix products are bf16 either way), and the log-prob
                head. Fused head (chunked from the hidden states, algo.logprobs.linear_logprobs_entropy): the hidden
                states and their gradient 2 T H a, three fp32 buffers of one CUDA tile 3 x rows x V x 4 B
                (rows: algo.logprobs.tile_shape, 384 at V = 151,936; T when fewer), and the head's gradient,
                accumulated in fp32 V H 4 B (+ its copy in the weights' dtype, V H 2 B, when that is bf16); under
                ZeRO-3, the full logits T V 2 B and their gradient

Three moments decide whether a run gets through its first step: the engine's start (the learner holds its set-up
states, learner_bytes_at_start, and vLLM wants its utilisation claim free), the update (the learner's peak beside
the sleeping engine) and the engine's first wake-up after an optimiser step (every learner buffer then exists, and
the engine maps its whole footprint again).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1_lld.config import Config

GB = 1e9
H100_80GB = 81_559 * 2**20  # total memory CUDA reports for an 80 GB H100 (what vLLM multiplies its fraction by)
CONTEXT_BYTES = 1.5 * GB  # CUDA context + NCCL buffers + allocator slack of one training process
ENGINE_ASLEEP_BYTES = 0.5 * GB  # vLLM asleep: its allocator's bookkeeping and small buffers
# vLLM's batch defaults for an LLM on a GPU of >= 70 GiB (H100, H200; engine/arg_utils.py get_batch_defaults: 256 and
# 8,192 on smaller ones); Model Runner V2 sizes its per-request state and its profiling pass by them. The training
# engine passes its own (rollout/backends/vllm.py engine_batch).
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 16384
# the CUDA-graph pool a vLLM engine keeps through sleep (captured graphs live in PyTorch's graph pool, outside the
# sleep-mode allocator): an allowance, not measured here; vLLM logs its own figure at start-up ("CUDA graph pool
# memory: X GiB (actual)"), and an engine with rollout.vllm.enforce_eager has none
CUDA_GRAPH_POOL_BYTES = 1.0 * GB
FAISS_TEMP_BYTES = 1.5 * 2**30  # StandardGpuResources' default temporary memory per GPU
RETRIEVER_CONTEXT_BYTES = 0.5 * GB  # the retriever process's CUDA context on each GPU it uses
MARGIN_FLOOR = 0.10  # configs keep at least this fraction of the GPU free at the first wake-up


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a decoder-only transformer (Qwen2 / Llama layout)."""

    params: float  # P, counted once when embeddings are tied
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int


def shape_from_hf_config(config: dict, params: float | None = None) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (Qwen2 / Llama fields; a multimodal config's
    ``text_config``), parameters counted from it: embeddings V H (twice when untied), per layer q, k, v (with biases
    when ``attention_bias`` or Qwen2), o, the gated MLP 3 H I and two norms, and the final norm. ``params``: an
    exact count (the checkpoint's tensors) in place of the counted one."""
    tie = config.get("tie_word_embeddings")
    config = config.get("text_config") or config
    tie = config.get("tie_word_embeddings", False) if tie is None else tie
    h, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    hd = config.get("head_dim") or h // heads
    v = config["vocab_size"]
    bias = config.get("attention_bias", config.get("model_type") == "qwen2")
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + (heads * hd + 2 * kv * hd if bias else 0)
    per_layer = attn + 3 * h * inter + 2 * h
    emb = v * h * (1 if tie else 2)
    counted = float(emb + layers * per_layer + h)
    return ModelShape(params=float(params) if params else counted, layers=layers, hidden=h, intermediate=inter,
                      kv_heads=kv, head_dim=hd, vocab=v)


# Qwen2.5 base / instruct (the paper's models), from their config.json
QWEN25 = {
    "3b": shape_from_hf_config({"hidden_size": 2048, "num_hidden_layers": 36, "intermediate_size": 11008,
                                "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                                "tie_word_embeddings": True, "model_type": "qwen2"}),
    "7b": shape_from_hf_config({"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944,
                                "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                                "tie_word_embeddings": False, "model_type": "qwen2"}),
}


@dataclass(frozen=True)
class Buckets:
    """DeepSpeed's communication buffers in elements (configs/deepspeed/*.json)."""

    reduce: float = 2e8
    allgather: float = 2e8  # ZeRO-2 only
    max_live: float = 3e8  # ZeRO-3: gathered parameters alive at once (update phase)
    prefetch: float = 5e7  # ZeRO-3


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU, phase by phase (module docstring)."""

    gpu: float
    learner: float
    reference: float
    contexts: float
    retriever: float
    engine_awake: float
    engine_weights: float
    activations: float
    engine_asleep: float = ENGINE_ASLEEP_BYTES  # what the engine keeps through the update
    engine_overhead: float = 2 * GB  # the engine's runtime inside its footprint (vllm_runtime_bytes)
    engine_graphs: float = 0.0  # its CUDA-graph pool, inside its footprint
    engine_start_claim: float = 0.0  # what vLLM wants free when it starts (utilisation x total; 0: no such check)
    learner_at_start: float | None = None  # the learner's states when the engine starts (None: all of them)

    @property
    def kv_cache(self) -> float:
        """What the engine's footprint holds as KV cache (its weights, runtime and graph pool out)."""
        return max(self.engine_awake - self.engine_weights - self.engine_overhead - self.engine_graphs, 0.0)

    @property
    def resident(self) -> float:
        """Held through every phase: learner states, reference, contexts, retriever shard."""
        return self.learner + self.reference + self.contexts + self.retriever

    @property
    def engine_start(self) -> float:
        """What the GPU must hold when the engine starts: the learner's set-up states, the reference, contexts and
        retriever, and the engine's claim."""
        learner = self.learner if self.learner_at_start is None else self.learner_at_start
        return learner + self.reference + self.contexts + self.retriever + self.engine_start_claim

    @property
    def rollout(self) -> float:
        return self.resident + self.engine_awake

    @property
    def update(self) -> float:
        return self.resident + self.engine_asleep + self.activations

    @property
    def margin_at_engine_start(self) -> float:
        return self.gpu - self.engine_start

    @property
    def margin_at_wake_up(self) -> float:
        return self.gpu - self.rollout

    @property
    def margin_at_wake_up_fraction(self) -> float:
        return self.margin_at_wake_up / self.gpu

    @property
    def margin_at_update_fraction(self) -> float:
        return (self.gpu - self.update) / self.gpu

    def fits(self, floor: float = MARGIN_FLOOR) -> bool:
        """The engine can start (its claim is free), and the wake-up and the update leave at least ``floor`` of the
        GPU free."""
        return (self.margin_at_engine_start >= 0 and self.margin_at_wake_up_fraction >= floor
                and self.margin_at_update_fraction >= floor)


def pass_tokens(micro_batch_size: int, max_total_length: int, token_budget: int) -> int:
    """Padded tokens of the largest forward pass of the update (batching.plan_updates): a micro-batch of
    ``micro_batch_size`` responses (0: cut by the budget alone) runs in passes within ``token_budget``, and a single
    response longer than the budget gets a pass of its own."""
    cap = max(token_budget, max_total_length)
    return min(micro_batch_size * max_total_length, cap) if micro_batch_size else cap


def faiss_flat_shard_bytes(num_vectors: int, dim: int, gpus: int, *, fp16: bool = True, processes: int = 1) -> float:
    """Per GPU: a Flat index sharded over ``gpus`` (``retriever serve --gpu-index``: fp16 codes), FAISS's temporary
    memory and the retriever's CUDA context; ``processes`` that each shard their own copy over the same GPUs
    (``retriever.use_gpu_index`` in-process: every rank of the node) multiply it."""
    return processes * (num_vectors * dim * (2 if fp16 else 4) / gpus + FAISS_TEMP_BYTES + RETRIEVER_CONTEXT_BYTES)


def kv_cache_bytes(shape: ModelShape, tokens: int) -> float:
    """bf16 KV cache of ``tokens`` positions: tokens x 2 (K, V) x layers x kv_heads x head_dim x 2 B."""
    return float(tokens) * 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def learner_bytes(shape: ModelShape, zero_stage: int, data_parallel: int, buckets: Buckets = Buckets(), *,
                  offload_optimizer: bool = False) -> float:
    """DeepSpeed ZeRO-2 / ZeRO-3 states of one rank, buffers included, or (``zero_stage`` 0) a learner without
    DeepSpeed (module docstring)."""
    p, n = shape.params, data_parallel
    on_gpu = 0.0 if offload_optimizer else 16 * p / n  # fp32 master + Adam m, v + fp32 gradient partition
    if zero_stage == 0:
        return 16 * p
    if zero_stage == 2:
        return 2 * p + on_gpu + buckets.reduce * 8 + buckets.allgather * 2
    if zero_stage == 3:
        return 2 * p / n + on_gpu + buckets.reduce * 8
    raise ValueError(f"zero_stage must be 0 (no DeepSpeed), 2 or 3; got {zero_stage}")


def learner_bytes_at_start(shape: ModelShape, zero_stage: int, data_parallel: int, *,
                           offload_optimizer: bool = False) -> float:
    """The learner's states when the engine starts (after ``accelerator.prepare``, before the first backward and
    optimiser step; DeepSpeed 0.19.8): ZeRO-2 bf16 weights 2P and the fp32 master 4P / N (Adam's m, v come with the
    first step: stage_1_and_2.initialize_optimizer_states leaves them to it; the gradient partition and the buckets
    with the first backward); ZeRO-3 bf16 2P / N, the fp32 master 4P / N and the fp32 gradient partitions 4P / N
    (stage3 allocates them at set-up); offload_optimizer: the fp32 parts in host memory. Without DeepSpeed: fp32
    weights 4P, and DDP's gradient buckets 4P when ``data_parallel`` > 1 (torch allocates them when it wraps the
    model)."""
    p, n = shape.params, data_parallel
    if zero_stage == 0:
        return 4 * p + (4 * p if n > 1 else 0.0)
    if zero_stage == 2:
        return 2 * p + (0.0 if offload_optimizer else 4 * p / n)
    if zero_stage == 3:
        return 2 * p / n + (0.0 if offload_optimizer else 8 * p / n)
    raise ValueError(f"zero_stage must be 0 (no DeepSpeed), 2 or 3; got {zero_stage}")


def activation_bytes(shape: ModelShape, tokens: int, *, fused_head: bool, zero_stage: int,
                     gradient_checkpointing: bool = True, buckets: Buckets = Buckets()) -> float:
    """Update-phase peak of one micro-batch of ``tokens`` (padded) positions (module docstring); ZeRO-3 adds the
    gathered parameters alive at once. ``zero_stage`` 0 (no DeepSpeed): fp32 weights, so fp32 residual stream."""
    from searchr1_lld.algo.logprobs import tile_shape  # deferred: torch (pure arithmetic otherwise; one figure needs it)

    t, h, v = float(tokens), shape.hidden, shape.vocab
    weight_bytes = 4 if zero_stage == 0 else 2
    layer = 2 * t * (4 * h + 3 * shape.intermediate) * 2
    kept = shape.layers * t * h * weight_bytes if gradient_checkpointing else shape.layers * layer
    if fused_head:
        tile_rows = min(tile_shape(v, "cuda")[0], t)  # a pass of fewer tokens is one tile of its own rows
        head_grad = v * h * 4 + (v * h * weight_bytes if weight_bytes < 4 else 0)  # fp32 accumulator (+ its cast)
        head = 2 * t * h * weight_bytes + 3 * tile_rows * v * 4 + head_grad
    else:
        head = 2 * t * v * 2
    live = (buckets.max_live + buckets.prefetch) * 2 if zero_stage == 3 else 0.0
    return kept + layer + head + live


def vllm_runtime_bytes(shape: ModelShape, *, max_num_seqs: int = VLLM_MAX_NUM_SEQS,
                       max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS) -> float:
    """A vLLM engine's memory besides its weights, KV cache and CUDA graphs, as its batch settings size it (an
    estimate; vLLM logs its own at start-up): Model Runner V2's per-request penalty state
    (vllm/v1/worker/gpu/sample/penalties.py: output bin counts ``max_num_seqs x V`` int32, prompt bin mask
    ``max_num_seqs x ceil(V / 32)`` int32), the fp32 logits of ``max_num_seqs`` sampled rows twice (raw, then
    processed), and one layer of the profile pass over ``max_num_batched_tokens`` tokens in bf16, T (4H + 2I) 2 B
    (residual, normed input, attention output and q/k/v; the gated MLP's two halves)."""
    v = shape.vocab
    penalties = max_num_seqs * (v + -(-v // 32)) * 4
    logits = 2 * max_num_seqs * v * 4
    layer = max_num_batched_tokens * (4 * shape.hidden + 2 * shape.intermediate) * 2
    return float(penalties + logits + layer)


def vllm_asleep_bytes(*, graph_pool_bytes: float = CUDA_GRAPH_POOL_BYTES, offload_cudagraph: bool = False) -> float:
    """What a vLLM engine keeps on the GPU asleep (level 1 or 2): its allocator's bookkeeping (ENGINE_ASLEEP_BYTES)
    and its CUDA-graph pool, captured outside the sleep-mode pool unless ``offload_cudagraph``
    (``sleep_mode_offload_cudagraph``: backed up to host memory at sleep, restored at wake-up). Model Runner V2's
    sampler state is built inside the weights' sleep-mode pool (GPUModelRunner.load_model runs under the worker's
    ``weights`` tag) and freed with them; the runner's other runtime buffers are offloaded (CuMemBackend.suspend
    keeps the ``runtime`` and ``cudagraph`` tags in host memory)."""
    return ENGINE_ASLEEP_BYTES + (0.0 if offload_cudagraph else graph_pool_bytes)


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM settings that change its memory (what the engine is built with: rollout/backends/vllm.py)."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int = 0  # 0: the KV cache is what the utilisation claim leaves
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS
    sleeps: bool = True  # sleep mode: the engine hands its memory back for the update
    graph_pool_bytes: float = CUDA_GRAPH_POOL_BYTES  # 0: an eager engine
    offload_cudagraph: bool = False  # sleep_mode_offload_cudagraph

    @classmethod
    def of(cls, values: dict[str, Any]) -> EngineSettings:
        """From a backend kind's ``engine_memory`` (rollout/backends/vllm_settings.memory_settings: these fields,
        with ``eager``, no CUDA graphs, in place of ``graph_pool_bytes``)."""
        values = dict(values)
        graphs = 0.0 if values.pop("eager") else CUDA_GRAPH_POOL_BYTES
        return cls(graph_pool_bytes=graphs, **values)

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1]; got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_bytes < 0:
            raise ValueError(f"vllm_kv_cache_memory_bytes must be >= 0; got {self.kv_cache_memory_bytes}")


def vllm_engine_bytes(shape: ModelShape, engine: EngineSettings, gpu_bytes: float) -> dict[str, float]:
    """The engine's parts of a :class:`MemoryPlan`: its footprint awake, weights, runtime, graph pool, what it keeps
    asleep and what it wants free at its start (module docstring)."""
    weights = 2 * shape.params
    runtime = vllm_runtime_bytes(shape, max_num_seqs=engine.max_num_seqs,
                                 max_num_batched_tokens=engine.max_num_batched_tokens)
    claim = engine.gpu_memory_utilization * gpu_bytes
    awake = (weights + runtime + engine.graph_pool_bytes + engine.kv_cache_memory_bytes
             if engine.kv_cache_memory_bytes else claim)
    asleep = (vllm_asleep_bytes(graph_pool_bytes=engine.graph_pool_bytes, offload_cudagraph=engine.offload_cudagraph)
              if engine.sleeps else awake)
    return dict(engine_awake=awake, engine_weights=weights, engine_overhead=runtime,
                engine_graphs=engine.graph_pool_bytes, engine_asleep=asleep, engine_start_claim=claim)


def gpu_memory_plan(shape: ModelShape, *, zero_stage: int, data_parallel: int, gpu_bytes: float,
                    vllm_gpu_memory_utilization: float, reference: bool, micro_batch_tokens: int,
                    fused_head: bool | None = None, retriever_bytes: float = 0.0,
                    gradient_checkpointing: bool = True, buckets: Buckets = Buckets(),
                    offload_optimizer: bool = False, engine_sleeps: bool = True, hf_engine_tokens: int | None = None,
                    contexts: float = CONTEXT_BYTES, graph_pool_bytes: float = CUDA_GRAPH_POOL_BYTES,
                    engine: EngineSettings | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of one GPU that holds a learner rank and its vLLM engine (and, with
    ``retriever_bytes``, a shard of a co-located GPU retriever). ``fused_head`` (default: not ZeRO-3): log-probs from
    the hidden states chunk by chunk (policy_logprobs); False = the full logits are materialised. ``engine``: the
    vLLM settings that change its memory (default: ``vllm_gpu_memory_utilization``, vLLM's batch defaults,
    ``engine_sleeps``, ``graph_pool_bytes``: its CUDA-graph pool, 0 for an eager engine). ``hf_engine_tokens``: the
    HF engine in place of vLLM, with a KV cache of that many tokens (generation_batch_size x max_total_length;
    the vLLM settings unused)."""
    fused = zero_stage != 3 if fused_head is None else fused_head
    ref = ((4 if zero_stage == 0 else 2) * shape.params / (data_parallel if zero_stage == 3 else 1)) if reference \
        else 0.0
    if hf_engine_tokens is not None:
        copy = 2 * shape.params if zero_stage == 3 else 0.0  # ZeRO-3's partitioned weights cannot generate
        parts = dict(engine_awake=kv_cache_bytes(shape, hf_engine_tokens) + copy, engine_weights=copy,
                     engine_asleep=copy, engine_overhead=0.0)
    else:
        engine = engine or EngineSettings(vllm_gpu_memory_utilization, sleeps=engine_sleeps,
                                          graph_pool_bytes=graph_pool_bytes)
        parts = vllm_engine_bytes(shape, engine, gpu_bytes)
    return MemoryPlan(
        gpu=float(gpu_bytes), reference=ref, contexts=float(contexts), retriever=float(retriever_bytes),
        learner=learner_bytes(shape, zero_stage, data_parallel, buckets, offload_optimizer=offload_optimizer),
        learner_at_start=learner_bytes_at_start(shape, zero_stage, data_parallel, offload_optimizer=offload_optimizer),
        activations=activation_bytes(shape, micro_batch_tokens, fused_head=fused, zero_stage=zero_stage,
                                     gradient_checkpointing=gradient_checkpointing, buckets=buckets), **parts)


def learner_plan(shape: ModelShape, *, zero_stage: int, data_parallel: int, reference: bool, micro_batch_tokens: int,
                 gpu_bytes: float = H100_80GB, fused_head: bool | None = None, gradient_checkpointing: bool = True,
                 buckets: Buckets = Buckets()) -> MemoryPlan:
    """The learner alone on its GPU, as :func:`gpu_memory_plan` computes it but with no engine, retriever or CUDA
    context: ``update`` is then what PyTorch's allocator holds at the update's peak (the figure
    ``torch.cuda.max_memory_allocated`` reports: benchmarks/gpu_check.py's ``*_peak_gib``), and ``resident`` the
    learner states and the reference."""
    plan = gpu_memory_plan(shape, zero_stage=zero_stage, data_parallel=data_parallel, gpu_bytes=gpu_bytes,
                           vllm_gpu_memory_utilization=1.0, reference=reference, micro_batch_tokens=micro_batch_tokens,
                           fused_head=fused_head, gradient_checkpointing=gradient_checkpointing, buckets=buckets,
                           contexts=0.0)
    return replace(plan, engine_awake=0.0, engine_weights=0.0, engine_asleep=0.0, engine_overhead=0.0,
                   engine_graphs=0.0, engine_start_claim=0.0)


def host_bytes_at_load(shape: ModelShape, *, ranks_per_node: int, zero3_init: bool, reference: bool,
                       checkpoint_shard_bytes: float = 4e9, process_bytes: float = 3 * GB) -> float:
    """Host memory of one node while the policy (and reference) load: without ``zero3_init`` every rank builds the
    full fp32 model(s) in host memory (4P each); with it each rank only holds one checkpoint shard upcast to fp32
    at a time while the weights go straight into their partitions, and the node's page cache holds the bf16
    checkpoint once (2P). ``process_bytes``: a rank's own libraries and buffers."""
    copies = 2 if reference else 1
    if zero3_init:
        return ranks_per_node * (process_bytes + 2 * checkpoint_shard_bytes) + 2 * shape.params
    return ranks_per_node * (process_bytes + copies * 4 * shape.params)


def host_bytes_steady(shape: ModelShape, *, ranks_per_node: int, data_parallel: int, offload_optimizer: bool,
                      parked_weights: bool, index_bytes: float = 0.0) -> float:
    """Host memory of one node through training, beyond the processes themselves: the offloaded fp32 master, Adam
    and gradient partition (16P / N per rank), the engine's weights parked at sleep level 1 (2P per rank), and an
    in-process retriever index (``index_bytes`` per rank)."""
    offloaded = 16 * shape.params / data_parallel if offload_optimizer else 0.0
    return ranks_per_node * (offloaded + (2 * shape.params if parked_weights else 0.0) + index_bytes)


def markdown_table(plans: dict[str, MemoryPlan]) -> str:
    """One column per plan (GB per GPU), as docs/memory.md shows them."""
    g = lambda x: f"{x / GB:.1f}"  # noqa: E731
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    start_learner = lambda p: p.learner if p.learner_at_start is None else p.learner_at_start  # noqa: E731
    rows = [
        ("learner states + DeepSpeed buffers", lambda p: g(p.learner)),
        ("reference (bf16)", lambda p: g(p.reference)),
        ("CUDA context, NCCL, slack", lambda p: g(p.contexts)),
        ("retriever shard (co-located `--gpu-index`)", lambda p: g(p.retriever)),
        ("engine start: learner states at set-up", lambda p: g(start_learner(p))),
        ("engine start: free memory vLLM checks for (utilisation x total)", lambda p: g(p.engine_start_claim)),
        ("**margin at the engine's start**",
         lambda p: f"**{g(p.margin_at_engine_start)} ({pct(p.margin_at_engine_start / p.gpu)})**"),
        ("engine awake", lambda p: g(p.engine_awake)),
        ("of which runtime (V2 sampler state, logits, profile pass)", lambda p: g(p.engine_overhead)),
        ("of which CUDA graphs", lambda p: g(p.engine_graphs)),
        ("of which KV cache", lambda p: g(p.kv_cache)),
        ("**rollout / first wake-up**", lambda p: f"**{g(p.rollout)}**"),
        ("**margin at the first wake-up**",
         lambda p: f"**{g(p.margin_at_wake_up)} ({pct(p.margin_at_wake_up_fraction)})**"),
        ("update: activations of one forward pass", lambda p: g(p.activations)),
        ("update: engine asleep (bookkeeping, CUDA graphs)", lambda p: g(p.engine_asleep)),
        ("**update**", lambda p: f"**{g(p.update)}**"),
        ("**margin at the update**", lambda p: f"**{g(p.gpu - p.update)} ({pct(p.margin_at_update_fraction)})**"),
    ]
    lines = ["| GB per GPU | " + " | ".join(plans) + " |", "| --- |" + " --- |" * len(plans)]
    lines += [f"| {name} | " + " | ".join(f(p) for p in plans.values()) + " |" for name, f in rows]
    return "\n".join(lines)


def paper_cells(engines: dict[str, EngineSettings], tokens: int, data_parallel: int = 8,
                gpu_bytes: float = H100_80GB) -> dict[str, MemoryPlan]:
    """The four cells 3B / 7B x ZeRO-2 / ZeRO-3 on ``data_parallel`` GPUs with the wiki-18 e5 Flat index sharded
    over the same GPUs, with the paper configs' engines (``engines``: "3b", "7b") and forward passes of ``tokens``
    (pass_tokens)."""
    shard = faiss_flat_shard_bytes(21_015_324, 768, data_parallel)
    cells = {}
    for size in ("3b", "7b"):
        for stage in (2, 3):
            cells[f"{size.upper()} ZeRO-{stage}"] = gpu_memory_plan(
                QWEN25[size], zero_stage=stage, data_parallel=data_parallel, gpu_bytes=gpu_bytes,
                vllm_gpu_memory_utilization=engines[size].gpu_memory_utilization, reference=True,
                micro_batch_tokens=tokens, retriever_bytes=shard, engine=engines[size])
    return cells


def paper_engines(configs: dict[str, Config], data_parallel: int = 8) -> tuple[dict[str, EngineSettings], int]:
    """The engines of the paper's 3B and 7B run configs (``configs``: "3b", "7b") as the training run builds them on
    ``data_parallel`` ranks (its backend kind's ``engine_memory``), and the tokens of their update's largest forward
    pass."""
    from searchr1_lld.rollout.backends.kinds import backend_kind  # deferred: torch (the arithmetic stays pure)

    engines = {size: EngineSettings.of(backend_kind(c.rollout).engine_memory(c, data_parallel))
               for size, c in configs.items()}
    c3 = configs["3b"]
    return engines, pass_tokens(c3.trainer.micro_batch_size, c3.rollout.max_total_length,
                                c3.trainer.micro_batch_token_budget)


if __name__ == "__main__":  # python -m searchr1_lld.preflight.memory_plan: the tables of docs/memory.md from the paper configs
    from searchr1_lld.config import load_config

    print(markdown_table(paper_cells(*paper_engines(
        {size: load_config(f"configs/paper/qwen2.5-{size}-base_nq-hotpotqa_llds-ma.yaml") for size in ("3b", "7b")}))))
    print()
    g = lambda x: f"{x / GB:.0f} GB"  # noqa: E731
    for size in ("3b", "7b"):
        print(f"host memory of one node (8 ranks) while {size.upper()} and its reference load: "
              f"{g(host_bytes_at_load(QWEN25[size], ranks_per_node=8, zero3_init=False, reference=True))} without "
              f"zero3_init, {g(host_bytes_at_load(QWEN25[size], ranks_per_node=8, zero3_init=True, reference=True))}"
              f" with it")
