"""SIGTERM to an agent running a real engine: the worker turns draining (the gateway
stops routing to it), the request in flight finishes, then the worker deregisters and
the engine stops. Runs last: it takes one engine of the session's fleet down."""

from __future__ import annotations

import random
import signal
import threading

import httpx
import pytest

from tests.vllm.conftest import MODEL, Engine, Stack
from tests.vllm.harness import wait_until
from tests.vllm.test_gateway import _text, chat
from workers.agent import parse_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_sigterm_drains_in_flight_work_then_deregisters(stack: Stack, fleet: list[Engine]) -> None:
    leaving, staying = fleet[1], fleet[0]
    wait_until(
        lambda: all(w["healthy"] for w in stack.workers().values()) and len(stack.workers()) == 2,
        timeout_s=300,
        what="both engines registered and healthy",
    )
    outcome: dict[str, object] = {}
    rng = random.Random(11)
    prompt = [rng.randrange(16, 2000) for _ in range(64)]
    max_tokens = 900  # long enough to watch the drain; 64 + 900 < max_model_len

    def long_request() -> None:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        outcome["response"] = httpx.post(f"{leaving.url}/v1/completions", json=body, timeout=120)

    client = threading.Thread(target=long_request)
    client.start()
    wait_until(
        lambda: parse_metrics(httpx.get(f"{leaving.url}/metrics", timeout=5).text).running >= 1,
        timeout_s=30,
        what="the long request to run",
        interval_s=0.05,
    )
    leaving.agent.signal(signal.SIGTERM)
    wait_until(
        lambda: stack.workers().get(leaving.name, {}).get("state") == "draining",
        timeout_s=15,
        what="the worker to turn draining",
        interval_s=0.1,
    )
    # New traffic goes elsewhere while the engine finishes its work.
    wait_until(
        lambda: (
            not httpx.get(f"{stack.url}/gateway/health", timeout=5)
            .json()["workers"]
            .get(leaving.name, {})
            .get("routable", False)
        ),
        timeout_s=15,
        what="the gateway to stop routing to the draining worker",
        interval_s=0.1,
    )
    routed = chat(stack, _text(20), "who serves me while the other drains?")
    assert routed.worker == staying.name
    client.join(120)
    response = outcome.get("response")
    assert isinstance(response, httpx.Response) and response.status_code == 200, response
    assert response.json()["usage"]["completion_tokens"] == max_tokens
    assert leaving.agent.wait(60) == 0, leaving.agent.tail()
    assert leaving.name not in stack.workers()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{leaving.url}/health", timeout=2)
