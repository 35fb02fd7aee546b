"""Launched by tests/test_retriever_zero3.py under
`accelerate launch --config_file configs/accelerate/cpu_2proc_zero3.yaml` (2 CPU processes, DeepSpeed ZeRO-3 over
gloo): the in-process dense retriever as the trainer builds it (factories.make_retriever), then, as a control, the
same encoder loaded without the trainer's guard.

    python tests/zero3_dense_run.py INDEX_DIR OUT_DIR QUERY...

Writes OUT_DIR/rank{r}.json: the guarded encoder's parameter count and whether any parameter is a ZeRO-3 partition,
the ids of the top documents of each query, the same facts of the unguarded control encoder, and whether the process
group was still up when the rank finished (it must not be: the ranks release it together before exiting).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from searchr1_lld.config import load_config
from searchr1_lld.learner import factories
from searchr1_lld.learner.engines import training_engine

index_dir, out_dir, queries = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
cfg = load_config(None, ["retriever.mode=inprocess", f"retriever.index_dir={index_dir}", "trainer.device=cpu"])
accelerator = factories.make_accelerator(cfg)
engine = training_engine(accelerator)
assert engine.partitions_parameters  # ZeRO-3


def facts(retriever) -> dict:
    model = retriever.backend.encoder.model
    params = list(model.parameters())
    hits = retriever.search(queries, 3)
    return {"numel": sum(p.numel() for p in params), "partitioned": any(hasattr(p, "ds_id") for p in params),
            "hits": [[h["id"] for h in q] for q in hits]}


guarded = facts(factories.make_retriever(cfg, engine))
import retriever.encoders as encoders  # noqa: E402

encoders._ENCODERS.clear()  # the control loads the encoder again, now without the guard
import retriever as retrievers  # noqa: E402

try:
    control = facts(retrievers.make_retriever(cfg.retriever))
except Exception as err:  # a partitioned encoder's forward fails on its empty partitions
    control = {"error": f"{type(err).__name__}: {err}"[:300]}
    from transformers.integrations import is_deepspeed_zero3_enabled

    control["zero3_enabled"] = is_deepspeed_zero3_enabled()
# both ranks end together and release the process group before exit, as the trainer's close does: a rank that exits
# holding it leaves gloo's communication threads to static teardown, which can abort (SIGABRT) when the other rank's
# connections are already gone
accelerator.wait_for_everyone()
accelerator.end_training()
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / f"rank{os.environ['RANK']}.json").write_text(json.dumps({
    "guarded": guarded, "control": control, "process_group": torch.distributed.is_initialized()}))
