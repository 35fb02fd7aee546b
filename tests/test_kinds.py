"""The generation backends and retriever modes as kinds: each name is read once, into an object that carries the
kind's facts; a setting the kind cannot serve stops the run when it is chosen."""

from __future__ import annotations

import dataclasses

import pytest

import retriever
from searchr1_lld.config import ConfigError, RetrieverConfig, RolloutConfig, VLLMConfig, load_config
from searchr1_lld.rollout.backends import BACKEND_KINDS, backend_kind
from searchr1_lld.rollout.backends.hf import HFBackend
from searchr1_lld.rollout.backends.vllm import VLLMBackend


def test_each_backend_name_is_a_kind_with_its_facts():
    assert set(BACKEND_KINDS) == {"hf", "vllm"}
    hf, vllm = backend_kind(RolloutConfig(backend="hf")), backend_kind(RolloutConfig(backend="vllm"))
    # the kind that streams requests is the one whose engine has the request-level API the scheduler drives
    assert [k.streams_requests for k in (hf, vllm)] == [hasattr(HFBackend, "add_request"),
                                                        hasattr(VLLMBackend, "add_request")]
    r = RolloutConfig(generation_batch_size=3, max_total_length=100,
                      vllm=VLLMConfig(enable_sleep_mode=True, sleep_level=1))
    assert hf.hf_engine_tokens(r) == 300 and vllm.hf_engine_tokens(r) is None
    assert vllm.parks_weights(r) and not vllm.parks_weights(dataclasses.replace(r, vllm=VLLMConfig(sleep_level=2)))
    assert not hf.parks_weights(r)
    assert vllm.plan_notes(dataclasses.replace(r, vllm=VLLMConfig(enable_sleep_mode=False))) and not vllm.plan_notes(r)
    assert hf.generates_on_learner_module and not vllm.generates_on_learner_module


def test_a_scheduler_the_kind_cannot_serve_stops_when_the_kind_is_chosen():
    cfg = load_config(None, ["rollout.scheduler=continuous"])  # hf by default
    with pytest.raises(ConfigError, match=r"rollout.scheduler: continuous needs an engine with a request-level API "
                                          r".*the hf engine runs turn by turn.*\(got 'continuous'\)"):
        backend_kind(cfg.rollout)
    assert backend_kind(dataclasses.replace(cfg.rollout, backend="vllm")).streams_requests
    with pytest.raises(ConfigError, match="rollout.backend: must be one of"):
        backend_kind(dataclasses.replace(cfg.rollout, backend="sglang"))


def test_each_retriever_mode_is_a_kind_with_its_facts(monkeypatch):
    http = retriever.retriever_mode(RetrieverConfig(mode="http", url="http://127.0.0.1:9"))
    inproc = retriever.retriever_mode(RetrieverConfig(mode="inprocess", index_dir="IDX"))
    assert set(retriever.MODES) == {"inprocess", "http"}
    assert inproc.index_in_process and not http.index_in_process
    assert (inproc.index_dir(RetrieverConfig(index_dir="IDX")), http.index_dir(RetrieverConfig(index_dir="IDX"))) == (
        "IDX", None)
    monkeypatch.setenv(retriever.modes.URL_ENV, "http://node0:8000")
    assert http.addressed(RetrieverConfig(mode="http")).url == "http://node0:8000"
    assert inproc.addressed(RetrieverConfig(index_dir="IDX")) == RetrieverConfig(index_dir="IDX")
    with pytest.raises(ConfigError, match="retriever.url: must start with http"):
        load_config(None, ["retriever.mode=http", "retriever.url=node0:8000"])
    load_config(None, ["retriever.url=node0:8000"])  # in-process: the url is not used
    facts = retriever.modes.IndexFacts(num_docs=10, dim=4, index_type="Flat", service_gpus=2)
    assert http.gpu_index_copies(RetrieverConfig(mode="http"), facts, 8)[:2] == (2, 1)
    assert inproc.gpu_index_copies(RetrieverConfig(use_gpu_index=True), facts, 8) == (1, 1, "")  # whole, own GPU
    assert inproc.gpu_index_copies(RetrieverConfig(), facts, 8) is None
    with pytest.raises(ValueError, match="retriever.mode must be one of"):
        retriever.retriever_mode(RetrieverConfig(mode="grpc"))


def test_the_vllm_kind_owns_its_section_and_its_checks():
    """rollout.vllm.* is the vLLM kind's section: an old flat key is refused with its new name, and the kind checks
    its settings when it is chosen (an HF run does not read them)."""
    with pytest.raises(ConfigError, match=r"^rollout.vllm_sleep_level is now rollout.vllm.sleep_level"):
        load_config(None, ["rollout.vllm_sleep_level=1"])
    cfg = load_config(None, ["rollout.vllm.sleep_level=3", "rollout.vllm.gpu_memory_utilization=0.5"])
    assert (cfg.rollout.vllm.sleep_level, cfg.rollout.vllm.gpu_memory_utilization) == (3, 0.5)
    assert backend_kind(cfg.rollout).name == "hf"
    with pytest.raises(ConfigError, match=r"rollout.vllm.sleep_level: must be 1 or 2 \(got 3\)"):
        backend_kind(dataclasses.replace(cfg.rollout, backend="vllm"))
