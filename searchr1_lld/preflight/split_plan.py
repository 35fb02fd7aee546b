"""The memory plan of a split GPU launch (trainer.placement.kind=split: searchr1_lld/placement.py's rank plan): the
colocated plan of the same launch, computed with the learner ranks as its data-parallel ranks, cut in two.

- a learner GPU holds the learner's states, the reference, a CUDA context and the update's activations; no engine,
  and no retriever (the rollout ranks search);
- a rollout GPU holds its vLLM engine awake through every phase (it never sleeps: it generates while the learner
  updates), a CUDA context and the retriever's shard when the index is on the GPU; no learner states.
"""

from __future__ import annotations

from dataclasses import replace

from searchr1_lld.preflight.memory_plan import MemoryPlan


def split_plans(colocated: MemoryPlan) -> dict[str, MemoryPlan]:
    """``{"learner GPU": plan, "rollout GPU": plan}`` from ``colocated`` (module docstring)."""
    learner = replace(colocated, engine_awake=0.0, engine_weights=0.0, engine_asleep=0.0, engine_overhead=0.0,
                      engine_graphs=0.0, engine_start_claim=0.0, retriever=0.0)
    rollout = replace(colocated, learner=0.0, learner_at_start=0.0, reference=0.0, activations=0.0,
                      engine_asleep=colocated.engine_awake)
    return {"learner GPU": learner, "rollout GPU": rollout}
