"""Streaming through the gateway: chunk-by-chunk passthrough, usage handling, client
disconnects, and the OpenAI Python SDK pointed at the gateway."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai

from tests.gateway.conftest import MODEL, chat_body


def sse_events(text: str) -> list[str]:
    return [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]


def test_usage_is_fetched_upstream_but_stripped_unless_asked(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(1)
    gw = gateway_factory(fleet.snapshot())
    plain = httpx.post(
        gw.url + "/v1/chat/completions", json=chat_body("tell me " * 30, stream=True), timeout=10
    )
    assert plain.headers["content-type"].startswith("text/event-stream")
    events = sse_events(plain.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(c["choices"] for c in chunks)  # no usage-only chunk
    assert all(not c.get("usage") for c in chunks)

    asked = httpx.post(
        gw.url + "/v1/chat/completions",
        json=chat_body("tell me " * 30, stream=True, stream_options={"include_usage": True}),
        timeout=10,
    )
    chunks = [json.loads(e) for e in sse_events(asked.text)[:-1]]
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert (
        usage["prompt_tokens_details"]["cached_tokens"]
        == int(asked.headers["x-kvroute-predicted-cached-tokens"])
        > 0
    )

    # Either way the gateway learned the actual cached tokens for its record.
    time.sleep(0.2)
    recs = [r for _, r in gw.state.records.sink.read()]
    assert [r["actual_cached_tokens"] is not None for r in recs] == [True, True]
    assert all(r["stream"] and r["ttft_ms"] > 0 and r["output_tokens"] == 4 for r in recs)


def test_stream_is_passed_through_as_it_arrives(fleet_factory: Any, gateway_factory: Any) -> None:
    # Real time: 200 tokens take about half a second; the first must arrive long before the end.
    fleet = fleet_factory(1, time_scale=1.0)
    gw = gateway_factory(fleet.snapshot())
    body = chat_body("stream please", stream=True, max_tokens=200, ignore_eos=True)
    started = time.monotonic()
    arrivals = []
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=20) as resp:
        for chunk in resp.iter_raw():
            if chunk:
                arrivals.append(time.monotonic() - started)
    assert len(arrivals) > 20
    assert arrivals[-1] - arrivals[0] > 0.2
    assert arrivals[0] < arrivals[-1] / 2


def test_client_disconnect_mid_stream_frees_inflight_and_aborts_upstream(
    fleet_factory: Any, gateway_factory: Any
) -> None:
    fleet = fleet_factory(1, time_scale=1.0)
    gw = gateway_factory(fleet.snapshot())
    body = chat_body("a long answer please", stream=True, max_tokens=1500, ignore_eos=True)
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=20) as resp:
        worker = resp.headers["x-kvroute-worker"]
        it = resp.iter_raw()
        next(it)
        next(it)
        assert gw.call(lambda: gw.state.load.inflight(worker)[0]) == 1
    # The client hung up: in-flight accounting is released and the engine aborts the request.
    deadline = time.monotonic() + 5
    while gw.call(lambda: gw.state.load.inflight(worker)[0]) != 0:
        assert time.monotonic() < deadline, "in-flight accounting not released"
        time.sleep(0.02)
    deadline = time.monotonic() + 5
    while fleet.workers[0].finished_by_reason.get("abort", 0) != 1:
        assert time.monotonic() < deadline, (
            f"upstream not aborted: {fleet.workers[0].finished_by_reason}"
        )
        time.sleep(0.02)
    time.sleep(0.2)
    recs = [r for _, r in gw.state.records.sink.read()]
    assert [r["status"] for r in recs] == ["client_disconnect"]
    metrics = httpx.get(gw.url + "/gateway/metrics").text
    assert f'kvroute_gateway_worker_inflight_requests{{worker="{worker}"}} 0.0' in metrics


def test_openai_sdk_against_the_gateway(fleet_factory: Any, gateway_factory: Any) -> None:
    fleet = fleet_factory(2)
    gw = gateway_factory(fleet.snapshot())
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    try:
        models = client.models.list()
        assert [m.id for m in models.data] == [MODEL]

        system = "You are a helpful assistant for the kvroute project. " * 20
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=5
        )
        completion = raw.parse()
        assert completion.choices[0].message.content
        assert completion.usage.completion_tokens == 5
        holder = raw.headers["x-kvroute-worker"]
        time.sleep(0.1)

        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage:
                usage = chunk.usage
        assert "".join(pieces)
        assert usage is not None and usage.prompt_tokens_details.cached_tokens > 0

        text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
        assert text.choices[0].text

        try:
            client.chat.completions.create(model="nope", messages=messages)
        except openai.NotFoundError as exc:
            assert exc.status_code == 404
        else:
            raise AssertionError("unknown model must raise NotFoundError")
        try:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=-1)
        except openai.BadRequestError as exc:
            assert exc.body["param"] == "max_tokens"
        else:
            raise AssertionError("bad max_tokens must raise BadRequestError")
        assert holder in ("sim-0", "sim-1")
    finally:
        client.close()
