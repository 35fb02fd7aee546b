"""Encoding a corpus on several devices at once: one encoder per device (the same weights and settings), the
token-length-sorted batches of the texts handed to the devices as each one frees up, vectors written back in the
texts' order.

    devices = encode_devices("cuda:0,cuda:1")      # None: every visible GPU, else ["cpu"]
    pool = EncoderPool("intfloat/e5-base-v2", devices)
    vectors = pool.encode(texts, kind="passage", batch_size=default_batch_size(devices), bar=tqdm(...))

A batch holds the same texts whichever device encodes it (:meth:`E5Encoder.batches`), so the vectors do not depend
on how many devices there are (on CPU they are bit-identical; tests/test_retriever_units.py). GPUs encode in fp16,
the CPU in fp32 (:class:`~retriever.encoders.E5Encoder`). One Python thread drives each device: the model's CUDA
kernels and the fast tokenizer run without the GIL, so the devices work at the same time.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Sequence

import numpy as np
import torch

from retriever.encoders import DEFAULT_PASSAGE_PREFIX, DEFAULT_QUERY_PREFIX, get_encoder

# Passages per encoder call: Search-R1's index builder encodes wiki-18 with e5 at 512 in fp16 on a GPU; on a CPU
# larger batches only pad more.
BATCH_SIZE = {"cuda": 512, "cpu": 64}


def encode_devices(spec: str | Sequence[str] | None) -> list[str]:
    """The devices to encode on: ``"cuda:0,cuda:1"`` or a list of names as given; ``None`` or ``""``: every visible
    GPU (``cuda:0`` .. ``cuda:{n-1}``), else ``["cpu"]``. A GPU that is not there is a ValueError naming it."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    names = [d.strip() for d in (spec.split(",") if isinstance(spec, str) else spec) if d.strip()]
    visible = torch.cuda.device_count()
    for name in names:
        kind, _, index = name.partition(":")
        if kind == "cpu" and not index:
            continue
        if kind != "cuda" or (index and not index.isdigit()):
            raise ValueError(f"device {name!r}: expected cpu, cuda or cuda:N")
        if int(index or 0) >= visible:
            raise ValueError(f"device {name!r}: {visible} GPU(s) visible" + (
                f" (cuda:0 .. cuda:{visible - 1})" if visible else "; use --devices cpu"))
    return names


def default_batch_size(devices: Sequence[str]) -> int:
    """:data:`BATCH_SIZE` of the slowest kind among ``devices`` (the CPU's when any is a CPU)."""
    return BATCH_SIZE["cuda"] if all(d.startswith("cuda") for d in devices) else BATCH_SIZE["cpu"]


class EncoderPool:
    """One :class:`~retriever.encoders.E5Encoder` per device; :meth:`encode` spreads the batches over them.

    ``path`` and ``dim`` are the encoder's (the same on every device)."""

    def __init__(self, name: str, devices: Sequence[str], *, max_length: int = 256,
                 query_prefix: str = DEFAULT_QUERY_PREFIX, passage_prefix: str = DEFAULT_PASSAGE_PREFIX,
                 pooling: str = "mean"):
        if not devices:
            raise ValueError("EncoderPool needs at least one device")
        self.devices = list(devices)
        self.encoders = [get_encoder(name, device=d, max_length=max_length, query_prefix=query_prefix,
                                     passage_prefix=passage_prefix, pooling=pooling) for d in self.devices]
        self.path, self.dim = self.encoders[0].path, self.encoders[0].dim

    def encode(self, texts: list[str], *, kind: Literal["query", "passage"], batch_size: int,
               bar: Any = None) -> np.ndarray:
        """``texts`` -> float32 [N, D], unit rows, row i = texts[i]. ``bar``: a tqdm advanced by each batch's
        passages as it finishes (its rate is the passages per second of all devices together)."""
        first = self.encoders[0]
        prefixed = [first.prefix(kind) + t for t in texts]
        batches = first.batches(prefixed, batch_size)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        taken = itertools.count()  # the next batch to encode; next() on it is atomic
        lock, failed = threading.Lock(), threading.Event()

        def work(encoder) -> None:
            try:
                while not failed.is_set() and (k := next(taken)) < len(batches):
                    idx = batches[k]
                    out[idx] = encoder.encode_batch([prefixed[i] for i in idx])
                    if bar is not None:
                        with lock:
                            bar.update(len(idx))
            except BaseException:
                failed.set()  # the other devices stop after their current batch
                raise

        if len(self.encoders) == 1:
            work(first)
        else:
            with ThreadPoolExecutor(len(self.encoders), thread_name_prefix="encode") as pool:
                for future in [pool.submit(work, e) for e in self.encoders]:
                    future.result()
        return out
