"""Upstream failures the simulated engine cannot be made to produce on demand, played by a
raw-socket HTTP server: a 5xx before the first byte is retried on the next candidate, and a
stream that breaks after its first byte ends with an OpenAI-style error event."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from tests.gateway.conftest import MODEL, chat_body
from tests.gateway.test_transport import RawServer

BROKEN_STREAM = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    + b"%x\r\n" % len(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
    + b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n\r\n'
)
SERVER_ERROR = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\n\r\n{}"


def with_fake_worker(doc: dict[str, Any], url: str) -> dict[str, Any]:
    fake = {
        **doc["workers"][0],
        "id": "fake",
        "url": url,
        "kv_events_endpoint": None,
        "replay_endpoint": None,
    }
    return {**doc, "workers": [*doc["workers"], fake]}


async def test_a_5xx_before_the_first_byte_is_retried_on_the_next_candidate(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(1, kv_events=False)
    server = RawServer([SERVER_ERROR])
    async with server as url:
        # round_robin alternates, so some requests try the failing worker first.
        gw = gateway_factory(
            with_fake_worker(fleet.snapshot(policy="round_robin"), url),
            metrics_interval_s=0,
            breaker_failures=100,
        )
        async with httpx.AsyncClient(timeout=10) as client:
            for i in range(4):
                resp = await client.post(gw.url + "/v1/chat/completions", json=chat_body(f"q{i}"))
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-kvroute-worker"] == "sim-0"
    assert len(server.requests) == 2  # half of them went to the fake worker first
    metrics = httpx.get(gw.url + "/gateway/metrics").text
    assert 'kvroute_gateway_retries_total{reason="http_5xx",worker="fake"} 2.0' in metrics


async def test_a_stream_broken_after_its_first_byte_ends_with_an_error_event(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(1, kv_events=False)
    server = RawServer([BROKEN_STREAM], close_after_each=True)
    async with server as url:
        doc = with_fake_worker(fleet.snapshot(), url)
        doc["workers"] = doc["workers"][1:]  # only the fake worker
        gw = gateway_factory(doc, metrics_interval_s=0)
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(
                gw.url + "/v1/chat/completions", json=chat_body("hi", stream=True)
            )
    assert resp.status_code == 200  # the status was sent with the first byte
    events = [e[len("data: ") :] for e in resp.text.split("\n\n") if e.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "hi"
    error = json.loads(events[1])["error"]
    assert error["type"] == "upstream_error" and "broke" in error["message"]
    assert events[2] == "[DONE]"
    deadline = time.monotonic() + 3
    while not gw.state.records.sink.read():
        assert time.monotonic() < deadline, "no request record"
        await asyncio.sleep(0.02)
    [(_, record)] = gw.state.records.sink.read()
    assert (record["status"], record["worker_id"], record["model"]) == ("error", "fake", MODEL)
