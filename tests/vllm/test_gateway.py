"""Traffic through the gateway to two real vLLM CPU engines: requests sharing a prefix go
to the engine holding it, and the gateway's predicted cached tokens (its precise index,
fed by the engines' real KV events, with prompts tokenized by the `hf` adapter from the
tiny model's directory) equal what the engine reports, also after BlockRemoved."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.vllm.conftest import MODEL, Engine, Stack, completion, reset_prefix_cache
from tests.vllm.harness import wait_until
from workers.tiny_model import corpus_lines

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Routed:
    worker: str
    predicted: int
    actual: int
    prompt_tokens: int
    decision: dict[str, object] | None


_CORPUS = corpus_lines()


def _text(part: int) -> str:
    """About 500 tokens of the text the tiny tokenizer was trained on (so it tokenizes
    like natural text), different for each `part`."""
    return " ".join(_CORPUS[part * 200 : part * 200 + 28])


def chat(stack: Stack, system: str, user: str, *, stream: bool = False) -> Routed:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 2,
        "temperature": 0,
        "stream": stream,
    }
    headers = {"x-kvroute-explain": "1"}
    if not stream:
        response = httpx.post(
            f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        resp_headers = response.headers
    else:
        body["stream_options"] = {"include_usage": True}
        usage = None
        with httpx.stream(
            "POST", f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=120
        ) as response:
            assert response.status_code == 200, response.read()
            resp_headers = response.headers
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
        assert usage is not None, "the client asked for include_usage"
    details = usage.get("prompt_tokens_details") or {}
    decision = resp_headers.get("x-kvroute-decision")
    return Routed(
        worker=resp_headers["x-kvroute-worker"],
        predicted=int(resp_headers["x-kvroute-predicted-cached-tokens"]),
        actual=int(details.get("cached_tokens") or 0),
        prompt_tokens=int(usage["prompt_tokens"]),
        decision=json.loads(decision) if decision else None,
    )


def candidate_blocks(routed: Routed, worker: str) -> int:
    assert routed.decision is not None, "x-kvroute-explain: 1 returns the decision"
    for candidate in routed.decision["candidates"]:  # type: ignore[union-attr]
        if candidate["worker"] == worker:
            return int(candidate["cached_blocks"])
    return 0


@pytest.fixture
def quiet_fleet(stack: Stack, fleet: list[Engine]) -> Iterator[list[Engine]]:
    """Both engines with empty prefix caches, and the gateway routing to both."""
    for engine in fleet:
        reset_prefix_cache(engine.url)
        completion(engine.url, [7] * 8)  # the reset is published with the next step
    wait_until(
        lambda: all(w["healthy"] for w in stack.workers().values()) and len(stack.workers()) == 2,
        timeout_s=60,
        what="both engines healthy in the control plane",
    )
    time.sleep(1.0)  # let the gateway apply AllBlocksCleared
    yield fleet


def settle() -> None:
    # KV events reach the gateway within milliseconds of the engine's step; leave margin.
    time.sleep(0.8)


def test_shared_prefix_goes_to_the_engine_holding_it_and_predictions_are_exact(
    stack: Stack, quiet_fleet: list[Engine]
) -> None:
    system_a = _text(1)
    system_b = _text(2)
    first = chat(stack, system_a, "first question about alpha")
    assert first.prompt_tokens > 300, "the shared prefix must span many blocks"
    assert (first.predicted, first.actual) == (0, 0)
    settle()
    rows = [first]
    for i, question in enumerate(["second question", "a third one, longer than that", "fourth"]):
        routed = chat(stack, system_a, question, stream=bool(i % 2))
        rows.append(routed)
        settle()
    table = [(r.worker, r.predicted, r.actual) for r in rows]
    assert {r.worker for r in rows} == {first.worker}, table
    for routed in rows[1:]:
        assert routed.actual > 0, table
        assert routed.predicted == routed.actual, table
    other = chat(stack, system_b, "first question about beta")
    settle()
    again = chat(stack, system_b, "second question about beta", stream=True)
    assert again.worker == other.worker
    assert again.predicted == again.actual > 0, (other, again)


def test_predictions_stay_exact_after_real_evictions(
    stack: Stack, quiet_fleet: list[Engine]
) -> None:
    system = _text(3)
    first = chat(stack, system, "warm the prefix")
    settle()
    warm = chat(stack, system, "check it is warm")
    assert warm.worker == first.worker and warm.predicted == warm.actual > 0
    holder = next(e for e in quiet_fleet if e.name == first.worker)
    before = candidate_blocks(warm, holder.name)
    # Unrelated prompts sent straight to the holder (not through the gateway) evict the
    # prefix's blocks, tail first; the gateway only learns it from BlockRemoved events.
    rng = random.Random(5)
    rows = []
    # The holder has 63 usable blocks and the prefix ~17: each round refreshes the prefix,
    # so a round evicts part of it only when its fillers (9 blocks each) outgrow the rest.
    for round_ in range(4):
        for _ in range(4 + round_):
            completion(holder.url, [rng.randrange(16, 2000) for _ in range(296)])
        settle()
        routed = chat(stack, system, f"after eviction round {round_}")
        rows.append(
            (routed.worker, candidate_blocks(routed, holder.name), routed.predicted, routed.actual)
        )
        assert routed.predicted == routed.actual, rows
        settle()
    assert any(blocks < before for _, blocks, _, _ in rows), (before, rows)
