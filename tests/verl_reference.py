"""verl's ``verl/trainer/ppo/core_algos.py`` and ``verl/trainer/ppo/rollout_corr_helper.py`` from its PyPI release,
loaded for comparison tests (no verl code is copied into this repository, and verl's heavy dependencies are not
installed).

The pinned wheel is downloaded once with ``pip download verl==VERSION --no-deps`` into ``.cache/verl`` (checked
against its sha256). ``core_algos.py`` and the real ``verl/utils/torch_functional.py`` it computes with (masked means,
sums, whitening) are executed from the wheel; the few imports they make that this comparison does not exercise are
empty stand-ins: omegaconf's ``DictConfig``, verl's config classes ``AlgoConfig`` / ``ActorConfig``, its device
helpers, ``tensordict.TensorDict``, and ``as_torch_index`` / ``group_mean_std`` (used only by the vectorised
estimators, which the tests do not call). ``rollout_corr_helper.py`` runs with the real ``verl/base_config.py`` and
``verl/trainer/config/algorithm.py`` (its RolloutCorrectionConfig and presets) and two more stand-ins it imports
without using them in the compared functions: ``PolicyLossConfig``, and ``verl.protocol.DataProto``, a container of
the IS weights (``from_dict(tensors=...).batch``). No function under test is replaced. A failed download fails the test.
"""

from __future__ import annotations

import sys
import types
import zipfile
from unittest import mock
from pathlib import Path

import pytest

from pinned_wheel import pinned_wheel

VERSION = "0.9.1"
WHEEL = f"verl-{VERSION}-py3-none-any.whl"
SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"


def wheel_path() -> Path:
    """The pinned verl wheel in .cache/verl (tests/pinned_wheel.py)."""
    return pinned_wheel("verl", VERSION, SHA256, "verl")


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _stand_ins() -> dict[str, types.ModuleType]:
    """The empty stand-ins of the imports the compared functions do not use (module docstring)."""
    class _Empty:
        pass

    def _unused(*args, **kwargs):
        raise NotImplementedError("not part of the comparison")

    return {
        "omegaconf": _module("omegaconf", DictConfig=type("DictConfig", (), {})),
        "tensordict": _module("tensordict", TensorDict=_Empty),
        "verl": _module("verl", __path__=[]), "verl.utils": _module("verl.utils", __path__=[],
                                                                    as_torch_index=_unused, group_mean_std=_unused),
        "verl.utils.device": _module("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=_unused),
        "verl.trainer": _module("verl.trainer", __path__=[]),
        "verl.trainer.config": _module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (), {})),
        "verl.trainer.ppo": _module("verl.trainer.ppo", __path__=[]),
        "verl.workers": _module("verl.workers", __path__=[]),
        "verl.workers.config": _module("verl.workers.config", ActorConfig=type("ActorConfig", (), {})),
    }


def _exec(name: str, source: str, modules: dict[str, types.ModuleType]) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"{WHEEL}/{name.replace('.', '/')}.py"
    modules[name] = mod
    sys.modules[name] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod


def load_core_algos() -> types.ModuleType:
    """verl's core_algos module, executed from the wheel (sys.modules is restored afterwards)."""
    with zipfile.ZipFile(wheel_path()) as z:
        sources = {n: z.read(f"{n.replace('.', '/')}.py").decode() for n in
                   ("verl.utils.import_utils", "verl.utils.torch_functional", "verl.trainer.ppo.core_algos")}
    modules = _stand_ins()
    with mock.patch.dict(sys.modules, modules):  # sys.modules as it was afterwards
        for name, source in sources.items():
            mod = _exec(name, source, modules)
            parent, _, leaf = name.rpartition(".")
            setattr(modules[parent], leaf, mod)
        return modules["verl.trainer.ppo.core_algos"]


@pytest.fixture(scope="session")
def verl_core_algos() -> types.ModuleType:
    return load_core_algos()


class _DataProto:
    """The stand-in of verl's DataProto container: ``from_dict(tensors=...)`` keeps them as ``.batch`` (how the IS
    weights travel from rollout_corr_helper to the bypass loss)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors: dict) -> "_DataProto":
        return cls(dict(tensors))


def load_rollout_corr() -> types.SimpleNamespace:
    """verl's rollout correction executed from the wheel: ``helper`` (rollout_corr_helper), ``core_algos``,
    ``config`` (trainer/config/algorithm.py) and ``modules``, the sys.modules entries under which they run: verl's
    functions import each other inside functions (the bypass loss), so call those under
    ``mock.patch.dict(sys.modules, ns.modules)``."""
    names = ("verl.utils.import_utils", "verl.utils.torch_functional", "verl.base_config",
             "verl.trainer.config.algorithm", "verl.trainer.ppo.core_algos", "verl.trainer.ppo.rollout_corr_helper")
    with zipfile.ZipFile(wheel_path()) as z:
        sources = {n: z.read(f"{n.replace('.', '/')}.py").decode() for n in names}
    modules = _stand_ins()
    modules["verl.protocol"] = _module("verl.protocol", DataProto=_DataProto)
    modules["verl.workers.config.actor"] = _module("verl.workers.config.actor", PolicyLossConfig=dict)
    with mock.patch.dict(sys.modules, modules):
        for name, source in sources.items():
            mod = _exec(name, source, modules)
            parent, _, leaf = name.rpartition(".")
            setattr(modules[parent], leaf, mod)
    return types.SimpleNamespace(helper=modules["verl.trainer.ppo.rollout_corr_helper"],
                                 core_algos=modules["verl.trainer.ppo.core_algos"],
                                 config=modules["verl.trainer.config.algorithm"], modules=modules)


@pytest.fixture(scope="session")
def verl_rollout_corr() -> types.SimpleNamespace:
    return load_rollout_corr()
