"""The DeepSpeed training engine, ZeRO stages 0-3 (``accelerate launch`` with a DeepSpeed config; configs/deepspeed/).

- set-up: clipping at trainer.grad_clip, one micro-batch per engine call (the learner sets the accumulation boundary
  per micro-batch); under ZeRO-3 the reference is loaded again (transformers loads it partitioned, like the policy)
  and sharded by an inference-only DeepSpeed engine, and models that must stay whole are built outside the
  partitioning (:meth:`outside_partitioning`);
- the update: ``engine.set_gradient_accumulation_boundary`` + ``engine.backward``; the global norm read from the
  ZeRO optimiser before its step; a non-finite norm on any rank skips the step everywhere (ZeRO-1..3: the engine's
  own overflow path, verified);
- weights to the rollout engine: gathered module by module under ZeRO-3 (never the whole model on one rank);
- checkpoints: ``deepspeed/`` (``engine.save_checkpoint``: every rank its shard of module and optimiser) and the
  policy gathered to rank 0 as an HF ``policy/`` directory, tied weights once.
"""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch

from searchr1_lld.bookkeeping import checkpoint
from searchr1_lld.distributed import any_rank, outside_zero3
from searchr1_lld.learner.engines.base import TrainingEngine
from searchr1_lld.learner.weight_sync import iter_gathered_named_parameters
from searchr1_lld.config import TrainerConfig
from searchr1_lld.protocols import Accelerator, Tokenizer


class DeepSpeedEngine(TrainingEngine):
    """DeepSpeed ZeRO-``stage`` (module docstring); the model the learner holds is the DeepSpeed engine."""

    name = "deepspeed"

    def __init__(self, accelerator: Accelerator, stage: int):
        super().__init__(accelerator)
        self.stage = stage
        self.partitions_parameters = stage == 3

    def _config(self) -> dict[str, Any]:
        return self.accelerator.state.deepspeed_plugin.deepspeed_config

    def configure(self, trainer_cfg: TrainerConfig) -> None:
        ds_config = self._config()
        ds_config["gradient_clipping"] = trainer_cfg.grad_clip
        ds_config["gradient_accumulation_steps"] = 1
        ds_config["train_micro_batch_size_per_gpu"] = 1

    def reference_copy(self, policy: torch.nn.Module, load: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        if self.stage == 3:  # the policy was loaded partitioned: a deep copy would copy empty shards
            return load()
        return copy.deepcopy(policy)

    def place_reference(self, ref: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        ref = ref.to(dtype=dtype)
        if self.stage != 3:
            return ref.to(self.accelerator.device)
        import deepspeed  # deferred: deepspeed

        config = {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "offload_param": self._config().get("zero_optimization", {}).get(
                "offload_param", {"device": "none"})},
            "bf16": {"enabled": dtype == torch.bfloat16},
            "fp16": {"enabled": dtype == torch.float16},
        }
        engine, *_ = deepspeed.initialize(model=ref, config=config)
        engine.eval()
        return engine

    def outside_partitioning(self) -> ContextManager:
        return outside_zero3(self.accelerator)

    def no_sync(self, model: Any, last: bool) -> ContextManager:
        return contextlib.nullcontext()  # the boundary flag of backward() decides when gradients are reduced

    def backward(self, model: Any, loss: torch.Tensor, last: bool) -> None:
        model.set_gradient_accumulation_boundary(last)
        model.backward(loss)

    def grad_norm(self, engine: Any) -> float:
        """Global (all ranks) L2 norm of the mini-batch gradient held by the engine, before its step."""
        opt = engine.optimizer
        if self.stage in (1, 2) and hasattr(opt, "scaled_global_norm"):
            return float(opt.scaled_global_norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
        if self.stage == 3 and hasattr(opt, "_get_norm_groups"):
            norms = torch.stack([torch.as_tensor(n, dtype=torch.float32).reshape(()) for n in opt._get_norm_groups()])
            if (~torch.isfinite(norms) | (norms < 0)).any():  # DeepSpeed marks a non-finite group norm with -1
                return float("inf")
            return float(norms.norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
        if self.stage == 0:  # gradients are all-reduced at the boundary backward: the local norm is the global norm
            grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
            return float(torch.stack(grads).norm()) if grads else 0.0
        import deepspeed  # deferred: deepspeed

        raise RuntimeError(f"DeepSpeed {deepspeed.__version__} ZeRO-{self.stage}: no gradient-norm method found on "
                           f"{type(opt).__name__}; this trainer supports the DeepSpeed range in pyproject.toml")

    def optimizer_step(self, model: Any, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        gn = self.grad_norm(model)
        if not any_rank(self.accelerator, not math.isfinite(gn)):
            model.step()  # clips to gradient_clipping and applies the update
            return gn, True
        if self.stage == 0:
            model.zero_grad()
            return gn if not math.isfinite(gn) else float("nan"), False
        # ZeRO 1-3: the engine's own step discards a non-finite gradient on every rank (its overflow path clears
        # the partitioned gradients); verify it did, so a non-finite update is never applied silently
        model.step()
        if getattr(model.optimizer, "overflow", False) is not True:
            raise RuntimeError("non-finite gradient norm, but the DeepSpeed engine applied the step")
        return gn if not math.isfinite(gn) else float("nan"), False

    def named_weights(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        if self.stage == 3:
            return iter_gathered_named_parameters(module)
        return super().named_weights(module)

    def save_state(self, directory: Path, step: int, model: Any, optimizer: torch.optim.Optimizer,
                   tokenizer: Tokenizer | None, save_policy: bool) -> None:
        model.save_checkpoint(str(directory / "deepspeed"), tag="state", client_state={"step": step})
        if not save_policy:
            return
        state_dict = self.accelerator.get_state_dict(model)  # gathered to rank 0 under ZeRO-3
        if self.accelerator.is_main_process:
            unwrapped = self.accelerator.unwrap_model(model)
            for name in checkpoint.tied_duplicate_names(unwrapped):
                state_dict.pop(name, None)  # tied weights once, as save_pretrained writes them without DeepSpeed
            checkpoint.save_policy_dir(unwrapped, directory, tokenizer, state_dict=state_dict)

    def load_state(self, directory: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
        model.load_checkpoint(str(directory / "deepspeed"), tag="state", load_optimizer_states=True,
                              load_lr_scheduler_states=False)

    def close(self, *models: Any) -> None:
        for engine in models:
            if hasattr(engine, "destroy"):
                engine.destroy()
