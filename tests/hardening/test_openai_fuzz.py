"""Property-based fuzzing of the OpenAI surfaces (the gateway, and the simulated engine it
fronts), over real sockets: whatever JSON a client sends, the answer is never a 5xx, an
error is always OpenAI-shaped, and the server keeps serving. Derandomized: the same
examples every run (raise KVROUTE_FUZZ_EXAMPLES for a deeper run)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hardening.conftest import SIM_MODEL, openai_error

EXAMPLES = int(os.environ.get("KVROUTE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def bodies(*, surrogates: bool) -> tuple[Any, Any, Any]:
    """(any JSON, chat-like bodies, completion-like bodies). With `surrogates`, text may
    hold lone UTF-16 surrogates (a JSON `\\ud800` escape), which no tokenizer accepts."""
    text = st.text(max_size=20)
    if surrogates:
        text = text | st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"])
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | text
    )
    any_json = st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=12,
    )
    roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | any_json
    parts = st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | any_json})
        | st.fixed_dictionaries({"type": st.just("text"), "text": text | any_json})
        | any_json,
        max_size=3,
    )
    message = st.fixed_dictionaries({"role": roles}, optional={"content": text | parts | any_json})
    common = {
        "max_tokens": st.none() | st.integers(min_value=-3, max_value=12) | any_json,
        "stream": st.booleans() | any_json,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | any_json})
        | any_json,
        "n": st.just(1) | any_json,
        "temperature": st.floats(min_value=0, max_value=2) | any_json,
        "x-extra": any_json,
    }
    chat = st.fixed_dictionaries(
        {"model": st.just(SIM_MODEL) | any_json},
        optional={"messages": st.lists(message, max_size=3) | any_json, **common},
    )
    token_ids = st.lists(st.integers(min_value=-2, max_value=130_000), max_size=8)
    prompts = (
        text | token_ids | st.lists(token_ids, max_size=2) | st.lists(text, max_size=2) | any_json
    )
    completion = st.fixed_dictionaries(
        {"model": st.just(SIM_MODEL) | any_json}, optional={"prompt": prompts, **common}
    )
    return any_json, chat, completion


ANY, CHAT_BODY, COMPLETION_BODY = bodies(surrogates=True)
# The simulated engine still answers 500 to lone surrogates (pending_test_sim.py).
SIM_ANY, SIM_CHAT_BODY, SIM_COMPLETION_BODY = bodies(surrogates=False)


def check(url: str, path: str, body: Any) -> None:
    raw = json.dumps(body)  # ASCII escapes: lone surrogates travel as \\ud800
    with httpx.stream(
        "POST",
        url + path,
        content=raw,
        headers={"content-type": "application/json"},
        timeout=20,
    ) as resp:
        resp.read()
    assert resp.status_code < 500, f"{path} {raw[:300]} -> {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        assert openai_error(resp) is not None, f"{path} {raw[:300]} -> {resp.text[:300]}"
    elif resp.headers["content-type"].startswith("text/event-stream"):
        assert resp.text.rstrip().endswith("data: [DONE]"), resp.text[-300:]
    else:
        assert resp.json()["choices"], resp.text[:300]


def still_serves(url: str) -> None:
    body = {"model": SIM_MODEL, "prompt": "still there?", "max_tokens": 2}
    assert httpx.post(url + "/v1/completions", json=body, timeout=20).status_code == 200


def test_gateway_chat_survives_any_json(gateway_url: str) -> None:
    @FUZZ
    @given(body=CHAT_BODY | ANY)
    def fuzz(body: Any) -> None:
        check(gateway_url, "/v1/chat/completions", body)

    fuzz()
    still_serves(gateway_url)


def test_gateway_completions_survive_any_json(gateway_url: str) -> None:
    @FUZZ
    @given(body=COMPLETION_BODY | ANY)
    def fuzz(body: Any) -> None:
        check(gateway_url, "/v1/completions", body)

    fuzz()
    still_serves(gateway_url)


def test_sim_survives_any_json(sim_url: str) -> None:
    @FUZZ
    @given(chat=SIM_CHAT_BODY | SIM_ANY, completion=SIM_COMPLETION_BODY | SIM_ANY)
    def fuzz(chat: Any, completion: Any) -> None:
        check(sim_url, "/v1/chat/completions", chat)
        check(sim_url, "/v1/completions", completion)

    fuzz()
    still_serves(sim_url)
