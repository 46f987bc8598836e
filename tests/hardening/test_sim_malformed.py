"""The simulated engine (workers/sim) against malformed chat and completion bodies: deep
nesting, lone surrogates, wrong methods and malformed content parts get 4xx, never a 500."""

from __future__ import annotations

import httpx
import pytest

from tests.hardening.conftest import SIM_MODEL, openai_error

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DEEP_ARRAY = "[" * 100_000
DEEP_OBJECT = '{"a":' * 20_000 + "1" + "}" * 20_000  # 120 KB: under the body limit


def raw_post(url: str, path: str, body: str | bytes) -> httpx.Response:
    return httpx.post(
        url + path, content=body, headers={"content-type": "application/json"}, timeout=20
    )


def assert_400(resp: httpx.Response, *, param: str | None = None) -> None:
    assert resp.status_code == 400, f"{resp.status_code}: {resp.text[:300]}"
    err = openai_error(resp)
    assert err is not None, resp.text[:300]
    if param is not None:
        assert err["param"] == param, err


# -- simulated engine ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize"])
@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_sim_deeply_nested_json_is_400_not_500(sim_url: str, path: str, body: str) -> None:
    # Today: _read_json catches ValueError only; RecursionError -> 500.
    assert_400(raw_post(sim_url, path, body))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, '{"model":"sim-8b","prompt":"a\\ud800b","max_tokens":2}'),
        (
            CHAT,
            '{"model":"sim-8b","messages":[{"role":"user","content":"\\udfff"}],"max_tokens":2}',
        ),
        ("/tokenize", '{"prompt":"\\ud800"}'),
    ],
    ids=["completions", "chat", "tokenize"],
)
def test_sim_lone_surrogate_is_400_not_500(sim_url: str, path: str, body: str) -> None:
    # Today: builtin_encode raises UnicodeEncodeError -> 500.
    assert_400(raw_post(sim_url, path, body))


def test_sim_405_is_not_labelled_internal_server_error(sim_url: str) -> None:
    # Today: {"type": "InternalServerError", "code": 405} (the status -> type map lacks 405).
    resp = httpx.post(sim_url + "/v1/models", timeout=10)
    assert resp.status_code == 405
    err = openai_error(resp)
    assert err is not None and err["type"] != "InternalServerError", err


@pytest.mark.parametrize("parts", [["hi"], [1], [None], [{"text": "no type"}]])
def test_sim_chat_content_parts_must_be_typed_objects(sim_url: str, parts: list[object]) -> None:
    # Today accepted (200); vLLM answers 400 for content parts that are not typed objects.
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2}
    assert_400(httpx.post(sim_url + CHAT, json=body, timeout=20))
