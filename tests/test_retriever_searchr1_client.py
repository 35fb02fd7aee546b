"""Search-R1's trainer traffic against our service, as its client code sends it and formats the answer.

Search-R1's trainer (``search_r1/llm_agent/generation.py``) talks to the retriever like this (facts, restated here
as our own test code):

- ``_batch_search(queries)``: one ``POST`` of ``{"queries": queries, "topk": topk, "return_scores": True}`` to the
  ``/retrieve`` URL, then ``.json()`` of the answer, no status check; ``batch_search`` reads ``["result"]``
  (a non-200 answer has no ``result``: ``KeyError: 'result'`` kills the training step);
- the queries are the stripped contents of ``<search>...</search>`` of every trajectory that searched this turn:
  an empty list when none did, ``""`` for ``<search> </search>``, and up to train_batch_size x n_agent
  = 512 x 5 = 2,560 queries in one POST (``train_grpo.sh``);
- ``_passages2string(hits)``: for hit ``i`` (from 1), ``contents = hit["document"]["contents"]``,
  ``title = contents.split("\\n")[0]``, ``text = "\\n".join(contents.split("\\n")[1:])``, and the line
  ``f"Doc {i}(Title: {title}) {text}\\n"``; the observation is ``"\\n\\n<information>" + s.strip() +
  "</information>\\n\\n"``.

The expected strings below are written out by hand from those rules, so a formatting difference fails byte for byte.
"""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from retriever.inprocess import InProcessRetriever
from retriever.service import ServiceSettings, create_app

# ----------------------------------------------------------------------- the trainer's side, as our own test code


class SearchR1TrainerClient:
    """What Search-R1's LLMGenerationManager does with the retriever, over any httpx-compatible client."""

    def __init__(self, http, url: str = "/retrieve", topk: int = 3):
        self.http, self.url, self.topk = http, url, topk

    def _batch_search(self, queries: list[str]) -> dict:
        payload = {"queries": queries, "topk": self.topk, "return_scores": True}
        return self.http.post(self.url, json=payload).json()  # no status check, like requests.post(...).json()

    def batch_search(self, queries: list[str]) -> list[str]:
        results = self._batch_search(queries)["result"]  # KeyError: 'result' on any error body
        return [self._passages2string(result) for result in results]

    @staticmethod
    def _passages2string(retrieval_result: list[dict]) -> str:
        out = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            lines = content.split("\n")
            out += f"Doc {idx + 1}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n"
        return out

    @staticmethod
    def observation(search_result: str) -> str:
        return f"\n\n<information>{search_result.strip()}</information>\n\n"


# ------------------------------------------------------------------------------------------------------- fixtures


class ListRetriever:
    """Every query gets the same fixed hits (their contents exercise the title/text split's edge cases)."""

    def __init__(self, contents: list[str]):
        self.contents = contents
        self.calls: list[list[str]] = []

    def search(self, queries, topk):
        self.calls.append(list(queries))
        return [[{"id": str(i), "contents": c, "score": 1.0 - i / 10} for i, c in enumerate(self.contents[:topk])]
                for _ in queries]

    def info(self):
        return {"retriever": "list", "index_type": "none", "num_docs": len(self.contents), "encoder": "none"}


@pytest.fixture(scope="module")
def world_app(tiny_world):
    retriever = InProcessRetriever(tiny_world / "index")
    with TestClient(create_app(retriever, ServiceSettings())) as http:  # default limits, as `serve` uses them
        yield http, retriever


# ---------------------------------------------------------------------------------------------------------- tests


def test_passages2string_rules_byte_for_byte():
    contents = ['"Ribond"\nRibond is a city.', "no newline at all", 'T\nline one\nline two', '"Empty text"\n']
    with TestClient(create_app(ListRetriever(contents), ServiceSettings(max_topk=10))) as http:
        client = SearchR1TrainerClient(http, topk=4)
        strings = client.batch_search(["q"])
    assert strings == ['Doc 1(Title: "Ribond") Ribond is a city.\n'
                       "Doc 2(Title: no newline at all) \n"
                       "Doc 3(Title: T) line one\nline two\n"
                       'Doc 4(Title: "Empty text") \n']
    assert client.observation(strings[0]) == (
        '\n\n<information>Doc 1(Title: "Ribond") Ribond is a city.\nDoc 2(Title: no newline at all) \n'
        'Doc 3(Title: T) line one\nline two\nDoc 4(Title: "Empty text")</information>\n\n')


def test_turn_without_searches_sends_empty_list(world_app):
    http, _ = world_app
    r = http.post("/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert r.status_code == 200 and r.json() == {"result": []}
    assert SearchR1TrainerClient(http).batch_search([]) == []


def test_empty_query_in_a_batch_is_searched_like_any_other(world_app, tiny_world):
    http, retriever = world_app
    rows = [json.loads(line) for line in (tiny_world / "corpus.jsonl").read_text().splitlines()[:2]]
    titles = [row["contents"].split("\n")[0].strip('"') for row in rows]
    queries = [titles[0], "", titles[1]]
    strings = SearchR1TrainerClient(http).batch_search(queries)
    assert len(strings) == 3 and all(s.startswith("Doc 1(Title: ") and s.count("\n") >= 3 for s in strings)
    # the same hits the index gives in-process, formatted by the rules (built here without the client's helper)
    for s, hits in zip(strings, retriever.search(queries, 3)):
        want = "".join(f"Doc {i + 1}(Title: {h['contents'].split(chr(10))[0]}) "
                       f"{chr(10).join(h['contents'].split(chr(10))[1:])}\n" for i, h in enumerate(hits))
        assert s == want
    first = rows[0]["contents"].split("\n")
    assert strings[0].startswith(f"Doc 1(Title: {first[0]}) {first[1]}\n")  # the title query finds its passage


def test_train_grpo_batch_of_2560_realistic_queries_in_one_post(world_app, tiny_world):
    http, _ = world_app
    questions = [json.loads(line)["question"] for line in (tiny_world / "qa" / "train.jsonl").read_text().splitlines()]
    # realistic length: a generated query is a question plus a few words (here ~100-200 characters each)
    queries = [f"{questions[i % len(questions)]} (attempt {i}, looking for the founding year and the city)"
               for i in range(512 * 5)]
    body = json.dumps({"queries": queries, "topk": 3, "return_scores": True}).encode()
    assert len(body) > 1 << 18  # well above a toy body
    strings = SearchR1TrainerClient(http).batch_search(queries)
    assert len(strings) == 2560 and all(s.startswith("Doc 1(Title: ") for s in strings)


def test_truly_malformed_input_still_gets_informative_4xx(world_app):
    http, _ = world_app
    for payload, fragment in (({"queries": "who"}, "must be a list"), ({"queries": [None]}, "queries[0]"),
                              ({"queries": ["a"], "topk": 0}, "'topk'"), ({"quries": ["a"]}, "unknown field")):
        r = http.post("/retrieve", json=payload)
        assert 400 <= r.status_code < 500 and fragment in r.json()["error"], (payload, r.text)
    r = http.post("/retrieve", json={"queries": ["q"] * 4097})
    assert r.status_code == 422 and "--max-queries" in r.json()["error"]
    r = http.post("/retrieve", content=b"[" * 5000 + b"]" * 5000)
    assert r.status_code == 400 and "deeper than 16" in r.json()["error"]


def test_our_client_speaks_the_same_protocol(world_app):
    from retriever.client import RetrieverClient

    http, retriever = world_app
    client = RetrieverClient("http://testserver", batch_size=10_000)
    client._http = http  # the ASGI test client is an httpx.Client
    queries = ["", "Paerme Industries"]
    assert client.search([], 3) == []
    assert [[h["id"] for h in hits] for hits in client.search(queries, 3)] == [
        [h["id"] for h in hits] for hits in retriever.search(queries, 3)]
    assert isinstance(httpx.Client, type)
