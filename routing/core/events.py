"""vLLM KV-cache event messages <-> index operations.

A vLLM engine started with ``--kv-events-config`` publishes, per batch, a ZMQ multipart message
``(topic, seq, payload)``: ``seq`` is an 8-byte big-endian counter (gaps mean lost batches) and
``payload`` is msgpack of ``[ts, events, data_parallel_rank]``. Each event is a tagged array in
vLLM's msgspec encoding (``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, ...]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``) or a
tagged map (``{"type": "BlockStored", "block_hashes": [...], ...}``); both decode to the same ops.
Engine block hashes arrive as ints or bytes; bytes become ``int.from_bytes(h, "big")`` so the two
spellings of one hash are the same key.

Decoding is all-or-nothing: a message either yields a complete ``EventBatch`` or raises
``MalformedEvent`` before anything reaches the index.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import msgpack

from routing.core.errors import MalformedEvent

__all__ = [
    "REPLAY_END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVOp",
    "decode_message",
    "encode_batch",
    "is_replay_end",
    "validate_op",
]

# vLLM's replay socket ends a replay with this sequence number and an empty payload.
REPLAY_END_SEQ = -1

_MAX_TOKEN_ID = 2**32


@dataclass(frozen=True, slots=True)
class BlockStored:
    """The engine cached ``len(engine_hashes)`` full blocks chained after ``parent_engine_hash``.

    ``token_ids`` holds exactly ``len(engine_hashes) * block_size`` tokens, block by block;
    ``parent_engine_hash`` is None when the first block starts a prompt.
    """

    engine_hashes: tuple[int, ...]
    parent_engine_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """The engine evicted the blocks with these hashes (in any order)."""

    engine_hashes: tuple[int, ...]
    medium: str | None = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (reset, restart, weight reload)."""


KVOp: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded message: ``seq`` orders batches per worker, ``ts`` is the engine's unix time (s)."""

    seq: int
    ts: float
    ops: tuple[KVOp, ...]
    dp_rank: int = 0


def _hash(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise MalformedEvent(f"{what} must be an int or bytes, got bool")
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        if not value:
            raise MalformedEvent(f"{what} is empty bytes")
        return int.from_bytes(value, "big")
    raise MalformedEvent(f"{what} must be an int or bytes, got {type(value).__name__}")


def _hashes(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise MalformedEvent(f"{what} must be a list, got {type(value).__name__}")
    return tuple(_hash(h, what) for h in value)


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedEvent(f"{what} must be an int, got {type(value).__name__}")
    return value


def _opt_str(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise MalformedEvent(f"{what} must be a string or null, got {type(value).__name__}")


def _token_ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise MalformedEvent(f"token_ids must be a list, got {type(value).__name__}")
    # array() checks type and range in C; a Python loop would dominate decode time.
    try:
        array("I" if array("I").itemsize == 4 else "L", value)
    except (OverflowError, TypeError) as exc:
        raise MalformedEvent(f"token_ids must be integers in [0, 2**32): {exc}") from None
    return tuple(value)


def validate_op(op: object) -> None:
    """Raise ``MalformedEvent`` unless ``op`` is an op whose fields are consistent."""
    if isinstance(op, BlockStored):
        if not op.engine_hashes:
            raise MalformedEvent("BlockStored.block_hashes is empty")
        if isinstance(op.block_size, bool) or not isinstance(op.block_size, int):
            raise MalformedEvent("BlockStored.block_size must be an int")
        if op.block_size <= 0:
            raise MalformedEvent(f"BlockStored.block_size must be positive, got {op.block_size}")
        expected = len(op.engine_hashes) * op.block_size
        if len(op.token_ids) != expected:
            raise MalformedEvent(
                f"BlockStored.token_ids has {len(op.token_ids)} tokens, expected "
                f"{len(op.engine_hashes)} blocks x {op.block_size} = {expected}"
            )
    elif not isinstance(op, BlockRemoved | AllBlocksCleared):
        raise MalformedEvent(f"not a KV op: {type(op).__name__}")


def _stored(
    hashes: object,
    parent: object,
    token_ids: object,
    block_size: object,
    lora_id: object,
    medium: object,
) -> BlockStored:
    op = BlockStored(
        engine_hashes=_hashes(hashes, "block_hashes"),
        parent_engine_hash=None if parent is None else _hash(parent, "parent_block_hash"),
        token_ids=_token_ids(token_ids),
        block_size=_int(block_size, "block_size"),
        lora_id=None if lora_id is None else _int(lora_id, "lora_id"),
        medium=_opt_str(medium, "medium"),
    )
    validate_op(op)
    return op


def _tag(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise MalformedEvent(f"event tag must be a string, got {type(value).__name__}")
    return value


def _decode_event(event: object, index: int) -> KVOp:
    try:
        if isinstance(event, Mapping):
            return _decode_map_event(event)
        if isinstance(event, list | tuple) and event:
            return _decode_array_event(event)
    except MalformedEvent as exc:
        raise MalformedEvent(f"event {index}: {exc}") from None
    raise MalformedEvent(f"event {index}: expected a tagged map or a tagged array")


def _decode_map_event(event: Mapping[Any, Any]) -> KVOp:
    kind = _tag(event.get("type"))
    if kind == "BlockStored":
        for name in ("block_hashes", "token_ids", "block_size"):
            if name not in event:
                raise MalformedEvent(f"BlockStored is missing {name!r}")
        return _stored(
            event["block_hashes"],
            event.get("parent_block_hash"),
            event["token_ids"],
            event["block_size"],
            event.get("lora_id"),
            event.get("medium"),
        )
    if kind == "BlockRemoved":
        if "block_hashes" not in event:
            raise MalformedEvent("BlockRemoved is missing 'block_hashes'")
        return BlockRemoved(
            engine_hashes=_hashes(event["block_hashes"], "block_hashes"),
            medium=_opt_str(event.get("medium"), "medium"),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedEvent(f"unknown event type {kind!r}")


def _decode_array_event(event: Sequence[Any]) -> KVOp:
    kind = _tag(event[0])
    if kind == "BlockStored":
        # Trailing fields newer vLLM versions append (lora name, extra keys) are not needed here.
        if len(event) < 5:
            raise MalformedEvent(f"BlockStored array has {len(event)} fields, expected >= 5")
        return _stored(
            event[1],
            event[2],
            event[3],
            event[4],
            event[5] if len(event) > 5 else None,
            event[6] if len(event) > 6 else None,
        )
    if kind == "BlockRemoved":
        if len(event) < 2:
            raise MalformedEvent("BlockRemoved array has no block_hashes")
        return BlockRemoved(
            engine_hashes=_hashes(event[1], "block_hashes"),
            medium=_opt_str(event[2] if len(event) > 2 else None, "medium"),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedEvent(f"unknown event type {kind!r}")


def _split_payload(payload: object) -> tuple[object, object, object]:
    if isinstance(payload, Mapping):
        if "ts" not in payload or "events" not in payload:
            raise MalformedEvent("payload map needs 'ts' and 'events'")
        rank = payload.get("data_parallel_rank", payload.get("dp_rank"))
        return payload["ts"], payload["events"], rank
    if isinstance(payload, list | tuple) and len(payload) in (2, 3):
        # msgspec omits a trailing default data_parallel_rank, so two fields are legal.
        return payload[0], payload[1], payload[2] if len(payload) == 3 else None
    raise MalformedEvent("payload must be [ts, events, dp_rank] or a map with those keys")


def is_replay_end(frames: Sequence[bytes]) -> bool:
    """True for the marker message that ends a vLLM replay (seq -1, empty payload)."""
    return (
        len(frames) >= 2
        and len(frames[-2]) == 8
        and int.from_bytes(frames[-2], "big", signed=True) == REPLAY_END_SEQ
        and not frames[-1]
    )


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """Decode one ``(topic, seq, payload)`` message (a 2-frame ``(seq, payload)`` is accepted).

    Raises ``MalformedEvent`` naming the first problem; never returns a partial batch.
    """
    if len(frames) not in (2, 3):
        raise MalformedEvent(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    seq_frame, payload_frame = frames[-2], frames[-1]
    if not isinstance(seq_frame, bytes | bytearray | memoryview) or len(seq_frame) != 8:
        raise MalformedEvent("sequence frame must be 8 bytes (big-endian)")
    seq = int.from_bytes(seq_frame, "big", signed=True)
    try:
        payload = msgpack.unpackb(payload_frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise MalformedEvent(f"payload is not valid msgpack: {type(exc).__name__}: {exc}") from None
    ts_raw, events_raw, rank_raw = _split_payload(payload)
    if isinstance(ts_raw, bool) or not isinstance(ts_raw, int | float):
        raise MalformedEvent(f"ts must be a number, got {type(ts_raw).__name__}")
    if not isinstance(events_raw, list | tuple):
        raise MalformedEvent(f"events must be a list, got {type(events_raw).__name__}")
    rank = 0 if rank_raw is None else _int(rank_raw, "data_parallel_rank")
    ops = tuple(_decode_event(event, i) for i, event in enumerate(events_raw))
    return EventBatch(seq=seq, ts=float(ts_raw), ops=ops, dp_rank=rank)


def _event_array(op: KVOp) -> list[Any]:
    if isinstance(op, BlockStored):
        return [
            "BlockStored",
            list(op.engine_hashes),
            op.parent_engine_hash,
            list(op.token_ids),
            op.block_size,
            op.lora_id,
            op.medium,
        ]
    if isinstance(op, BlockRemoved):
        return ["BlockRemoved", list(op.engine_hashes), op.medium]
    return ["AllBlocksCleared"]


def _event_map(op: KVOp) -> dict[str, Any]:
    # Keys, order and the fields we do not model (set to what a plain full-attention model
    # sends) as recorded from vLLM 0.32 in tests/fixtures/golden.
    if isinstance(op, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(op.engine_hashes),
            "parent_block_hash": op.parent_engine_hash,
            "token_ids": list(op.token_ids),
            "block_size": op.block_size,
            "lora_id": op.lora_id,
            "medium": op.medium,
            "lora_name": None,
            "extra_keys": [None] * len(op.engine_hashes),
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    if isinstance(op, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(op.engine_hashes),
            "medium": op.medium,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def encode_batch(
    seq: int,
    ts: float,
    events: Sequence[KVOp],
    *,
    topic: bytes = b"kv-events",
    shape: Literal["map", "array"] = "map",
    dp_rank: int = 0,
) -> list[bytes]:
    """Encode ops as the 3 frames a vLLM publisher sends: ``[topic, seq, msgpack payload]``.

    ``shape="map"`` writes events as tagged maps with current vLLM's (0.32) keys,
    ``shape="array"`` as the msgspec tagged arrays of older vLLM (``[tag, block_hashes,
    parent_block_hash, token_ids, block_size, lora_id, medium]``); the payload is
    ``[ts, events, dp_rank]`` either way.
    Hashes are written as given (ints). Raises ValueError for an inconsistent op.
    """
    if shape not in ("map", "array"):
        raise ValueError(f"shape must be 'map' or 'array', got {shape!r}")
    for op in events:
        try:
            validate_op(op)
        except MalformedEvent as exc:
            raise ValueError(str(exc)) from None
    encode_one = _event_map if shape == "map" else _event_array
    payload = msgpack.packb([float(ts), [encode_one(op) for op in events], dp_rank])
    return [bytes(topic), seq.to_bytes(8, "big", signed=seq < 0), payload]
