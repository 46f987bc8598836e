"""The KV-event subscriber over real ZMQ sockets: live events fill the precise index, a
sequence gap is replayed from the worker's replay socket, an unrecoverable gap or a silent
stream falls back to the approximate index and says so in the decision and in /metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import zmq
import zmq.asyncio

from routing.core.blocks import token_block_keys
from routing.core.events import AllBlocksCleared, BlockStored, KVOp, encode_batch
from routing.gateway.config import GatewayConfig
from routing.gateway.state import GatewayState, build_gateway_state
from routing.gateway.tokenization import Encoded

BS = 4
TOKENS = list(range(1, 4 * BS + 1))  # four full blocks
KEYS = token_block_keys(TOKENS, BS)


class VllmStylePublisher:
    """vLLM's publisher protocol on real sockets, with a switch to lose messages in transit
    (kept in the replay buffer) or for good (dropped from the buffer too)."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: dict[int, list[bytes]] = {}
        self.seq = 0
        self.task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(
        self, ops: list[KVOp], *, lost: bool = False, forgotten: bool = False
    ) -> None:
        frames = encode_batch(self.seq, time.time(), ops)
        if not forgotten:
            self.buffer[self.seq] = frames
        self.seq += 1
        if not lost:
            await self.pub.send_multipart(frames)

    async def _serve_replay(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big", signed=True)
            for seq in sorted(s for s in self.buffer if s >= first):
                _, seq_frame, payload = self.buffer[seq]
                await self.router.send_multipart([ident, b"", seq_frame, payload])
            await self.router.send_multipart(
                [ident, b"", (-1).to_bytes(8, "big", signed=True), b""]
            )

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(0)
        self.router.close(0)


def stored(block: int, *, parent: int | None) -> BlockStored:
    return BlockStored(
        engine_hashes=(1000 + block,),
        parent_engine_hash=parent,
        token_ids=tuple(TOKENS[block * BS : (block + 1) * BS]),
        block_size=BS,
    )


def doc(pub: VllmStylePublisher) -> dict[str, Any]:
    worker = {
        "id": "w0",
        "url": "http://127.0.0.1:9",
        "model": "m",
        "state": "active",
        "healthy": True,
        "block_size": BS,
        "capacity_blocks": 0,
        "network_ms": 0.0,
        "kv_events_endpoint": pub.endpoint,
        "replay_endpoint": pub.replay_endpoint,
        "labels": {},
    }
    other = {**worker, "id": "w1", "kv_events_endpoint": None, "replay_endpoint": None}
    return {
        "revision": "r",
        "workers": [worker, other],
        "models": {
            "m": {
                "active": {
                    "policy": "p",
                    "version": 1,
                    "version_id": 1,
                    "type": "kv_score",
                    "params": {},
                },
                "experiment": None,
            }
        },
    }


async def until(predicate: Any, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture
async def rig() -> Any:
    ctx = zmq.asyncio.Context()
    pub = VllmStylePublisher(ctx)
    config = GatewayConfig(metrics_interval_s=0, snapshot_poll_s=60, events_silence_s=0.3)
    state = build_gateway_state(config, snapshot=doc(pub))
    await state.start()
    yield pub, state
    await state.aclose()
    pub.close()
    ctx.term()


def cached(state: GatewayState) -> int:
    return state.index.match(KEYS, now_s=state.clock()).get("w0", 0)


def plan(state: GatewayState) -> Any:
    workers = state.model_workers("m")
    return state.plan(
        model="m",
        workers=workers,
        encoded=Encoded(TOKENS + [99], None, len(TOKENS) + 1),
        session_key=None,
        tenant=None,
        request_id="r",
        now_s=state.clock(),
    )


async def test_events_fill_the_index_and_a_missed_start_is_replayed(rig: Any) -> None:
    pub, state = rig
    sub = state.subscribers["w0"]
    # Published before the subscriber is surely connected: recovered by replay from seq 0.
    await pub.publish([stored(0, parent=None)])
    await asyncio.sleep(0.3)
    await pub.publish([stored(1, parent=1000)])
    await until(lambda: cached(state) == 2)
    assert sub.current_state(now_s=state.clock()) == "live"
    p = plan(state)
    assert p.decision.worker_id == "w0"
    assert p.decision.predicted_cached_tokens == 2 * BS
    assert "kv events" not in p.decision.reason


async def test_a_gap_is_closed_by_replay(rig: Any) -> None:
    pub, state = rig
    sub = state.subscribers["w0"]
    await asyncio.sleep(0.3)
    await pub.publish([stored(0, parent=None)])
    await until(lambda: cached(state) == 1)
    await pub.publish([stored(1, parent=1000)], lost=True)
    await pub.publish([stored(2, parent=1001)])
    await until(lambda: cached(state) == 3)
    assert sub.status.gaps == 1 and sub.status.replayed >= 1
    assert sub.current_state(now_s=state.clock()) == "live"


async def test_an_unrecoverable_gap_falls_back_visibly(rig: Any) -> None:
    pub, state = rig
    sub = state.subscribers["w0"]
    await asyncio.sleep(0.3)
    await pub.publish([stored(0, parent=None), stored(1, parent=1000)])
    await until(lambda: cached(state) == 2)
    await pub.publish([stored(2, parent=1001)], lost=True, forgotten=True)
    await pub.publish([stored(3, parent=1002)])
    await until(lambda: sub.status.gaps == 1 and sub.status.last_seq == 2)
    # Precise state of w0 can no longer be trusted: dropped, and the decision says why.
    assert cached(state) == 0
    assert sub.current_state(now_s=state.clock()) == "stale"
    assert "w0 stale" in plan(state).decision.reason
    from prometheus_client import generate_latest

    text = generate_latest(state.metrics.registry).decode()
    assert 'kvroute_gateway_worker_events_state{state="stale",worker="w0"} 1.0' in text
    assert 'kvroute_gateway_worker_events_state{state="none",worker="w1"} 1.0' in text
    # The approximate layer still works for it: what the gateway routes there is remembered.
    state.index.record_routed("w0", KEYS, now_s=state.clock())
    assert cached(state) == 4


async def test_a_silent_stream_falls_back_and_recovers_on_the_next_event(rig: Any) -> None:
    pub, state = rig
    sub = state.subscribers["w0"]
    await asyncio.sleep(0.3)
    await pub.publish([stored(0, parent=None)])
    await until(lambda: cached(state) == 1)
    sub.note_dispatch(now_s=state.clock())  # we routed new blocks there ...
    await asyncio.sleep(0.4)  # ... and heard nothing for longer than events_silence_s
    assert sub.current_state(now_s=state.clock()) == "silent"
    assert cached(state) == 0
    assert "w0 silent" in plan(state).decision.reason
    await pub.publish([AllBlocksCleared()])
    await pub.publish([stored(0, parent=None)])
    await until(lambda: cached(state) == 1)
    assert sub.current_state(now_s=state.clock()) == "live"


async def test_malformed_messages_are_counted_and_ignored(rig: Any) -> None:
    pub, state = rig
    sub = state.subscribers["w0"]
    await asyncio.sleep(0.3)
    await pub.publish([stored(0, parent=None)])
    await until(lambda: cached(state) == 1)
    await pub.pub.send_multipart([b"kv-events", (1).to_bytes(8, "big"), b"\xc1not msgpack"])
    pub.seq = 1
    await until(lambda: sub.status.malformed == 1)
    await pub.publish([stored(1, parent=1000)])
    await until(lambda: cached(state) == 2)


async def test_snapshot_changes_start_and_stop_subscribers(rig: Any) -> None:
    pub, state = rig
    assert set(state.subscribers) == {"w0"}
    d = doc(pub)
    d["revision"] = "r2"
    d["workers"] = d["workers"][1:]
    state.refresher._source.set(d)  # type: ignore[attr-defined]
    await state.refresher.refresh()
    assert state.subscribers == {}
    assert [w.id for w in state.snapshot.workers] == ["w1"]
