"""Conformance with a real vLLM engine: the golden trace in tests/fixtures/golden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from routing.core.events import BlockRemoved, BlockStored
from workers.sim.engine import Engine
from workers.sim.profiles import GOLDEN_CPU

GOLDEN = Path(__file__).parents[2] / "fixtures" / "golden" / "vllm_cpu_block32_64blocks.json"


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def _replay(golden: dict[str, Any]) -> tuple[list[int], list[int], list[list[Any]]]:
    """Send the golden requests one at a time (max_tokens 1), like the recording script."""
    engine = Engine(
        profile=GOLDEN_CPU,
        block_size=golden["block_size"],
        num_blocks=golden["num_gpu_blocks_override"],
    )
    cached: list[int] = []
    events_after: list[int] = []
    batches: list[list[Any]] = []
    now_s = 0.0
    for i, req in enumerate(golden["requests"]):
        engine.add_request(
            request_id=f"r{i}",
            prompt_token_ids=req["prompt"],
            max_tokens=golden["max_tokens"],
            arrival_s=now_s,
        )
        while engine.has_work():
            result = engine.step(now_s=now_s)
            now_s = result.end_s
            if result.events:
                batches.append(list(result.events))
            for done in result.finished:
                cached.append(done.cached_tokens)
                events_after.append(len(batches))
    return cached, events_after, batches


def test_every_cached_tokens_value_matches_vllm(golden: dict[str, Any]) -> None:
    cached, events_after, _ = _replay(golden)
    assert cached == [r["cached_tokens"] for r in golden["requests"]]
    assert events_after == [r["events_after"] for r in golden["requests"]]


def test_event_batches_match_vllm_batch_by_batch(golden: dict[str, Any]) -> None:
    _, _, batches = _replay(golden)
    assert len(batches) == len(golden["event_batches"])
    # Hash values differ between engines, but the mapping must be one-to-one and consistent:
    # a removed or parent hash always names the block vLLM named at that point.
    ours_of: dict[int, int] = {}
    theirs_of: dict[int, int] = {}

    def same_block(theirs: int, ours: int) -> None:
        assert ours_of.setdefault(theirs, ours) == ours
        assert theirs_of.setdefault(ours, theirs) == theirs

    for j, (mine, recorded) in enumerate(zip(batches, golden["event_batches"], strict=True)):
        assert [type(op).__name__ for op in mine] == [e["type"] for e in recorded["events"]], j
        for op, ev in zip(mine, recorded["events"], strict=True):
            assert len(op.engine_hashes) == len(ev["block_hashes"]), j
            for ours, theirs in zip(op.engine_hashes, ev["block_hashes"], strict=True):
                same_block(theirs, ours)
            if isinstance(op, BlockStored):
                assert list(op.token_ids) == ev["token_ids"], j
                assert op.block_size == ev["block_size"]
                assert (op.parent_engine_hash is None) == (ev["parent_block_hash"] is None), j
                if op.parent_engine_hash is not None:
                    same_block(ev["parent_block_hash"], op.parent_engine_hash)
            else:
                assert isinstance(op, BlockRemoved)


def test_a_live_worker_reproduces_the_trace_over_http_and_zmq(golden: dict[str, Any]) -> None:
    """The same check end to end: uvicorn + SSE-free completions + the ZMQ wire format."""
    import time

    import httpx
    import zmq

    from routing.core.events import decode_message
    from workers.sim.fleet import start_fleet

    with (
        start_fleet(
            1,
            profile="golden-cpu",
            time_scale=0.01,
            block_size=golden["block_size"],
            num_blocks=golden["num_gpu_blocks_override"],
        ) as fleet,
        httpx.Client(timeout=10) as client,
    ):
        w = fleet.workers[0]
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(w.events_endpoint or "")
        time.sleep(0.3)  # ZMQ slow joiner
        raw: list[list[bytes]] = []
        for req in golden["requests"]:
            resp = client.post(
                f"{w.url}/v1/completions",
                json={
                    "model": "sim-8b",
                    "prompt": req["prompt"],
                    "max_tokens": 1,
                    "temperature": 0,
                },
            )
            assert (
                resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                == req["cached_tokens"]
            )
            # Published before the response was sent; only the ZMQ I/O thread can lag.
            deadline = time.monotonic() + 5
            while len(raw) < req["events_after"] and time.monotonic() < deadline:
                if sub.poll(100):
                    raw.append(sub.recv_multipart())
            assert len(raw) == req["events_after"], req["label"]
        while sub.poll(300):  # nothing extra after the last request either
            raw.append(sub.recv_multipart())
        sub.close()
    assert [int.from_bytes(f[1], "big") for f in raw] == [b["seq"] for b in golden["event_batches"]]
    for frames, recorded in zip(raw, golden["event_batches"], strict=True):
        ops = decode_message(frames).ops
        assert [type(op).__name__ for op in ops] == [e["type"] for e in recorded["events"]]
        for op, ev in zip(ops, recorded["events"], strict=True):
            if isinstance(op, BlockStored):
                assert list(op.token_ids) == ev["token_ids"]
