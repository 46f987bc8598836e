"""The gateway's OpenAI surface (/v1/completions, /v1/chat/completions, /v1/models)
against a hostile caller, over real sockets, in front of a real simulated worker.

Every refused request gets an OpenAI-shaped error body (`{"error": {message, type, param,
code}}`) with the right status (400 naming the field, 404, 405, 413), and the gateway stays
healthy: normal requests still succeed and no in-flight accounting leaks (client
disconnects included).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.hardening.conftest import (
    GATEWAY_MAX_BODY_BYTES,
    GATEWAY_MAX_TOKENS,
    SIM_MODEL,
    gateway_snapshot,
    openai_error,
    serve_gateway,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**overrides: Any) -> dict[str, Any]:
    return {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **overrides,
    }


def completion(**overrides: Any) -> dict[str, Any]:
    return {"model": SIM_MODEL, "prompt": "hello", "max_tokens": 4, **overrides}


def post(url: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    """bytes/str go on the wire as they are; anything else as JSON (ASCII-escaped, so lone
    surrogates travel as `\\ud800` escapes the way a hostile client would send them)."""
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return httpx.post(url + path, content=body, headers=headers, timeout=20, **kw)


Case = tuple[str, Any, int, str | None]


def run_cases(url: str, cases: list[Case]) -> None:
    failures = []
    for path, body, status, param in cases:
        resp = post(url, path, body)
        err = openai_error(resp)
        if resp.status_code != status:
            failures.append(
                f"{path} {str(body)[:100]!r}: {resp.status_code} (want {status}) {resp.text[:160]}"
            )
        elif err is None:
            failures.append(
                f"{path} {str(body)[:100]!r}: not an OpenAI error body: {resp.text[:160]}"
            )
        elif param is not None and err["param"] != param:
            failures.append(f"{path} {str(body)[:100]!r}: param {err['param']!r} (want {param!r})")
    assert_healthy(url)
    assert not failures, "\n".join(failures)


def assert_healthy(url: str) -> None:
    resp = post(url, CHAT, chat())
    assert resp.status_code == 200, f"the gateway no longer serves: {resp.text[:300]}"
    assert resp.json()["choices"][0]["message"]["content"]


def test_malformed_json_and_shapes(gateway_url: str) -> None:
    cases: list[Case] = []
    for path in (CHAT, COMPLETIONS):
        cases += [
            (path, "{not json", 400, None),
            (path, "", 400, None),
            (path, b"\xff\xfe\x00\x00", 400, None),
            (path, json.dumps(chat()) + " trailing", 400, None),
            (path, "[1, 2]", 400, None),
            (path, '"a string"', 400, None),
            (path, "null", 400, None),
            (path, "1e999", 400, None),
            (path, "[" * 100_000, 400, None),  # nesting beyond Python's recursion limit
            (path, '{"a":' * 20_000 + "1" + "}" * 20_000, 400, None),
        ]
    for literal in ("NaN", "Infinity", "-Infinity"):  # not JSON; strict upstreams choke
        body = json.dumps(completion(temperature=0.5)).replace("0.5", literal)
        cases.append((COMPLETIONS, body, 400, None))
    run_cases(gateway_url, cases)


def test_model_field(gateway_url: str) -> None:
    no_model = {k: v for k, v in chat().items() if k != "model"}
    # fmt: off
    cases: list[Case] = [
        (CHAT, no_model, 400, "model"),
        (CHAT, chat(model=None), 400, "model"),
        (CHAT, chat(model=""), 400, "model"),
        (CHAT, chat(model=["sim-8b"]), 400, "model"),
        (CHAT, chat(model={"id": "sim-8b"}), 400, "model"),
        (CHAT, chat(model=8), 400, "model"),
        (CHAT, chat(model="no-such-model"), 404, "model"),
        (CHAT, chat(model="SIM-8B"), 404, "model"),
        (CHAT, chat(model="sim-8b\u0000"), 404, "model"),
        (CHAT, chat(model="m" * 200_000), 404, "model"),
        (COMPLETIONS, completion(model="no-such-model"), 404, "model"),
    ]
    # fmt: on
    run_cases(gateway_url, cases)


def test_chat_messages(gateway_url: str) -> None:
    def msgs(*messages: Any) -> dict[str, Any]:
        return chat(messages=list(messages))

    # fmt: off
    cases: list[Case] = [
        (CHAT, chat(messages=None), 400, "messages"),
        (CHAT, chat(messages=[]), 400, "messages"),
        (CHAT, chat(messages={"role": "user", "content": "hi"}), 400, "messages"),
        (CHAT, chat(messages="hi"), 400, "messages"),
        (CHAT, msgs("hi"), 400, "messages[0]"),
        (CHAT, msgs({"role": "user", "content": "hi"}, 5), 400, "messages[1]"),
        (CHAT, msgs({"content": "hi"}), 400, "messages[0].role"),
        (CHAT, msgs({"role": "wizard", "content": "hi"}), 400, "messages[0].role"),
        (CHAT, msgs({"role": 7, "content": "hi"}), 400, "messages[0].role"),
        (CHAT, msgs({"role": ["user"], "content": "hi"}), 400, "messages[0].role"),
        (CHAT, msgs({"role": {"r": 1}, "content": "hi"}), 400, "messages[0].role"),
        (CHAT, msgs({"role": "user", "content": "a\ud800b"}), 400, "messages[0].content"),
        (CHAT, msgs({"role": "user", "content": [{"type": "text", "text": "\udfff"}]}), 400, "messages[0].content[0].text"),
        (CHAT, msgs({"role": "user"}), 400, "messages[0].content"),
        (CHAT, msgs({"role": "user", "content": 5}), 400, "messages[0].content"),
        (CHAT, msgs({"role": "user", "content": {"text": "hi"}}), 400, "messages[0].content"),
        (CHAT, msgs({"role": "user", "content": ["hi"]}), 400, "messages[0].content[0]"),
        (CHAT, msgs({"role": "user", "content": [{"text": "hi"}]}), 400, "messages[0].content[0]"),
        (CHAT, msgs({"role": "user", "content": [{"type": 5}]}), 400, "messages[0].content[0]"),
        (CHAT, msgs({"role": "user", "content": [{"type": "text"}]}), 400, "messages[0].content[0].text"),
        (CHAT, msgs({"role": "user", "content": [{"type": "text", "text": 1}]}), 400, "messages[0].content[0].text"),
    ]
    # fmt: on
    run_cases(gateway_url, cases)
    # Content as a list of text parts is the OpenAI multi-part form: served.
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]
    resp = post(gateway_url, CHAT, chat(messages=[{"role": "user", "content": parts}]))
    assert resp.status_code == 200, resp.text


def test_completion_prompts(gateway_url: str) -> None:
    # fmt: off
    cases: list[Case] = [
        (COMPLETIONS, completion(prompt=None), 400, "prompt"),
        (COMPLETIONS, {k: v for k, v in completion().items() if k != "prompt"}, 400, "prompt"),
        (COMPLETIONS, completion(prompt=[]), 400, "prompt"),
        (COMPLETIONS, completion(prompt={"text": "x"}), 400, "prompt"),
        (COMPLETIONS, completion(prompt=5), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[[]]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[[1, [2]]]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[1, [2]]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[[1, 2], "a"]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=["a", 1]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[1, "a"]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[-1, 2]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[2**64]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[2**200]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[1.5]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[True]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=[None]), 400, "prompt"),
        (COMPLETIONS, completion(prompt="a\ud800b"), 400, "prompt"),
        (COMPLETIONS, completion(prompt=["ok", "\ud800"]), 400, "prompt"),
        # Beyond the worker's vocabulary or context: the worker's own 400, passed through.
        (COMPLETIONS, completion(prompt=[200_000]), 400, "prompt"),
        (COMPLETIONS, completion(prompt=list(range(5000))), 400, "prompt"),
    ]
    # fmt: on
    run_cases(gateway_url, cases)
    for prompt in ("hello there", ["hello there"], [11, 12, 13], [[11, 12, 13]]):
        resp = post(gateway_url, COMPLETIONS, completion(prompt=prompt))
        assert resp.status_code == 200, (prompt, resp.text)


def test_generation_parameters(gateway_url: str) -> None:
    limit = GATEWAY_MAX_TOKENS
    # fmt: off
    cases: list[Case] = [
        (CHAT, chat(max_tokens=0), 400, "max_tokens"),
        (CHAT, chat(max_tokens=-1), 400, "max_tokens"),
        (CHAT, chat(max_tokens=limit + 1), 400, "max_tokens"),
        (CHAT, chat(max_tokens=2**70), 400, "max_tokens"),
        (CHAT, chat(max_tokens="4"), 400, "max_tokens"),
        (CHAT, chat(max_tokens=4.0), 400, "max_tokens"),
        (CHAT, chat(max_tokens=True), 400, "max_tokens"),
        (CHAT, chat(max_tokens=[4]), 400, "max_tokens"),
        (CHAT, chat(max_completion_tokens=-3), 400, "max_completion_tokens"),
        (COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
        (COMPLETIONS, completion(max_tokens="lots"), 400, "max_tokens"),
        (CHAT, chat(stream="true"), 400, "stream"),
        (CHAT, chat(stream=1), 400, "stream"),
        (CHAT, chat(stream={"on": True}), 400, "stream"),
        (CHAT, chat(stream=True, stream_options="usage"), 400, "stream_options"),
        (CHAT, chat(stream=True, stream_options={"include_usage": "yes"}), 400, "stream_options.include_usage"),
        # n > 1: the simulated worker serves n=1 only; its 400 comes back, still OpenAI-shaped.
        (CHAT, chat(n=2), 400, "n"),
        (CHAT, chat(n=2, stream=True), 400, "n"),
        (COMPLETIONS, completion(n=3), 400, "n"),
    ]
    # fmt: on
    run_cases(gateway_url, cases)


def test_oversized_bodies_are_413(gateway_url: str) -> None:
    big = chat(messages=[{"role": "user", "content": "word " * (GATEWAY_MAX_BODY_BYTES // 4)}])
    resp = post(gateway_url, CHAT, big)
    assert resp.status_code == 413, resp.text[:200]
    assert (openai_error(resp) or {}).get("code") == "request_too_large"

    def chunks() -> Any:  # no Content-Length: the gateway must count as it reads
        yield b'{"model": "sim-8b", "prompt": "'
        for _ in range(GATEWAY_MAX_BODY_BYTES // 8192 + 2):
            yield b"x" * 8192
        yield b'"}'

    resp = httpx.post(
        gateway_url + COMPLETIONS,
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=20,
    )
    assert resp.status_code == 413, resp.text[:200]
    assert openai_error(resp) is not None
    assert_healthy(gateway_url)


def test_routes_methods_and_models(gateway_url: str) -> None:
    resp = httpx.get(gateway_url + "/v1/models", timeout=10)
    assert resp.status_code == 200
    assert [m["id"] for m in resp.json()["data"]] == [SIM_MODEL]
    for method, path, status in [
        ("GET", CHAT, 405),
        ("PUT", COMPLETIONS, 405),
        ("POST", "/v1/models", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v1/models/sim-8b/../../etc/passwd", 404),
    ]:
        resp = httpx.request(method, gateway_url + path, timeout=10)
        assert resp.status_code == status, (method, path, resp.text[:200])
        assert openai_error(resp) is not None, (method, path, resp.text[:200])
    assert httpx.get(gateway_url + CHAT, timeout=10).headers["allow"] == "POST"


def test_hostile_headers(gateway_url: str) -> None:
    for headers in [
        {"x-session-id": "s" * 60_000},
        {"x-request-id": "r" * 60_000},
        {"x-session-id": b"caf\xe9 \xff"},
        {"x-session-id": ""},
        {"x-kvroute-explain": "\u00ff".encode("latin-1")},
        {"authorization": "Bearer " + "k" * 10_000},  # keys are off here: ignored
    ]:
        resp = httpx.post(gateway_url + CHAT, json=chat(), headers=headers, timeout=20)
        assert resp.status_code in (200, 431), (list(headers), resp.status_code, resp.text[:200])
    assert_healthy(gateway_url)


def inflight(gateway_url: str, sim_url: str) -> tuple[float, float]:
    """(requests the gateway counts in flight, requests the worker is running)."""
    gw = httpx.get(gateway_url + "/gateway/metrics", timeout=10).text
    sim = httpx.get(sim_url + "/metrics", timeout=10).text

    def total(text: str, prefix: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
        )

    return (
        total(gw, "kvroute_gateway_worker_inflight_requests"),
        total(sim, "vllm:num_requests_running") + total(sim, "vllm:num_requests_waiting"),
    )


def test_clients_that_hang_up_mid_stream_leak_nothing(gateway_url: str, sim_url: str) -> None:
    body = chat(stream=True, max_tokens=1000, ignore_eos=True)
    for _ in range(10):
        with httpx.stream("POST", gateway_url + CHAT, json=body, timeout=20) as resp:
            assert resp.status_code == 200
            for _chunk in resp.iter_bytes():
                break  # read the first bytes, then hang up
    deadline = time.monotonic() + 10
    while inflight(gateway_url, sim_url) != (0.0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inflight(gateway_url, sim_url) == (0.0, 0.0)
    assert_healthy(gateway_url)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_body_sent_partially_then_dropped(gateway_url: str, path: str) -> None:
    import socket

    host, port = gateway_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n".encode()
            + b'{"model": "sim-8b", "mess'
        )
    assert_healthy(gateway_url)


@pytest.fixture(scope="module")
def keyed_gateway_url(sim_fleet: Any) -> Iterator[str]:
    """The same gateway with API keys on (key-a -> tenant-a)."""
    snapshot = gateway_snapshot(sim_fleet, policy="least_load")
    with serve_gateway(snapshot, gateway_keys={"key-a": "tenant-a"}) as url:
        yield url


def test_gateway_api_key_header_variants(keyed_gateway_url: str) -> None:
    refused: list[dict[str, Any]] = [
        {},
        {"authorization": "Bearer"},
        {"authorization": "Bearer key-a key-a"},
        {"authorization": "Bearer key-a, Bearer key-a"},
        {"authorization": "Basic key-a"},
        {"authorization": "key-a"},
        {"authorization": "Bearer KEY-A"},
        {"authorization": "Bearer key-"},
        {"authorization": "Bearer " + "k" * 10_000},
        {"authorization": "Bearer key-\u00e9".encode()},
        {"x-api-key": "wrong"},
    ]
    accepted: list[dict[str, Any]] = [
        {"authorization": "Bearer key-a"},
        {"authorization": "bearer key-a"},
        {"x-api-key": "key-a"},
    ]
    failures = []
    for headers in refused:
        for method, path, body in [("POST", CHAT, chat()), ("GET", "/v1/models", None)]:
            resp = httpx.request(
                method, keyed_gateway_url + path, json=body, headers=headers, timeout=20
            )
            err = openai_error(resp)
            if resp.status_code != 401 or err is None or err["type"] != "authentication_error":
                failures.append(f"{headers!r:.60} {path}: {resp.status_code} {resp.text[:120]}")
    for headers in accepted:
        resp = httpx.post(keyed_gateway_url + CHAT, json=chat(), headers=headers, timeout=20)
        if resp.status_code != 200:
            failures.append(f"{headers!r:.60}: {resp.status_code} {resp.text[:120]}")
    assert not failures, "\n".join(failures)
