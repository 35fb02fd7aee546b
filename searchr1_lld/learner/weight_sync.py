"""The learner -> rollout-engine weight stream of a partitioned model: (name, full tensor) of every parameter,
gathered module by module (ZeRO-3; the DeepSpeed training engine's ``named_weights``), into ``backend.load_weights``."""

from __future__ import annotations

from typing import Callable, ContextManager, Iterator

import torch



def iter_gathered_named_parameters(model: torch.nn.Module,
                                  gather: Callable[[list[torch.nn.Parameter]], ContextManager] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter of a ZeRO-3 partitioned model, gathered one module at a time
    (``gather(params)``: a context manager, default ``deepspeed.zero.GatheredParameters``; never the whole model on
    one rank). A parameter shared by several modules (tied embeddings) is yielded once, under its first name. The
    tensor is valid only until the next item is requested (the module is re-partitioned when the gather exits)."""
    if gather is None:
        import deepspeed

        gather = lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)  # noqa: E731
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        with gather([p for _, p in params]):
            for pname, p in params:
                yield (f"{mod_name}.{pname}" if mod_name else pname), p.detach()
