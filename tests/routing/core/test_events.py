"""KV-event codec: vLLM's wire shapes in, index operations out, malformed input rejected whole."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.errors import MalformedEvent
from routing.core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVOp,
    decode_message,
    encode_batch,
    is_replay_end,
    validate_op,
)
from tests.routing.core.conftest import make_stored, make_tokens

GOLDEN = (
    Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "vllm_cpu_block32_64blocks.json"
)


def frames(payload: object, *, seq: int = 7, topic: bytes = b"kv-events") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgpack.packb(payload)]


def test_decodes_vllm_tagged_array_events_written_by_hand() -> None:
    tokens = make_tokens(32)
    payload = [
        1732870000.25,
        [
            ["BlockStored", [101, 102], None, tokens, 16, None, "GPU"],
            ["BlockStored", [103], 102, tokens[:16], 16, None, "GPU"],
            ["BlockRemoved", [101], "GPU"],
            ["AllBlocksCleared"],
        ],
        2,
    ]
    batch = decode_message(frames(payload, seq=41))
    assert batch == EventBatch(
        seq=41,
        ts=1732870000.25,
        dp_rank=2,
        ops=(
            BlockStored((101, 102), None, tuple(tokens), 16, None, "GPU"),
            BlockStored((103,), 102, tuple(tokens[:16]), 16, None, "GPU"),
            BlockRemoved((101,), "GPU"),
            AllBlocksCleared(),
        ),
    )


def test_decodes_tagged_map_events_and_a_map_payload() -> None:
    tokens = make_tokens(16)
    payload = {
        "ts": 5,
        "events": [
            {"type": "BlockStored", "block_hashes": [9], "token_ids": tokens, "block_size": 16},
            {"type": "BlockRemoved", "block_hashes": [9]},
        ],
        "data_parallel_rank": 1,
    }
    batch = decode_message(frames(payload))
    assert batch.ts == 5.0 and batch.dp_rank == 1
    assert batch.ops == (
        BlockStored((9,), None, tuple(tokens), 16, None, None),
        BlockRemoved((9,), None),
    )


def test_bytes_hashes_become_the_same_ints_everywhere() -> None:
    tokens = make_tokens(32)
    h1, h2 = bytes(range(32)), b"\x00\x01"
    payload = [0.0, [["BlockStored", [h1, h2], b"\xff" * 8, tokens, 16], ["BlockRemoved", [h2]]]]
    ops = decode_message(frames(payload)).ops
    assert ops[0] == BlockStored(
        (int.from_bytes(h1, "big"), 1), 2**64 - 1, tuple(tokens), 16, None, None
    )
    assert ops[1] == BlockRemoved((1,), None)


def test_two_field_payload_means_rank_zero_and_two_frames_are_accepted() -> None:
    payload = msgpack.packb([1.5, [["AllBlocksCleared"]]])
    batch = decode_message([(3).to_bytes(8, "big"), payload])
    assert batch == EventBatch(seq=3, ts=1.5, ops=(AllBlocksCleared(),), dp_rank=0)


def test_encode_writes_three_frames_with_a_big_endian_sequence() -> None:
    topic, seq, payload = encode_batch(258, 2.5, [AllBlocksCleared()], topic=b"t", dp_rank=3)
    assert topic == b"t"
    assert seq == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert msgpack.unpackb(payload) == [2.5, [{"type": "AllBlocksCleared"}], 3]


def test_map_shape_has_the_keys_vllm_sends() -> None:
    golden = json.loads(GOLDEN.read_text())
    recorded = {e["type"]: e for b in golden["event_batches"] for e in b["events"]}
    stored = recorded["BlockStored"]
    op = BlockStored(
        tuple(stored["block_hashes"]),
        stored["parent_block_hash"],
        tuple(stored["token_ids"]),
        stored["block_size"],
    )
    removed = BlockRemoved(tuple(recorded["BlockRemoved"]["block_hashes"]))
    _, _, payload = encode_batch(1, 0.0, [op, removed], shape="map")
    assert msgpack.unpackb(payload)[1] == [stored, recorded["BlockRemoved"]]


def test_array_shape_matches_vllm_msgspec_field_order() -> None:
    op = make_stored(make_tokens(16), first_hash=5, parent_hash=4)
    _, _, payload = encode_batch(1, 0.0, [op, BlockRemoved((5,))], shape="array")
    assert msgpack.unpackb(payload) == [
        0.0,
        [
            ["BlockStored", [5], 4, list(op.token_ids), 16, None, "GPU"],
            ["BlockRemoved", [5], "GPU"],
        ],
        0,
    ]


VLLM_ARRAY_FIELDS = {
    # msgspec array_like field order of vLLM's event structs
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def test_real_vllm_events_decode_the_same_as_maps_and_as_arrays() -> None:
    golden = json.loads(GOLDEN.read_text())
    stored = removed = 0
    for batch in golden["event_batches"]:
        as_arrays = [
            [e["type"], *(e[name] for name in VLLM_ARRAY_FIELDS[e["type"]])]
            for e in batch["events"]
        ]
        from_maps = decode_message(frames([1.0, batch["events"], 0], seq=batch["seq"]))
        from_arrays = decode_message(frames([1.0, as_arrays, 0], seq=batch["seq"]))
        assert from_maps == from_arrays
        assert from_maps.seq == batch["seq"]
        for op, event in zip(from_maps.ops, batch["events"], strict=True):
            assert list(op.engine_hashes) == event["block_hashes"]  # type: ignore[union-attr]
            stored += isinstance(op, BlockStored)
            removed += isinstance(op, BlockRemoved)
    assert stored and removed


hashes = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**63), -1))


@st.composite
def kv_ops(draw: st.DrawFn) -> KVOp:
    kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
    if kind == "cleared":
        return AllBlocksCleared()
    block_hashes = tuple(draw(st.lists(hashes, min_size=1, max_size=4)))
    medium = draw(st.sampled_from([None, "GPU", "CPU"]))
    if kind == "removed":
        return BlockRemoved(block_hashes, medium)
    block_size = draw(st.integers(1, 4))
    token_ids = draw(
        st.lists(
            st.integers(0, 2**32 - 1),
            min_size=len(block_hashes) * block_size,
            max_size=len(block_hashes) * block_size,
        )
    )
    return BlockStored(
        block_hashes,
        draw(st.none() | hashes),
        tuple(token_ids),
        block_size,
        draw(st.none() | st.integers(0, 10)),
        medium,
    )


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(kv_ops(), max_size=5), seq=st.integers(0, 2**40), rank=st.integers(0, 7))
def test_both_wire_shapes_decode_to_the_same_ops(ops: list[KVOp], seq: int, rank: int) -> None:
    as_map = decode_message(encode_batch(seq, 12.5, ops, shape="map", dp_rank=rank))
    as_array = decode_message(encode_batch(seq, 12.5, ops, shape="array", dp_rank=rank))
    assert as_map == as_array == EventBatch(seq=seq, ts=12.5, ops=tuple(ops), dp_rank=rank)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=9)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "ts"]),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(
            st.sampled_from(["type", "ts", "events", "block_hashes", "token_ids"]), inner
        )
    ),
    max_leaves=25,
)


@settings(max_examples=25, deadline=None)
@given(payload=msgpack_values)
def test_arbitrary_payloads_decode_cleanly_or_raise_malformed(payload: object) -> None:
    try:
        batch = decode_message(frames(payload))
    except MalformedEvent:
        return
    for op in batch.ops:
        validate_op(op)


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(kv_ops(), min_size=1, max_size=3), data=st.data())
def test_corrupted_wire_bytes_never_escape_as_other_errors(
    ops: list[KVOp], data: st.DataObject
) -> None:
    topic, seq, payload = encode_batch(
        1, 0.0, ops, shape=data.draw(st.sampled_from(["map", "array"]))
    )
    position = data.draw(st.integers(0, len(payload) - 1))
    corrupted = data.draw(
        st.sampled_from(
            [
                payload[:position],
                payload[:position] + bytes([payload[position] ^ 0xFF]) + payload[position + 1 :],
                payload[:position] + b"\xc1" + payload[position:],
            ]
        )
    )
    try:
        batch = decode_message([topic, seq, corrupted])
    except MalformedEvent:
        return
    for op in batch.ops:
        validate_op(op)


GOOD = ["BlockStored", [1], None, list(range(16)), 16, None, "GPU"]

MALFORMED: dict[str, list[bytes]] = {
    "not msgpack": [b"t", (1).to_bytes(8, "big"), b"\xc1\xc1"],
    "truncated msgpack": [b"t", (1).to_bytes(8, "big"), msgpack.packb([1.0, [GOOD]])[:-3]],
    "short seq frame": [b"t", b"\x01", msgpack.packb([1.0, []])],
    "four frames": [b"t", b"t", (1).to_bytes(8, "big"), msgpack.packb([1.0, []])],
    "payload is a string": frames("hello"),
    "payload too long": frames([1.0, [], 0, 9]),
    "map payload without events": frames({"ts": 1.0}),
    "ts is text": frames(["now", []]),
    "events is a map": frames([1.0, {"a": 1}]),
    "rank is text": frames([1.0, [], "zero"]),
    "unknown event type": frames([1.0, [["BlockPinned", [1]]]]),
    "event is a number": frames([1.0, [7]]),
    "empty event array": frames([1.0, [[]]]),
    "tag is a number": frames([1.0, [[3, [1]]]]),
    "stored with too few fields": frames([1.0, [["BlockStored", [1], None, [1]]]]),
    "token count mismatch": frames([1.0, [["BlockStored", [1, 2], None, list(range(16)), 16]]]),
    "negative token": frames([1.0, [["BlockStored", [1], None, [-1] * 4, 4]]]),
    "token too big": frames([1.0, [["BlockStored", [1], None, [2**32] * 4, 4]]]),
    "token is text": frames([1.0, [["BlockStored", [1], None, ["a"] * 4, 4]]]),
    "zero block size": frames([1.0, [["BlockStored", [1], None, [], 0]]]),
    "no hashes": frames([1.0, [["BlockStored", [], None, [], 16]]]),
    "hash is a float": frames([1.0, [["BlockRemoved", [1.5]]]]),
    "hash is empty bytes": frames([1.0, [["BlockRemoved", [b""]]]]),
    "hashes not a list": frames([1.0, [["BlockRemoved", 5]]]),
    "removed without hashes": frames([1.0, [["BlockRemoved"]]]),
    "map stored without tokens": frames([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]),
    "map without type": frames([1.0, [{"block_hashes": [1]}]]),
    "medium is a number": frames([1.0, [["BlockRemoved", [1], 3]]]),
    "bad event after a good one": frames([1.0, [GOOD, ["BlockStored", [1], None, [1], 16]]]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_messages_raise_a_specific_error(name: str) -> None:
    with pytest.raises(MalformedEvent):
        decode_message(MALFORMED[name])


def test_error_names_the_event_and_the_problem() -> None:
    with pytest.raises(MalformedEvent, match=r"event 1: BlockStored.token_ids has 1 tokens"):
        decode_message(MALFORMED["bad event after a good one"])


def test_replay_end_marker() -> None:
    assert is_replay_end([b"", (-1).to_bytes(8, "big", signed=True), b""])
    assert not is_replay_end(encode_batch(1, 0.0, []))
    with pytest.raises(MalformedEvent):
        decode_message([b"", (-1).to_bytes(8, "big", signed=True), b""])


def test_encode_refuses_inconsistent_ops_and_unknown_shapes() -> None:
    with pytest.raises(ValueError, match="token_ids"):
        encode_batch(1, 0.0, [BlockStored((1, 2), None, (1,) * 16, 16)])
    with pytest.raises(ValueError, match="shape"):
        encode_batch(1, 0.0, [], shape="json")  # type: ignore[arg-type]
