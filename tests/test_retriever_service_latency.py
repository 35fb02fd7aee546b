"""The service adds no latency of its own: TCP_NODELAY on accepted connections, no batching wait at an idle server,
and a deeply nested body is refused before parsing (400, counted, one log line) instead of a RecursionError."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from fastapi.testclient import TestClient

from retriever.service import (Metrics, PortInUseError, QueryBatcher, ServiceSettings, bind_socket, create_app,
                               json_depth_exceeds)


def test_accepted_connections_get_tcp_nodelay():
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; accepted sockets inherit the listener's."""
    listener = bind_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    seen = {}

    async def main():
        accepted = asyncio.Event()

        def on_client(reader, writer):
            sock = writer.get_extra_info("socket")
            seen["nodelay"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            accepted.set()
            writer.close()

        server = await asyncio.start_server(on_client, sock=listener)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(accepted.wait(), 10)
        writer.close()
        server.close()

    asyncio.run(main())
    assert seen["nodelay"] != 0


def test_port_in_use_is_one_clear_error():
    taken = bind_socket("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        bind_socket("127.0.0.1", port)
    except PortInUseError as e:
        assert f"port {port} on 127.0.0.1 is already in use" in str(e) and "--port" in str(e)
    else:
        raise AssertionError("binding a taken port must fail")
    finally:
        taken.close()


class SlowFake:
    def __init__(self):
        self.calls = []

    def search(self, queries, topk):
        self.calls.append(len(queries))
        return [[{"id": q, "contents": q, "score": 1.0}] * topk for q in queries]

    def info(self):
        return {"retriever": "fake"}


def test_batching_window_never_delays_a_request_at_an_idle_server():
    fake = SlowFake()
    # a 3 s window: applied, it would hold every request >= 3 s; skipped, a request takes milliseconds. The margin
    # (1.5 s for the median) holds on a loaded machine.
    with TestClient(create_app(fake, ServiceSettings(batch_window_ms=3000))) as client:
        client.post("/retrieve", json={"queries": ["warm"]})
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            assert client.post("/retrieve", json={"queries": [f"q{i}"], "topk": 1}).status_code == 200
            times.append(time.perf_counter() - t0)
    assert sorted(times)[2] < 1.5, times


def test_json_depth_scan():
    assert not json_depth_exceeds(b'{"queries": ["a [[[[ {{{{", "b"], "topk": 3}', 2)  # brackets in strings
    assert not json_depth_exceeds(b'{"queries": ["\\\\", "\\"[[[["]}', 2)  # escaped quotes / backslashes
    assert json_depth_exceeds(b'{"queries": [["a"]]}', 2)
    assert json_depth_exceeds(b"[" * 100_000, 16)


def test_deeply_nested_body_is_a_counted_400_with_one_log_line(caplog):
    body = b"[" * 100_000 + b"]" * 100_000  # 200 KB, under the body limit
    with TestClient(create_app(SlowFake(), ServiceSettings())) as client:
        with caplog.at_level(logging.WARNING, logger="retriever.service"):
            r = client.post("/retrieve", content=body)
        assert r.status_code == 400 and "deeper than 16 levels" in r.json()["error"]
        assert client.post("/retrieve", json={"queries": ["ok"]}).status_code == 200
        m = client.get("/metrics").json()
    assert m["rejected_by_reason"] == {"json_too_deep": 1} and m["requests_by_status"] == {"200": 1, "400": 1}
    lines = [rec for rec in caplog.records if rec.name == "retriever.service"]
    assert len(lines) == 1 and "\n" not in lines[0].getMessage() and not lines[0].exc_info


def test_a_batch_waits_for_the_clients_of_the_last_one_instead_of_splitting_them():
    """8 clients that come back 0 to 14 ms after their answer, a 100 ms search: every batch holds all 8 requests
    (searching whatever arrived within a few ms would split them over two index passes)."""
    sizes = []

    def search(queries, topk):
        sizes.append(len(queries))
        time.sleep(0.1)
        return [[{"id": q, "contents": q, "score": 1.0}] for q in queries]

    async def main():
        batcher = QueryBatcher(search, window_ms=250, max_batch_queries=256, metrics=Metrics())
        batcher.start()

        async def client(c):
            for i in range(4):
                assert (await batcher.submit([f"{c}-{i}"], 1))[0][0]["id"] == f"{c}-{i}"
                await asyncio.sleep(0.002 * c)

        await asyncio.gather(*(client(c) for c in range(8)))
        await batcher.stop()

    asyncio.run(main())
    assert sizes == [8, 8, 8, 8], sizes
