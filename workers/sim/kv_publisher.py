"""KV events on ZMQ exactly as vLLM publishes them.

PUB socket, one multipart message per engine step that has events:
`(topic, seq as 8 bytes big-endian from 0, msgpack([ts, [events], dp_rank]))`. Events are
tagged maps with the keys vLLM 0.32 sends (see tests/fixtures/golden) or, for older
subscribers, msgspec-style tagged arrays in the same field order.

Replay: a ROUTER socket. A client (DEALER or REQ) sends `[b"", start_seq (8 bytes)]`; the
server answers every buffered batch with `seq >= start_seq` as `[b"", seq, payload]`, then
`[b"", (-1 as 8 signed bytes), b""]`. The buffer keeps the last `buffer_steps` batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import msgpack
import zmq
import zmq.asyncio

from routing.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVOp

log = logging.getLogger(__name__)

EventShape = Literal["map", "array"]
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _stored_fields(op: BlockStored) -> list[tuple[str, Any]]:
    # Field order and keys as vLLM 0.32 sends them (golden trace), lora/extra keys unset.
    return [
        ("block_hashes", list(op.engine_hashes)),
        ("parent_block_hash", op.parent_engine_hash),
        ("token_ids", list(op.token_ids)),
        ("block_size", op.block_size),
        ("lora_id", op.lora_id),
        ("medium", op.medium),
        ("lora_name", None),
        ("extra_keys", [None] * len(op.engine_hashes)),
        ("group_idx", 0),
        ("kv_cache_spec_kind", "full_attention"),
    ]


def _op_fields(op: KVOp) -> tuple[str, list[tuple[str, Any]]]:
    if isinstance(op, BlockStored):
        return "BlockStored", _stored_fields(op)
    if isinstance(op, BlockRemoved):
        return "BlockRemoved", [
            ("block_hashes", list(op.engine_hashes)),
            ("medium", op.medium),
            ("group_idx", 0),
        ]
    assert isinstance(op, AllBlocksCleared)
    return "AllBlocksCleared", []


def encode_event(op: KVOp, *, shape: EventShape = "map") -> Any:
    """One op as vLLM writes it: a tagged map (`{"type": ...}`) or a tagged array."""
    tag, fields = _op_fields(op)
    if shape == "map":
        return {"type": tag, **dict(fields)}
    return [tag, *(value for _, value in fields)]


def encode_payload(
    ts: float, ops: Sequence[KVOp], *, shape: EventShape = "map", dp_rank: int = 0
) -> bytes:
    """msgpack of `[ts, [events], dp_rank]` (hashes stay 64-bit unsigned ints)."""
    return msgpack.packb([ts, [encode_event(op, shape=shape) for op in ops], dp_rank])  # type: ignore[no-any-return]


def zmq_bind_endpoint(endpoint: str) -> str:
    """`tcp://host:0` -> `tcp://host:*` (ZMQ's spelling of 'any free port')."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


class KVEventPublisher:
    """Publishes engine steps' KV ops; optional replay of the last `buffer_steps` batches."""

    def __init__(
        self,
        *,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: bytes = b"",
        shape: EventShape = "map",
        buffer_steps: int = 10_000,
        dp_rank: int = 0,
    ) -> None:
        self._ctx = ctx
        self._want_endpoint = endpoint
        self._want_replay = replay_endpoint
        self.topic = topic
        self.shape: EventShape = shape
        self.dp_rank = dp_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint = ""
        self.replay_endpoint: str | None = None

    @property
    def next_seq(self) -> int:
        return self._seq

    def start(self) -> None:
        """Bind the sockets (port 0 picks a free port; `endpoint` then holds the real one)."""
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.bind(zmq_bind_endpoint(self._want_endpoint))
        self._pub = pub
        self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        if self._want_replay:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(zmq_bind_endpoint(self._want_replay))
            self._router = router
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, ops: Sequence[KVOp], *, ts: float) -> int:
        """Send one batch (never blocks: PUB drops for slow subscribers); returns its seq."""
        if self._pub is None:
            raise RuntimeError("publisher not started")
        seq = self._seq
        self._seq += 1
        payload = encode_payload(ts, ops, shape=self.shape, dp_rank=self.dp_rank)
        if self._want_replay:
            self._buffer.append((seq, payload))
        await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            # [identity, b"", start_seq] from DEALER/REQ; tolerate a missing delimiter.
            if len(frames) == 3 and not frames[1]:
                ident, start = frames[0], frames[2]
            elif len(frames) == 2:
                ident, start = frames
            else:
                log.warning("replay: ignoring a %d-frame request", len(frames))
                continue
            if len(start) != 8:
                log.warning("replay: start seq must be 8 bytes, got %d", len(start))
                await router.send_multipart([ident, b"", _END_SEQ, b""])
                continue
            start_seq = int.from_bytes(start, "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([ident, b"", _END_SEQ, b""])

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
