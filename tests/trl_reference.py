"""TRL's GRPO trainer from its PyPI release, loaded for comparison tests (no TRL code is copied into this repository,
and TRL is not installed into the environment).

The pinned wheel is downloaded once with ``pip download trl==VERSION --no-deps`` into ``.cache/trl`` (checked against
its sha256) and unpacked beside it; ``trl.trainer.grpo_trainer`` is imported from there (its own imports are this
environment's transformers, accelerate, datasets, ...). A failed download or import fails the test.

TRL computes its GRPO losses inline in ``GRPOTrainer._compute_loss``. :func:`trl_loss` runs that method itself, on a
trainer object made without ``__init__`` that carries the settings the method reads, with two stand-ins for what is
not under test: the model forward (``_get_per_token_logps_and_entropies`` returns the given log-probs and entropies)
and a one-process accelerator (gather, reduce and padding across processes are the identity, as they are on one
process). ``get_high_entropy_mask`` and ``get_gamma_weights`` are TRL's own methods, called as they are.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from pinned_wheel import pinned_wheel

VERSION = "1.16.0"
SHA256 = "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396"


def wheel_path() -> Path:
    """The pinned TRL wheel in .cache/trl (tests/pinned_wheel.py)."""
    return pinned_wheel("trl", VERSION, SHA256, "TRL")


def unpacked() -> Path:
    """The wheel's files under .cache/trl/trl-VERSION (unpacked once; a marker file says it is complete)."""
    wheel = wheel_path()
    root = wheel.parent / f"trl-{VERSION}"
    marker = root / ".complete"
    if not marker.is_file():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        marker.write_text(SHA256)
    return root


def load_grpo_trainer() -> types.ModuleType:
    """``trl.trainer.grpo_trainer`` imported from the unpacked wheel; pytest.fail when it cannot be imported here."""
    root = str(unpacked())
    if root not in sys.path:
        sys.path.insert(0, root)
    environment = dict(os.environ)  # importing TRL imports parts of vLLM, which set variables (VLLM_LOGGING_LEVEL...)
    try:
        module = importlib.import_module("trl.trainer.grpo_trainer")
    except Exception as err:  # an import error of TRL or of a dependency it needs
        pytest.fail(f"TRL {VERSION}'s grpo_trainer does not import here: {type(err).__name__}: {err}")
    finally:  # that later tests' subprocesses (a vLLM engine that must log) would inherit
        os.environ.clear()
        os.environ.update(environment)
    if not str(module.__file__).startswith(root):
        pytest.fail(f"trl was imported from {module.__file__}, not from the pinned wheel in {root}")
    return module


@pytest.fixture(scope="session")
def trl_grpo() -> types.ModuleType:
    return load_grpo_trainer()


class OneProcess:
    """The accelerator calls of ``_compute_loss`` and ``get_high_entropy_mask`` on one process: identities."""

    num_processes = 1

    def pad_across_processes(self, x: torch.Tensor, dim: int = 0, pad_index: Any = 0) -> torch.Tensor:
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def trainer(grpo: types.ModuleType, *, loss_type: str, epsilon: float = 0.2, epsilon_high: float | None = None,
            importance_sampling_level: str = "token", top_entropy_quantile: float = 1.0,
            gradient_accumulation_steps: int = 1, steps_per_generation: int = 1, max_completion_length: int = 512,
            sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05,
            vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)) -> Any:
    """A ``GRPOTrainer`` made without ``__init__``, with the attributes ``_compute_loss`` reads (names and defaults as
    TRL 1.16's GRPOConfig: beta 0, no vLLM, no off-policy mask, no entropy bonus, no auxiliary loss)."""
    t = object.__new__(grpo.GRPOTrainer)
    k_pos, lambda_pos, k_neg, lambda_neg = vespo
    t.args = types.SimpleNamespace(delta=None, steps_per_generation=steps_per_generation,
                                   sapo_temperature_pos=sapo_temperature_pos,
                                   sapo_temperature_neg=sapo_temperature_neg, vespo_k_pos=k_pos,
                                   vespo_lambda_pos=lambda_pos, vespo_k_neg=k_neg, vespo_lambda_neg=lambda_neg,
                                   use_bias_correction_kl=False)
    t.__dict__.update(
        loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        importance_sampling_level=importance_sampling_level, top_entropy_quantile=top_entropy_quantile,
        current_gradient_accumulation_steps=gradient_accumulation_steps, max_completion_length=max_completion_length,
        beta=0.0, use_vllm=False, off_policy_mask_threshold=None, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, accelerator=OneProcess(), model=types.SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    return t


def trl_loss(t: Any, logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             entropy: torch.Tensor | None = None, num_items_in_batch: float | None = None) -> torch.Tensor:
    """TRL's ``_compute_loss`` of one micro-batch: log-probs ``[B, T]`` (``logp_new`` carries the gradient), the
    completion mask ``[B, T]``, advantages ``[B]``, token entropies ``[B, T]`` (default 0) and the token count of
    the generation batch (``num_items_in_batch``; default: this micro-batch's)."""
    B, T = mask.shape
    completion_mask = (mask != 0).long()
    entropy = torch.zeros(B, T) if entropy is None else entropy

    def forward(model, input_ids, attention_mask, logits_to_keep, **kwargs):  # the model forward's stand-in
        assert logits_to_keep == T and input_ids.shape == (B, 1 + T)
        return logp_new, entropy, None

    t._get_per_token_logps_and_entropies = forward
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": completion_mask,
              "advantages": advantages, "old_per_token_logps": logp_old,
              "num_items_in_batch": torch.tensor(float(completion_mask.sum() if num_items_in_batch is None
                                                       else num_items_in_batch))}
    return t._compute_loss(None, inputs)
