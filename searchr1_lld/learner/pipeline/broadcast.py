"""The weights' stream of a split GPU launch (placement.py's rank plan; not run on a GPU here): from the first learner
rank to every rollout rank over one process group that spans it and them, fed by the training engine's own stream
(``engine.named_weights``: ZeRO-3 gathers module by module), each rollout rank loading what it receives through its
engine's contract (``backend.load_weights``)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch


def broadcast_weights(named: Iterable[tuple[str, torch.Tensor]], shapes: dict[str, tuple[torch.Size, torch.dtype]],
                      *, group: Any, source: int, is_source: bool, device: torch.device | str,
                      broadcast: Callable[..., Any] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights' stream across a split launch, one parameter at a time in ``shapes``' order (every rank of
    ``group`` knows the names, shapes and dtypes: the model's config). The source iterates ``named`` (the training
    engine's stream) and sends each tensor; a rollout rank receives into a fresh buffer. Yields (name, tensor) on
    every rank, for ``backend.load_weights`` on the rollout ranks (the source's items are its own tensors).
    ``broadcast``: ``torch.distributed.broadcast`` unless given (a test's stand-in)."""
    if broadcast is None:
        broadcast = torch.distributed.broadcast
    source_items = iter(named) if is_source else None
    for name, (shape, dtype) in shapes.items():
        if source_items is not None:
            sent_name, tensor = next(source_items)
            if sent_name != name:
                raise ValueError(f"weight stream out of order: expected {name!r}, the engine sent {sent_name!r}")
            buf = tensor.detach().to(device=device, dtype=dtype).contiguous()
        else:
            buf = torch.empty(shape, dtype=dtype, device=device)
        broadcast(buf, src=source, group=group)
        yield name, buf
