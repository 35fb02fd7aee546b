"""HTTP client for the ``/retrieve`` service: batched requests, timeouts, retries with capped exponential backoff and
full jitter.

A retriever restart takes minutes (loading wiki-18's 64.6 GB Flat index), so a service that is down or answers 5xx is waited for
up to ``max_wait_s`` (default 5 minutes), sleeping a uniform random time in ``[0, min(max_backoff_s, backoff_s *
2**i))`` between tries ("full jitter": after a restart the ranks of a run come back spread over that window, not in
step) and printing one line per wait so the user sees why the run stalls. A URL where nothing has ever been reached
(connection refused, unknown host, connect timeout: a mistyped URL, or no service started) is given up after
``first_contact_s`` (default 20 s, time for a service started beside the client to bind its port) with the URL named;
once the service has been reached (it answered, or it accepted a connection while loading its index) it is waited for
the whole ``max_wait_s``. Failure is loud: a service that stays down past the deadline, or answers something that is
not the contract, raises RetrieverError. The client never returns silently empty results.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

import httpx

from retriever.inprocess import validate_queries


class RetrieverError(RuntimeError):
    """The retriever could not answer (service down after retries, HTTP error, or a malformed response)."""


def retry_delay(attempt: int, backoff_s: float, max_backoff_s: float, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): full jitter, ``uniform(0, min(max_backoff_s, backoff_s *
    2**(attempt - 1)))``."""
    return rng.uniform(0.0, min(max_backoff_s, backoff_s * 2 ** (attempt - 1)))


class RetrieverClient:
    """``search(queries, topk) -> list[list[{"id", "contents", "score"}]]`` against a running service.

    Queries are sent ``batch_size`` at a time. Connection errors, timeouts and 5xx are retried until ``max_wait_s``
    seconds have passed since the first failure (``first_contact_s`` while the service has never been reached; at
    most ``max_retries`` times, if given), sleeping ``rng.uniform(0, min(backoff_s * 2**i, max_backoff_s))`` in
    between (:func:`retry_delay`; ``rng``: default a generator seeded by the system, so clients do not draw the same
    times) and printing one line per wait to stderr; 4xx and malformed answers are not retried (they would fail the
    same way again).
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0, max_wait_s: float = 300.0, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, max_retries: int | None = None, token: str | None = None,
                 batch_size: int = 256, first_contact_s: float = 20.0, rng: random.Random | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever url must start with http:// or https:// (got {url!r})")
        if (timeout_s <= 0 or batch_size < 1 or backoff_s < 0 or max_wait_s < 0 or max_backoff_s < 0
                or first_contact_s < 0 or (max_retries is not None and max_retries < 0)):
            raise ValueError("need timeout_s > 0, batch_size >= 1, backoff_s >= 0, max_backoff_s >= 0, "
                             "max_wait_s >= 0, first_contact_s >= 0, max_retries None or >= 0")
        self.url = url.rstrip("/")
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.max_wait_s, self.max_backoff_s, self.first_contact_s = max_wait_s, max_backoff_s, first_contact_s
        self.reached = False  # the service answered, or accepted a connection, at least once
        self.rng = rng or random.Random()
        self.batch_size = batch_size
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RetrieverClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _wait_line(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def _request(self, method: str, path: str, json_body: dict | None = None) -> Any:
        first_failure: float | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, self.url + path, json=json_body)
            except (httpx.TransportError, httpx.TimeoutException) as e:  # refused, reset, timed out
                last_error = f"{type(e).__name__}: {e}"
                # refused, unknown host, no connection in time: nothing reached; a read timeout did connect
                self.reached = self.reached or not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                self.reached = True
                if response.status_code < 500:
                    return self._answer(response, path)
                last_error = f"HTTP {response.status_code}: {response.text[:300]}"
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            waited = now - first_failure
            limit, setting = ((self.max_wait_s, "max_wait_s") if self.reached or self.max_wait_s <= self.first_contact_s
                              else (self.first_contact_s, "first_contact_s"))
            remaining = limit - waited
            if remaining <= 0 or (self.max_retries is not None and attempt > self.max_retries):
                raise self._unavailable(path, f"{attempt} attempt(s) over {waited:.1f} s, retriever.{setting}="
                                              f"{limit:g}; last error: {last_error}")
            delay = min(retry_delay(attempt, self.backoff_s, self.max_backoff_s, self.rng), remaining)
            self._wait_line(f"[retriever] {self.url}{path} not answering ({last_error.splitlines()[0][:120]}); "
                            f"retry {attempt} in {delay:.1f} s (waited {waited:.0f} s of "
                            f"retriever.{setting}={limit:g})")
            time.sleep(delay)

    def _unavailable(self, path: str, tried: str) -> RetrieverError:
        """The error of a request given up; ``tried``: the attempts, the time and the setting that ended them."""
        if not self.reached:
            return RetrieverError(f"retriever at {self.url} never answered: nothing is reachable there ({tried}); "
                                  "check the URL (--retriever-url, retriever.url) and that `python -m retriever "
                                  "serve` runs there")
        return RetrieverError(f"retriever at {self.url}{path} unavailable after {tried}; is `python -m retriever "
                              "serve` running?")

    def _answer(self, response: httpx.Response, path: str) -> Any:
        if response.status_code != 200:
            raise RetrieverError(f"retriever at {self.url}{path} rejected the request with HTTP "
                                 f"{response.status_code}: {response.text[:500]}")
        try:
            return response.json()
        except ValueError:
            raise RetrieverError(f"retriever at {self.url}{path} answered non-JSON: {response.text[:200]!r}") from None

    def info(self) -> dict:
        """The service's ``/health`` answer."""
        return self._request("GET", "/health")

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        try:
            validate_queries(queries, topk)
        except ValueError as e:
            raise RetrieverError(str(e)) from None
        results: list[list[dict]] = []  # an empty list of queries sends nothing and gets nothing
        for start in range(0, len(queries), self.batch_size):
            chunk = list(queries[start:start + self.batch_size])
            payload = self._request("POST", "/retrieve", {"queries": chunk, "topk": int(topk), "return_scores": True})
            results.extend(self._parse(payload, len(chunk)))
        return results

    def _parse(self, payload: Any, num_queries: int) -> list[list[dict]]:
        """Contract body -> hits; anything else raises RetrieverError naming what was wrong."""
        def bad(why: str) -> RetrieverError:
            return RetrieverError(f"retriever at {self.url} answered a malformed /retrieve response: {why}")

        if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
            raise bad("no 'result' list")
        result = payload["result"]
        if len(result) != num_queries:
            raise bad(f"{len(result)} result lists for {num_queries} queries")
        out = []
        for qi, hits in enumerate(result):
            if not isinstance(hits, list) or not hits:
                raise bad(f"result[{qi}] is {'empty' if isinstance(hits, list) else type(hits).__name__}")
            parsed = []
            for hi, hit in enumerate(hits):
                doc = hit.get("document") if isinstance(hit, dict) else None
                score = hit.get("score") if isinstance(hit, dict) else None
                if (not isinstance(doc, dict) or not isinstance(doc.get("contents"), str) or "id" not in doc
                        or isinstance(score, bool) or not isinstance(score, (int, float))):
                    raise bad(f"result[{qi}][{hi}] is not {{'document': {{'id', 'contents'}}, 'score': float}}")
                parsed.append({"id": str(doc["id"]), "contents": doc["contents"], "score": float(score)})
            out.append(parsed)
        return out
