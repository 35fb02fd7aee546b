"""FastAPI search service speaking the Search-R1 ``/retrieve`` protocol.

    POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores: true)
      -> {"result": [[{"id", "contents"}, ...], ...]}                                 (return_scores: false)
    GET /health    status, retriever, index type, size, encoder
    GET /metrics   request counts by status, queries, batches, latency percentiles

Concurrent requests are batched: each request puts its queries on an asyncio queue; one worker takes everything
queued, runs one encode + search for the union in a worker thread, and hands each request its slice. A Flat search
reads the whole index per call, so after answering R requests the worker waits for those R clients to come back
(besides the requests queued; at most ``batch_window_ms`` and the last search's duration) instead of splitting them
over two calls; a lone client (R = 1) is searched at once. ``batching=False`` searches each request on its own in
the thread pool (as the reference Search-R1 server does) for comparison.

Search-R1's trainer traffic is accepted as its own server accepts it: ``queries: []`` (a turn where no trajectory
searched) -> ``{"result": []}``; an empty query ``""`` (``<search> </search>``) is searched like any other; one POST
of 512 prompts x 5 samples = 2,560 queries fits the default limits. Bad input gets a 4xx with ``{"error": message}``
and the server stays up; JSON nested deeper than ``max_json_depth`` is refused before it is parsed. With ``token`` set, ``/retrieve`` and
``/metrics`` need ``Authorization: Bearer <token>`` (401 otherwise); ``/health`` stays open for liveness probes.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Protocol

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from retriever.runtime import runtime_info

log = logging.getLogger("retriever.service")


# Search-R1's train_grpo.sh sends train_batch_size 512 x n_agent 5 = 2,560 queries in one POST; 4,096 leaves room.
DEFAULT_MAX_QUERIES = 4096
# ... of realistic length: a generated query is at most a few hundred tokens (~2 KiB of JSON); 4,096 x 4 KiB.
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_JSON_DEPTH = 16  # a valid body is 2 deep ({"queries": [...]})


@dataclass
class ServiceSettings:
    max_topk: int = 50
    default_topk: int = 3
    max_queries: int = DEFAULT_MAX_QUERIES  # per request
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    token: str | None = None
    batching: bool = True  # False: one search per request, as the reference server does
    batch_window_ms: float = 250.0  # the most a batch waits for the clients of the last batch to come back
    max_batch_queries: int = 256  # a batch stops taking requests at this many queries


class BadRequest(Exception):
    def __init__(self, status: int, message: str, reason: str = "invalid"):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def json_depth_exceeds(body: bytes, max_depth: int) -> bool:
    """True if ``body`` opens more than ``max_depth`` nested arrays/objects (brackets inside strings do not count).

    A linear scan of the raw bytes, so ``[[[[...]]]]`` is refused before ``json.loads`` recurses into it (which
    raises RecursionError from deep inside the parser, a 500 with a traceback per request).
    """
    depth, in_string, escaped = 0, False, False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def parse_retrieve_body(body: bytes, s: ServiceSettings) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body -> ``(queries, topk, return_scores)``; raise BadRequest with a clear message."""
    if json_depth_exceeds(body, s.max_json_depth):
        raise BadRequest(400, f"body nests JSON arrays/objects deeper than {s.max_json_depth} levels; "
                              "expected {\"queries\": [str, ...], \"topk\": int, \"return_scores\": bool}",
                         reason="json_too_deep")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise BadRequest(422, "body must be a JSON object {\"queries\": [...], \"topk\": int, \"return_scores\": bool}")
    unknown = sorted(set(payload) - {"queries", "topk", "return_scores"})
    if unknown:
        raise BadRequest(422, f"unknown field(s) {unknown}; allowed: queries, topk, return_scores")
    queries = payload.get("queries")
    if queries is None:
        raise BadRequest(422, "missing field 'queries' (a list of strings)")
    if not isinstance(queries, list):
        raise BadRequest(422, f"'queries' must be a list of strings (got {type(queries).__name__})")
    if len(queries) > s.max_queries:
        raise BadRequest(422, f"too many queries: {len(queries)} > max {s.max_queries} per request "
                              "(serve --max-queries raises it)")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(422, f"queries[{i}] must be a string (got {type(q).__name__})")
    topk = payload.get("topk", s.default_topk)
    if topk is None:
        topk = s.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(422, f"'topk' must be an integer (got {topk!r})")
    if not 1 <= topk <= s.max_topk:
        raise BadRequest(422, f"'topk' must be in [1, {s.max_topk}] (got {topk})")
    return_scores = payload.get("return_scores", False)
    if return_scores is None:
        return_scores = False
    if not isinstance(return_scores, bool):
        raise BadRequest(422, f"'return_scores' must be true or false (got {return_scores!r})")
    return queries, topk, return_scores


def format_result(hits_per_query: list[list[dict]], return_scores: bool) -> dict:
    """Hits ``{"id","contents","score"}`` -> the Search-R1 response body."""
    if return_scores:
        return {"result": [[{"document": {"id": h["id"], "contents": h["contents"]}, "score": h["score"]}
                            for h in hits] for hits in hits_per_query]}
    return {"result": [[{"id": h["id"], "contents": h["contents"]} for h in hits] for hits in hits_per_query]}


class Metrics:
    """Request counters and a ring buffer of recent latencies (ms)."""

    def __init__(self, window: int = 10_000):
        self.started = time.time()
        self.requests_by_status: collections.Counter[int] = collections.Counter()
        self.rejected_by_reason: collections.Counter[str] = collections.Counter()
        self.queries_total = 0
        self.batches_total = 0
        self.batched_queries_total = 0
        self.max_batch_queries_seen = 0
        self.latencies_ms: collections.deque[float] = collections.deque(maxlen=window)
        self._lock = threading.Lock()

    def record_request(self, status: int, latency_ms: float | None = None, num_queries: int = 0,
                       reason: str | None = None) -> None:
        with self._lock:
            self.requests_by_status[status] += 1
            if reason:
                self.rejected_by_reason[reason] += 1
            self.queries_total += num_queries
            if latency_ms is not None:
                self.latencies_ms.append(latency_ms)

    def record_batch(self, num_queries: int) -> None:
        with self._lock:
            self.batches_total += 1
            self.batched_queries_total += num_queries
            self.max_batch_queries_seen = max(self.max_batch_queries_seen, num_queries)

    def snapshot(self) -> dict:
        with self._lock:
            lat = np.asarray(self.latencies_ms, dtype=np.float64)
            pct = ({f"p{p}": round(float(np.percentile(lat, p)), 3) for p in (50, 90, 99)} | {
                "mean": round(float(lat.mean()), 3), "max": round(float(lat.max()), 3)}) if lat.size else {}
            total = sum(self.requests_by_status.values())
            return {"uptime_s": round(time.time() - self.started, 1), "requests_total": total,
                    "requests_ok": self.requests_by_status.get(200, 0),
                    "requests_by_status": {str(k): v for k, v in sorted(self.requests_by_status.items())},
                    "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
                    "queries_total": self.queries_total, "batches_total": self.batches_total,
                    "mean_queries_per_batch": round(self.batched_queries_total / self.batches_total, 2)
                    if self.batches_total else 0.0,
                    "max_queries_per_batch": self.max_batch_queries_seen,
                    "latency_ms": pct, "latency_window": int(lat.size)}


class QueryBatcher:
    """Collect queries from concurrent requests, search their union in one call, hand back each request's slice."""

    def __init__(self, search: Callable[[list[str], int], list[list[dict]]], *, window_ms: float,
                 max_batch_queries: int, metrics: Metrics):
        self.search, self.window_s, self.max_batch = search, window_ms / 1000.0, max_batch_queries
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-search")
        self._task: asyncio.Task | None = None
        self._last_batch_requests = 0
        self._last_search_s = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=False)

    async def submit(self, queries: list[str], topk: int) -> list[list[dict]]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, topk, future))
        return await future

    async def _collect(self) -> list[tuple[list[str], int, asyncio.Future]]:
        """Everything queued now, then more until the clients of the last batch are back too (as many requests as
        it answered, besides those already queued) or the wait reaches ``window`` or the last search's duration."""
        expected = self._last_batch_requests + self.queue.qsize()  # a lone client at an idle server: 1, no wait
        batch = [await self.queue.get()]
        size = len(batch[0][0])
        deadline = time.monotonic() + min(self.window_s, self._last_search_s)
        while size < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if len(batch) >= expected or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            batch.append(item)
            size += len(item[0])
        return batch

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            batch = [item for item in batch if not item[2].done()]  # client gone: skip its queries
            self._last_batch_requests = len(batch)
            if not batch:
                continue
            queries = [q for item in batch for q in item[0]]
            topk = max(item[1] for item in batch)
            self.metrics.record_batch(len(queries))
            started = time.monotonic()
            try:
                hits = await loop.run_in_executor(self.executor, self.search, queries, topk)
            except Exception as e:  # noqa: BLE001 - every waiting request gets the error, the worker lives on
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            finally:
                self._last_search_s = time.monotonic() - started
            start = 0
            for item_queries, item_topk, future in batch:
                part = [h[:item_topk] for h in hits[start:start + len(item_queries)]]
                start += len(item_queries)
                if not future.done():
                    future.set_result(part)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Searcher(Protocol):
    """What the service serves: ``search(queries, topk)`` (hits ``{"id", "contents", "score"}`` per query, best first)
    and ``info()`` (what ``/health`` reports); an :class:`~retriever.inprocess.InProcessRetriever` is one."""

    def search(self, queries: list[str], topk: int) -> list[list[dict]]: ...

    def info(self) -> dict: ...


def create_app(retriever: Searcher, settings: ServiceSettings | None = None) -> FastAPI:
    """The FastAPI app around any object with ``search(queries, topk)`` and ``info()``."""
    s = settings or ServiceSettings()
    if s.max_topk < 1 or not 1 <= s.default_topk <= s.max_topk:
        raise ValueError(f"need 1 <= default_topk ({s.default_topk}) <= max_topk ({s.max_topk})")
    metrics = Metrics()
    state: dict[str, QueryBatcher] = {}

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if s.batching:
            state["batcher"] = QueryBatcher(retriever.search, window_ms=s.batch_window_ms,
                                            max_batch_queries=s.max_batch_queries, metrics=metrics)
            state["batcher"].start()
        yield
        if "batcher" in state:
            await state["batcher"].stop()

    app = FastAPI(title="searchr1-lld retriever", lifespan=lifespan)
    info = retriever.info()
    _add_retrieve_route(app, retriever, s, metrics, state)
    _add_status_routes(app, info, s, metrics)
    return app


def _authorized(request: Request, token: str | None) -> bool:
    if not token:
        return True
    header = request.headers.get("authorization", "")
    return hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


def _unauthorized() -> JSONResponse:
    return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


async def _read_body_limited(request: Request, max_body_bytes: int) -> bytes:
    """The request's body; BadRequest 413 once it is (or declares to be) over ``max_body_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise BadRequest(413, f"body of {declared} bytes exceeds the limit of {max_body_bytes} bytes "
                              "(serve --max-body-bytes raises it)", reason="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise BadRequest(413, f"body exceeds the limit of {max_body_bytes} bytes "
                                  "(serve --max-body-bytes raises it)", reason="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _add_retrieve_route(app: FastAPI, retriever: Searcher, s: ServiceSettings, metrics: Metrics,
                        state: dict[str, QueryBatcher]) -> None:
    """``POST /retrieve``: validate, search (through the batcher in ``state`` when batching), answer."""

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        t0 = time.perf_counter()
        if not _authorized(request, s.token):
            metrics.record_request(401)
            return _unauthorized()
        try:
            queries, topk, return_scores = parse_retrieve_body(await _read_body_limited(request, s.max_body_bytes), s)
        except BadRequest as e:
            metrics.record_request(e.status, reason=e.reason)
            if e.reason == "json_too_deep":  # one line, never a traceback
                log.warning("rejected /retrieve from %s: %s", request.client.host if request.client else "?",
                            e.message.split(";")[0])
            return _error(e.status, e.message)
        if not queries:  # a turn in which no trajectory searched
            metrics.record_request(200, (time.perf_counter() - t0) * 1000.0, 0)
            return Response(b'{"result": []}', media_type="application/json")
        try:
            if s.batching:
                hits = await state["batcher"].submit(queries, topk)
            else:
                hits = await asyncio.get_running_loop().run_in_executor(None, retriever.search, queries, topk)
        except Exception as e:  # noqa: BLE001 - report, stay up
            metrics.record_request(500)
            return _error(500, f"search failed: {type(e).__name__}: {e}")
        body = json.dumps(format_result(hits, return_scores), ensure_ascii=False).encode("utf-8")
        metrics.record_request(200, (time.perf_counter() - t0) * 1000.0, len(queries))
        return Response(body, media_type="application/json")


def _add_status_routes(app: FastAPI, info: dict, s: ServiceSettings, metrics: Metrics) -> None:
    """``GET /health`` (open, for liveness probes) and ``GET /metrics`` (behind the token)."""

    @app.get("/health")
    async def health() -> dict:
        return {**runtime_info(), "status": "ok", "retriever": info.get("retriever"), "index_type": info.get("index_type"),
                "num_docs": info.get("num_docs"), "encoder": info.get("encoder"), "dim": info.get("dim"),
                "load_mode": info.get("load_mode"), "batching": s.batching, "max_topk": s.max_topk,
                "max_queries": s.max_queries}

    @app.get("/metrics")
    async def get_metrics(request: Request) -> Response:
        if not _authorized(request, s.token):
            return _unauthorized()
        return JSONResponse(metrics.snapshot())


class PortInUseError(OSError):
    """The address to serve on is taken (or not ours to bind); the message says what to do."""


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 = any free port), created before anything slow is loaded.

    The socket is created with ``IPPROTO_TCP`` spelled out: asyncio sets TCP_NODELAY on accepted connections only
    when the socket's ``proto`` says TCP, and a socket made with proto 0 (the default) keeps Nagle's algorithm on,
    so every reply written in two pieces (headers, body) waited ~40 ms for the client's delayed ACK.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        import errno

        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(e.errno, f"port {port} on {host} is already in use (another retriever?); stop it "
                                          "or pick another port with --port (0 = any free port)") from None
        raise PortInUseError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    return sock


def serve(retriever: Searcher, settings: ServiceSettings, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning", ready_message: bool = True, sock: socket.socket | None = None) -> None:
    """Run the app with uvicorn on ``host:port`` (port 0 = a free port); print ``retriever ready on URL`` once up.

    ``sock``: an already listening socket from ``bind_socket`` (the CLI binds before loading the index, so a taken
    port fails in a second, not after minutes of loading).
    """
    import uvicorn

    if sock is None:
        sock = bind_socket(host, port)
    family = sock.family
    real_port = sock.getsockname()[1]
    app = create_app(retriever, settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_keep_alive=30,
                                           backlog=2048))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task  # re-raise the start-up failure
                return
            await asyncio.sleep(0.02)
        if ready_message:
            shown = f"[{host}]" if family == socket.AF_INET6 else host
            print(f"retriever ready on http://{shown}:{real_port}", flush=True)
        await task

    asyncio.run(main())
