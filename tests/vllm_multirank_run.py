"""Launched by tests/test_vllm_engine.py under ``python -m torch.distributed.run --nproc_per_node 2``: one VLLMBackend
per rank (external launcher, tensor parallel 1, seed = base + rank), built after the gloo process group exists (as
under accelerate), with a different number of ``generate`` calls per rank (rank r makes 2 + 3 r calls), so no call
may be a collective across ranks; then the request-level API the continuous scheduler drives (rank r adds 1 + 2 r
requests of different lengths and steps its engine until they finish: a different number of steps per rank).

    python -m torch.distributed.run --nproc_per_node 2 tests/vllm_multirank_run.py MODEL_DIR TOKENIZER_DIR OUT_DIR

Writes OUT_DIR/rank{r}.json: the engine's seed, the launcher variables it saw, the sampled ids of every call, and
the request-level run (tokens per request id, steps taken).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from transformers import AutoTokenizer

from searchr1_lld.config import RolloutConfig, VLLMConfig
from searchr1_lld.rollout.backends import make_backend

model_dir, tokenizer_dir, out_dir = sys.argv[1:4]
dist.init_process_group("gloo")  # accelerate's group: vLLM's external launcher joins it
rank = dist.get_rank()
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
cfg = RolloutConfig(backend="vllm", max_total_length=256,
                    vllm=VLLMConfig(kv_cache_memory_bytes=32 << 20, enforce_eager=True))
backend = make_backend(cfg, tokenizer=tokenizer, model_path=model_dir, seed=100, dtype="float32",
                       tokenizer_path=tokenizer_dir)
prompt = tokenizer.encode("Question: who founded the company?", add_special_tokens=False)
calls = [[o.token_ids for o in backend.generate([prompt] * 4, max_new_tokens=16, stop_strings=[], temperature=1.0,
                                                top_p=1.0, greedy=False)]
         for _ in range(2 + 3 * rank)]
for k in range(1 + 2 * rank):
    backend.add_request(f"rank{rank}-{k}", prompt, max_new_tokens=4 + 4 * k, stop_strings=[], temperature=1.0,
                        top_p=1.0, greedy=False)
stream, steps = {}, 0
while backend.has_unfinished_requests():
    steps += 1
    stream.update({request_id: len(out.token_ids) for request_id, out in backend.step()})
result = {"seed": backend.llm.llm_engine.vllm_config.model_config.seed, "calls": calls,
          "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}, "stream": stream,
          "stream_steps": steps}
Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
dist.barrier()
dist.destroy_process_group()
