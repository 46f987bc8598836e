"""Bad input gets the right 4xx with an OpenAI-shaped body naming the field, over a real
socket, before any worker sees it; a model without a routable worker gets 503 + Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from routing.gateway.config import GatewayConfig
from routing.gateway.consumers import GatewayHandle
from routing.gateway.routing import gateway_app
from routing.gateway.serve import ServerThread
from routing.gateway.state import build_gateway_state
from tests.gateway.conftest import MODEL, SimFleet, chat_body, post

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[str, str, SimFleet]]:
    fleet = SimFleet(1, kv_events=False).start()
    doc = fleet.snapshot()
    # A second model that is registered (has a policy) but has no worker at all.
    doc["models"]["orphan-model"] = {"active": doc["models"][MODEL]["active"], "experiment": None}
    servers = []
    try:
        open_cfg = GatewayConfig(
            metrics_interval_s=0, max_body_bytes=64 * 1024, max_tokens_limit=1000
        )
        keyed_cfg = GatewayConfig(metrics_interval_s=0, gateway_keys=KEYS)
        for cfg in (open_cfg, keyed_cfg):
            handle = GatewayHandle(
                lambda cfg=cfg: build_gateway_state(cfg, snapshot=doc), config=cfg
            )
            servers.append(ServerThread(gateway_app(handle)).start())
        yield servers[0].url, servers[1].url, fleet
    finally:
        for s in servers:
            s.stop()
        fleet.stop()


def error_of(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "", "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": ["hi"]}, "messages[0]"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            },
            "messages[0].content[0].text",
        ),
        ({**chat_body("hi"), "max_tokens": 0}, "max_tokens"),
        ({**chat_body("hi"), "max_tokens": 1001}, "max_tokens"),
        ({**chat_body("hi"), "max_tokens": "ten"}, "max_tokens"),
        ({**chat_body("hi"), "max_tokens": True}, "max_tokens"),
        ({**chat_body("hi"), "stream": "yes"}, "stream"),
        (
            {**chat_body("hi"), "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
        ),
    ],
)
def test_malformed_chat_bodies_get_400_naming_the_field(
    setup: Any, body: Any, param: str | None
) -> None:
    url, _, _ = setup
    resp = post(url, "/v1/chat/completions", body)
    assert resp.status_code == 400, resp.text
    err = error_of(resp)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["message"]


@pytest.mark.parametrize(
    ("prompt", "ok"),
    [
        ("hello there", True),
        (["hello there"], True),
        ([1, 2, 3, 4], True),
        ([[1, 2, 3]], True),
        ([], False),
        ([1, "a"], False),
        ([-1, 2], False),
        ([2**40], False),
        (None, False),
        ({"text": "x"}, False),
    ],
)
def test_completions_prompt_shapes(setup: Any, prompt: Any, ok: bool) -> None:
    url, _, _ = setup
    resp = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    if ok:
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"]
    else:
        assert resp.status_code == 400, resp.text
        assert error_of(resp)["param"] == "prompt"


def test_unknown_model_is_404_model_not_found(setup: Any) -> None:
    url, _, _ = setup
    resp = post(url, "/v1/chat/completions", {**chat_body("hi"), "model": "no-such-model"})
    assert resp.status_code == 404
    err = error_of(resp)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "no-such-model" in err["message"]


def test_model_without_workers_is_503_with_retry_after(setup: Any) -> None:
    url, _, _ = setup
    resp = post(url, "/v1/chat/completions", {**chat_body("hi"), "model": "orphan-model"})
    assert resp.status_code == 503
    assert int(resp.headers["retry-after"]) >= 1
    assert error_of(resp)["code"] == "no_routable_worker"


def test_oversized_body_is_413(setup: Any) -> None:
    url, _, _ = setup
    resp = post(url, "/v1/chat/completions", chat_body("word " * 20_000))
    assert resp.status_code == 413
    assert error_of(resp)["code"] == "request_too_large"
    # Just under the limit is served.
    assert post(url, "/v1/chat/completions", chat_body("word " * 1000)).status_code == 200


def test_wrong_method_is_405_and_unknown_path_404(setup: Any) -> None:
    url, _, _ = setup
    resp = httpx.get(url + "/v1/chat/completions")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    assert httpx.get(url + "/v1/nothing-here").status_code == 404


def test_gateway_keys_are_checked_before_any_work(setup: Any) -> None:
    _, keyed, _ = setup
    # Even a malformed body is refused for lack of a key, not parsed.
    resp = post(keyed, "/v1/chat/completions", b"{not json")
    assert resp.status_code == 401
    assert error_of(resp)["type"] == "authentication_error"
    resp = post(
        keyed, "/v1/chat/completions", chat_body("hi"), headers={"authorization": "Bearer wrong"}
    )
    assert resp.status_code == 401
    assert httpx.get(keyed + "/v1/models").status_code == 401
    resp = post(
        keyed, "/v1/chat/completions", chat_body("hi"), headers={"authorization": "Bearer key-b"}
    )
    assert resp.status_code == 200, resp.text
    models = httpx.get(keyed + "/v1/models", headers={"authorization": "Bearer key-a"}).json()
    assert {m["id"]: m["workers"] for m in models["data"]} == {MODEL: 1, "orphan-model": 0}


def test_worker_side_4xx_is_passed_through_not_retried(setup: Any) -> None:
    url, _, _ = setup
    # The dev profile's max_model_len is 2048 tokens: the worker rejects this prompt itself.
    resp = post(
        url, "/v1/completions", {"model": MODEL, "prompt": list(range(3000)), "max_tokens": 2}
    )
    assert resp.status_code == 400
    assert resp.headers["x-kvroute-worker"] == "sim-0"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", "[" * 30_000, None),
        ("/v1/completions", '{"a":' * 10_000 + "1" + "}" * 10_000, None),
        (
            "/v1/chat/completions",
            '{"model":"sim-8b","messages":[{"role":["user"],"content":"hi"}]}',
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            '{"model":"sim-8b","messages":[{"role":{"r":1},"content":"hi"}]}',
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            '{"model":"sim-8b","messages":[{"role":"user","content":"a\\ud800b"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            '{"model":"sim-8b","messages":[{"role":"user","content":[{"type":"text","text":"\\udfff"}]}]}',
            "messages[0].content[0].text",
        ),
        ("/v1/completions", '{"model":"sim-8b","prompt":"a\\ud800b","max_tokens":2}', "prompt"),
        (
            "/v1/completions",
            '{"model":"sim-8b","prompt":"hi","max_tokens":2,"temperature":NaN}',
            None,
        ),
        (
            "/v1/completions",
            '{"model":"sim-8b","prompt":"hi","max_tokens":2,"temperature":-Infinity}',
            None,
        ),
    ],
    ids=[
        "deep-array",
        "deep-object",
        "role-list",
        "role-object",
        "lone-surrogate",
        "surrogate-part",
        "surrogate-prompt",
        "nan",
        "neg-infinity",
    ],
)
def test_hostile_bodies_get_400_not_500(
    setup: Any, path: str, body: str, param: str | None
) -> None:
    url, _, _ = setup
    resp = post(url, path, body.encode())
    assert resp.status_code == 400, resp.text[:300]
    assert error_of(resp)["param"] == param
