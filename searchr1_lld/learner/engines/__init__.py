"""Training engines by kind (learner/engines/base.py says what a kind owns): the kind is resolved once from the
accelerate launch when the learner is built, and the learner asks it, never which kind it is.

    accelerate   one process, or DDP                                       (accelerate_ddp.py)
    deepspeed    DeepSpeed ZeRO-0..3, from the launch's DeepSpeed config   (deepspeed_zero.py)

A kind is a class registered by the name of accelerate's distributed type it runs under; a launch of another type
(FSDP, ...) is refused with the kinds there are.
"""

from __future__ import annotations

from typing import Callable

from searchr1_lld.algo import registry
from searchr1_lld.distributed import is_deepspeed, zero_stage
from searchr1_lld.learner.engines.accelerate_ddp import AccelerateEngine
from searchr1_lld.learner.engines.base import TrainingEngine
from searchr1_lld.learner.engines.deepspeed_zero import DeepSpeedEngine
from searchr1_lld.protocols import Accelerator

__all__ = ["TRAINING_ENGINES", "AccelerateEngine", "DeepSpeedEngine", "TrainingEngine", "training_engine"]

TRAINING_ENGINES: dict[str, Callable[[Accelerator], TrainingEngine]] = {}
# accelerate's distributed types that the plain engine runs (one process, DDP on CPU / GPU / other devices)
PLAIN_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_HPU")

registry.register(TRAINING_ENGINES, "training engine", "accelerate")(AccelerateEngine)


@registry.register(TRAINING_ENGINES, "training engine", "deepspeed")
def deepspeed_engine(accelerator: Accelerator) -> TrainingEngine:
    """DeepSpeed at the ZeRO stage of the launch's DeepSpeed config."""
    return DeepSpeedEngine(accelerator, zero_stage(accelerator))


def engine_kind(accelerator: Accelerator) -> str:
    """The name of the kind that runs under ``accelerator``'s distributed type."""
    if is_deepspeed(accelerator):
        return "deepspeed"
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)).upper()
    if kind in PLAIN_TYPES:
        return "accelerate"
    raise ValueError(f"accelerate launched with distributed type {kind}, which no training engine runs; "
                     f"registered: {sorted(TRAINING_ENGINES)} (plain accelerate runs {', '.join(PLAIN_TYPES)})")


def training_engine(accelerator: Accelerator) -> TrainingEngine:
    """The training engine of this launch (module docstring)."""
    return registry.lookup(TRAINING_ENGINES, "training engine", engine_kind(accelerator))(accelerator)
