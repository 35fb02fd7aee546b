"""The training engine's kind is resolved once from the launch: plain accelerate (one process, DDP) or DeepSpeed
ZeRO-n; a launch no kind runs (FSDP) is refused naming the registered kinds. (The kinds' behaviour is exercised by
the trainer's tests: one process, DDP and ZeRO-2/3 in tests/test_trainer_multirank.py and
tests/test_trainer_deepspeed.py.)"""

from __future__ import annotations

import types

import pytest
import torch

from searchr1_lld.learner.engines import (TRAINING_ENGINES, AccelerateEngine, DeepSpeedEngine, engine_kind,
                                          training_engine)


def fake_accelerator(kind: str, stage: int | None = None):
    plugin = types.SimpleNamespace(deepspeed_config={"zero_optimization": {"stage": stage}}) if stage is not None \
        else None
    return types.SimpleNamespace(distributed_type=types.SimpleNamespace(value=kind), num_processes=2,
                                 state=types.SimpleNamespace(deepspeed_plugin=plugin))


@pytest.mark.parametrize("kind", ["NO", "MULTI_CPU", "MULTI_GPU"])
def test_plain_launches_run_the_accelerate_engine(kind):
    engine = training_engine(fake_accelerator(kind))
    assert type(engine) is AccelerateEngine and engine_kind(fake_accelerator(kind)) == "accelerate"
    assert not engine.partitions_parameters


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_deepspeed_launch_runs_its_zero_stage(stage):
    engine = training_engine(fake_accelerator("DEEPSPEED", stage))
    assert type(engine) is DeepSpeedEngine and engine.stage == stage
    assert engine.partitions_parameters == (stage == 3)


def test_a_launch_no_engine_runs_is_refused_with_the_kinds():
    with pytest.raises(ValueError, match=r"distributed type FSDP, which no training engine runs; registered: "
                                         r"\['accelerate', 'deepspeed'\]"):
        training_engine(fake_accelerator("FSDP"))
    assert sorted(TRAINING_ENGINES) == ["accelerate", "deepspeed"]


def test_the_plain_engine_hands_every_weight_once_in_order():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    named = list(AccelerateEngine(fake_accelerator("NO")).named_weights(model))
    assert [n for n, _ in named] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(not t.requires_grad for _, t in named)
