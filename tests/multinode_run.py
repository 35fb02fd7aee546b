"""Launched by tests/test_multinode.py under `accelerate launch` (2 CPU processes, gloo) with an accelerate config that
points at a shipped DeepSpeed JSON (configs/deepspeed/zero3.json) and sets zero3_init_flag, as the GPU configs do.

    python tests/multinode_run.py OUT_DIR WORLD_DIR

Checks, on real collectives: the run-directory check passes for one shared directory and refuses per-rank
("node-local") directories on both ranks; the policy is loaded partitioned; the DeepSpeed engine reduces and
accumulates gradients in fp32 as the JSON says; a checkpoint into per-rank directories stops on both ranks before any
file is written. Each rank writes OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from conftest import on_world  # noqa: E402

from searchr1_lld.bookkeeping import checkpoint, resume

from searchr1_lld.learner import factories, optim  # noqa: E402
from searchr1_lld.learner.engines import training_engine  # noqa: E402
from searchr1_lld.learner.step_size import StepSizeController  # noqa: E402
from searchr1_lld.config import ConfigError, load_config  # noqa: E402

out_dir, world = Path(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
cfg = on_world(load_config("configs/tiny.yaml", ["trainer.device=cpu"]), world)
acc = factories.make_accelerator(cfg)
res: dict = {"rank": rank, "world_size": acc.num_processes}

resume.check_run_dir_shared(acc, out_dir / "shared")
acc.wait_for_everyone()  # rank 0 removes the marker folder after the check's last barrier
res["shared_ok"] = not (out_dir / "shared" / resume.SHARED_MARKERS).exists()
try:
    resume.check_run_dir_shared(acc, out_dir / f"node{rank}")  # each rank its own disk at "the same path"
    res["local_error"] = None
except ConfigError as e:
    res["local_error"] = str(e)

model, _ = factories.load_policy_and_tokenizer(cfg)
params = list(model.parameters())
res["loaded_partitioned"] = all(hasattr(p, "ds_id") for p in params) and sum(p.numel() for p in params) == 0
optimizer, scheduler = optim.make_optimizer(model, cfg.trainer, 10, StepSizeController.of(cfg.trainer.step_size, 1))
training = training_engine(acc)
training.configure(cfg.trainer)
engine, optimizer = acc.prepare(model, optimizer)
res["zero_stage"] = engine.zero_optimization_stage()
res["communication_data_type"] = str(engine.communication_data_type)
res["grad_accum_dtype"] = str(engine.get_data_types()[1])
res["reduce_bucket_size"] = int(engine.zero_reduce_bucket_size())  # the JSON's 2e8, not DeepSpeed's 5e8 default
res["plugin_communication"] = acc.state.deepspeed_plugin.deepspeed_config.get("communication_data_type")
try:
    checkpoint.save_checkpoint(out_dir / f"ckpt{rank}", 1, model=engine, optimizer=optimizer, scheduler=scheduler,
                               trainer_state={}, accelerator=acc, engine=training)
    res["checkpoint_error"] = None
except OSError as e:
    res["checkpoint_error"] = str(e)
res["checkpoint_files"] = sorted(str(p.relative_to(out_dir)) for p in out_dir.glob(f"ckpt{rank}/**/*") if p.is_file())
(out_dir / f"rank{rank}.json").write_text(json.dumps(res))
torch.distributed.barrier()
