"""Killing a real engine mid-run: the gateway routes around it, no client request fails
unless it had already started streaming, the agent's supervisor restarts the engine, it
re-registers, and the gateway routes to it again (its cache state rebuilt from the new
engine's KV events)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.vllm.conftest import ENGINE_START_TIMEOUT_S, MODEL, Engine, Stack, wait_registered
from tests.vllm.harness import wait_until
from tests.vllm.test_gateway import _text, chat

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@dataclass
class Outcome:
    prefix: str
    sent_s: float
    status: int = 0
    worker: str = ""
    started: bool = False
    completed: bool = False
    error: str = ""


def stream_once(stack: Stack, system: str, prefix: str, question: str) -> Outcome:
    outcome = Outcome(prefix=prefix, sent_s=time.monotonic())
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream(
            "POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60
        ) as response:
            outcome.status = response.status_code
            outcome.worker = response.headers.get("x-kvroute-worker", "")
            if response.status_code != 200:
                outcome.error = response.read().decode(errors="replace")[:300]
                return outcome
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                outcome.started = True
                if line == "data: [DONE]":
                    outcome.completed = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    outcome.error = json.dumps(chunk["error"])[:300]
                    break
    except httpx.HTTPError as exc:
        outcome.error = repr(exc)
    return outcome


def seed_prefix(engine: Engine, system: str) -> None:
    """Put a prefix in one engine's cache directly (not through the gateway)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "seed"}],
        "max_tokens": 1,
    }
    assert httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_killed_engine_is_routed_around_restarted_and_re_registered(
    stack: Stack, fleet: list[Engine]
) -> None:
    victim, survivor = fleet
    prefixes = {victim.name: _text(7), survivor.name: _text(8)}
    for engine in fleet:
        seed_prefix(engine, prefixes[engine.name])
    time.sleep(1.0)
    # Affinity first: each prefix goes to the engine that holds it.
    for engine in fleet:
        assert chat(stack, prefixes[engine.name], "which engine?").worker == engine.name

    engine_pid = victim.engine_pid()
    assert engine_pid is not None, "the agent runs the engine as its child"
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            owner = fleet[(i + n) % 2].name
            result = stream_once(stack, prefixes[owner], owner, f"client {i} request {n}")
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(4.0)
    kill_s = time.monotonic()
    # The whole engine (API server and engine core) dies at once, as in an OOM kill.
    os.killpg(engine_pid, signal.SIGKILL)
    time.sleep(8.0)
    stop.set()
    for thread in threads:
        thread.join(90)

    before = [o for o in outcomes if o.sent_s < kill_s]
    after = [o for o in outcomes if o.sent_s >= kill_s]
    assert any(o.worker == victim.name for o in before), "the victim served traffic before the kill"
    failed_unstarted = [o for o in outcomes if not o.completed and not o.started]
    assert not failed_unstarted, failed_unstarted
    assert after and all(o.completed for o in after if o.sent_s > kill_s + 3.0), after
    assert any(
        o.completed and o.worker == survivor.name and o.prefix == victim.name for o in after
    ), "requests for the dead engine's prefix must be served by the survivor"

    # The supervisor restarts the engine and the agent re-registers it.
    wait_until(
        lambda: (pid := victim.engine_pid()) is not None and pid != engine_pid,
        timeout_s=30,
        what="the supervisor to relaunch the engine",
    )
    wait_registered(stack, victim, timeout_s=ENGINE_START_TIMEOUT_S)
    wait_until(
        lambda: "re-registering" in victim.agent.log_path.read_text(),
        timeout_s=ENGINE_START_TIMEOUT_S,
        what="the agent to re-register the restarted engine",
        proc=victim.agent,
    )

    # Back in rotation: once the gateway sees the engine routable again, a prefix only the
    # restarted engine holds is routed to it, predicted from the new engine's KV events.
    def gateway_routable() -> bool:
        health = httpx.get(f"{stack.url}/gateway/health", timeout=5).json()
        view = health["workers"].get(victim.name) or {}
        return bool(view.get("routable")) and view.get("breaker") != "open"

    wait_until(gateway_routable, timeout_s=60, what="the gateway to see the engine routable")
    attempts = []
    for attempt in range(5):
        fresh = _text(9 + attempt)
        seed_prefix(victim, fresh)
        time.sleep(1.0)
        routed = chat(stack, fresh, "are you back?")
        attempts.append((routed.worker, routed.predicted, routed.actual))
        if routed.worker == victim.name:
            break
    assert routed.worker == victim.name, attempts
    assert routed.predicted == routed.actual > 0, attempts
