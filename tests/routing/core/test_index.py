"""Prefix index: longest-prefix matches from engine events and routed history, with TTL and bounds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.blocks import token_block_keys
from routing.core.errors import MalformedEvent
from routing.core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_message,
    encode_batch,
)
from routing.core.index import BlockCounts, PrefixIndex
from tests.routing.core.conftest import make_stored, make_tokens

BS = 16
GOLDEN = (
    Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "vllm_cpu_block32_64blocks.json"
)


def stored_prompt(index: PrefixIndex, worker: str, tokens: list[int], *, first_hash: int) -> None:
    index.apply(worker, [make_stored(tokens, first_hash=first_hash)], now_s=0.0)


def test_engine_events_make_the_gateways_keys_match() -> None:
    tokens = make_tokens(10 * BS + 7)
    index = PrefixIndex()
    stored_prompt(index, "w1", tokens, first_hash=100)
    keys = token_block_keys(tokens, BS)
    assert index.match(keys, now_s=1.0) == {"w1": 10}
    # a longer prompt sharing the first 4 blocks, then diverging
    other = tokens[: 4 * BS] + make_tokens(6 * BS, seed=9)
    assert index.match(token_block_keys(other, BS), now_s=1.0) == {"w1": 4}
    assert index.match(token_block_keys(make_tokens(64, seed=5), BS), now_s=1.0) == {}
    assert index.match((), now_s=1.0) == {}


def test_a_stored_chain_continues_from_its_parent_hash() -> None:
    tokens = make_tokens(6 * BS)
    index = PrefixIndex()
    index.apply("w1", [make_stored(tokens[: 2 * BS], first_hash=1)], now_s=0.0)
    # engine hashes 1, 2 for the first two blocks; the next event chains on hash 2
    index.apply("w1", [make_stored(tokens[2 * BS :], first_hash=3, parent_hash=2)], now_s=0.0)
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {"w1": 6}
    assert index.stats().per_worker == {"w1": BlockCounts(precise=6, approximate=0)}


def test_a_chain_whose_parent_is_unknown_is_counted_not_guessed() -> None:
    tokens = make_tokens(4 * BS)
    index = PrefixIndex()
    index.apply("w1", [make_stored(tokens[BS:], first_hash=10, parent_hash=999)], now_s=0.0)
    assert index.stats().orphaned_blocks == 3
    assert index.stats().entries == 0
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {}


def test_predictions_equal_a_real_vllm_engines_cached_tokens() -> None:
    """Replays KV events recorded from real vLLM (see tests/fixtures/golden/README.md): before
    each request, the index fed with every earlier event batch must predict exactly the
    cached tokens vLLM then reported (a hit is capped at (n-1)//block_size blocks, since the
    engine always recomputes the last prompt token)."""
    golden = json.loads(GOLDEN.read_text())
    block_size = golden["block_size"]
    index = PrefixIndex()
    applied = 0
    hits = 0
    for request in golden["requests"]:
        keys = token_block_keys(request["prompt"], block_size)
        matched = index.match(keys, now_s=0.0).get("vllm", 0)
        usable = (request["prompt_len"] - 1) // block_size
        assert min(matched, usable) * block_size == request["cached_tokens"], request["label"]
        hits += request["cached_tokens"] > 0
        for batch in golden["event_batches"][applied : request["events_after"]]:
            wire = [
                b"kv",
                batch["seq"].to_bytes(8, "big"),
                msgpack.packb([0.0, batch["events"], 0]),
            ]
            index.apply("vllm", decode_message(wire).ops, now_s=0.0)
        applied = request["events_after"]
        assert index.stats().per_worker["vllm"].precise <= golden["num_gpu_blocks_override"]
    assert hits >= 5  # the trace exercises hits, misses and evictions, not just misses
    assert index.stats().event_block_sizes == {"vllm": 32}


def test_lora_blocks_never_match_base_model_prompts() -> None:
    tokens = make_tokens(4 * BS)
    keys = token_block_keys(tokens, BS)
    index = PrefixIndex()
    lora = BlockStored((1, 2), None, tuple(tokens[: 2 * BS]), BS, lora_id=3)
    child = BlockStored((3, 4), 2, tuple(tokens[2 * BS :]), BS, lora_id=3)
    index.apply("a", [lora, child], now_s=0.0)
    assert index.stats().per_worker["a"] == BlockCounts(4, 0)
    assert index.match(keys, now_s=0.0) == {}
    stored_prompt(index, "a", tokens, first_hash=10)  # the base model's copy of the same tokens
    index.apply("a", [BlockRemoved((1, 2, 3, 4))], now_s=0.0)
    assert index.match(keys, now_s=0.0) == {"a": 4}
    assert index.stats().per_worker["a"] == BlockCounts(4, 0)


def test_block_removed_by_engine_hash_truncates_the_prefix() -> None:
    tokens = make_tokens(8 * BS)
    index = PrefixIndex()
    stored_prompt(index, "w1", tokens, first_hash=100)  # hashes 100..107
    index.apply("w1", [BlockRemoved((103,)), BlockRemoved((999,))], now_s=0.0)
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {"w1": 3}
    assert index.stats().per_worker["w1"] == BlockCounts(precise=7, approximate=0)


def test_each_worker_gets_its_own_prefix_length_in_one_call() -> None:
    tokens = make_tokens(12 * BS)
    index = PrefixIndex()
    stored_prompt(index, "a", tokens[: 12 * BS], first_hash=1)
    stored_prompt(index, "b", tokens[: 5 * BS], first_hash=1)
    stored_prompt(index, "c", tokens[: 1 * BS], first_hash=1)
    index.apply("d", [make_stored(tokens[BS : 3 * BS], first_hash=2, parent_hash=1)], now_s=0.0)
    # d holds no chain from the root (its parent hash 1 is unknown to d)
    index.record_routed("e", token_block_keys(tokens[: 8 * BS], BS), now_s=0.0)
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {
        "a": 12,
        "b": 5,
        "c": 1,
        "e": 8,
    }


def test_all_blocks_cleared_empties_the_worker_only() -> None:
    tokens = make_tokens(4 * BS)
    keys = token_block_keys(tokens, BS)
    index = PrefixIndex()
    stored_prompt(index, "a", tokens, first_hash=1)
    stored_prompt(index, "b", tokens, first_hash=1)
    index.record_routed("a", keys, now_s=0.0)
    index.apply("a", [AllBlocksCleared()], now_s=0.0)
    assert index.match(keys, now_s=0.0) == {"b": 4}
    assert index.stats().per_worker["a"] == BlockCounts(0, 0)
    # its engine-hash map is gone too: removing an old hash must not touch b
    index.apply("a", [BlockRemoved((1, 2))], now_s=0.0)
    assert index.match(keys, now_s=0.0) == {"b": 4}


def test_approximate_blocks_expire_after_the_ttl_but_precise_ones_never_do() -> None:
    routed = token_block_keys(make_tokens(4 * BS, seed=1), BS)
    tokens = make_tokens(4 * BS, seed=2)
    index = PrefixIndex(approx_ttl_s=10.0)
    stored_prompt(index, "p", tokens, first_hash=1)
    index.record_routed("a", routed, now_s=100.0)
    assert index.match(routed, now_s=109.999) == {"a": 4}
    assert index.match(routed, now_s=110.0) == {}
    assert index.stats().per_worker["a"] == BlockCounts(0, 0)
    assert index.stats().expired_blocks == 4
    assert index.match(token_block_keys(tokens, BS), now_s=1e9) == {"p": 4}


def test_routing_again_refreshes_the_ttl() -> None:
    keys = token_block_keys(make_tokens(6 * BS), BS)
    index = PrefixIndex(approx_ttl_s=10.0)
    index.record_routed("a", keys, now_s=0.0)
    index.record_routed("a", keys[:2], now_s=8.0)
    assert index.match(keys, now_s=12.0) == {"a": 2}
    assert index.stats(now_s=12.0).per_worker["a"] == BlockCounts(0, 2)
    assert index.match(keys, now_s=18.0) == {}


def test_engine_confirmation_replaces_the_speculative_copy() -> None:
    tokens = make_tokens(4 * BS)
    keys = token_block_keys(tokens, BS)
    index = PrefixIndex(approx_ttl_s=10.0)
    index.record_routed("a", keys, now_s=0.0)
    stored_prompt(index, "a", tokens, first_hash=1)
    assert index.stats().per_worker["a"] == BlockCounts(precise=4, approximate=0)
    index.record_routed("a", keys, now_s=1.0)  # already precise: nothing speculative added
    assert index.stats().per_worker["a"] == BlockCounts(precise=4, approximate=0)
    assert index.match(keys, now_s=1000.0) == {"a": 4}


def test_per_worker_lru_evicts_the_tails_of_the_oldest_prompts_first() -> None:
    first = token_block_keys(make_tokens(6 * BS, seed=1), BS)
    second = token_block_keys(make_tokens(6 * BS, seed=2), BS)
    index = PrefixIndex()
    index.set_capacity("a", 8)
    index.record_routed("a", first, now_s=0.0)
    index.record_routed("a", second, now_s=1.0)
    assert index.stats().per_worker["a"] == BlockCounts(0, 8)
    assert index.match(first, now_s=2.0) == {"a": 2}
    assert index.match(second, now_s=2.0) == {"a": 6}
    # shrinking the capacity applies at once
    index.set_capacity("a", 3)
    assert index.match(second, now_s=2.0) == {"a": 3}
    assert index.match(first, now_s=2.0) == {}


def test_global_bound_evicts_least_recently_stored_keys_and_keeps_counts_true() -> None:
    old, new = make_tokens(8 * BS, seed=1), make_tokens(8 * BS, seed=2)
    index = PrefixIndex(max_entries=10)
    stored_prompt(index, "a", old, first_hash=100)
    index.record_routed("b", token_block_keys(old, BS), now_s=0.0)
    stored_prompt(index, "c", new, first_hash=200)
    stats = index.stats()
    assert stats.entries == 10 and stats.evicted_entries == 6
    assert stats.per_worker == {
        "a": BlockCounts(2, 0),
        "b": BlockCounts(0, 2),
        "c": BlockCounts(8, 0),
    }
    assert index.match(token_block_keys(old, BS), now_s=0.0) == {"a": 2, "b": 2}
    # removing an evicted block later is harmless; storing it again brings it back
    index.apply("a", [BlockRemoved((107,))], now_s=0.0)
    assert index.stats().per_worker["a"] == BlockCounts(2, 0)
    stored_prompt(index, "a", old, first_hash=100)
    assert index.match(token_block_keys(old, BS), now_s=0.0)["a"] == 8


def test_a_malformed_op_in_a_batch_applies_nothing() -> None:
    tokens = make_tokens(4 * BS)
    index = PrefixIndex()
    stored_prompt(index, "a", tokens, first_hash=1)
    before = index.stats()
    bad = BlockStored((50, 51), 4, tuple(range(BS)), BS)  # 2 hashes, 1 block of tokens
    with pytest.raises(MalformedEvent, match="token_ids"):
        index.apply("a", [AllBlocksCleared(), make_stored(tokens, first_hash=60), bad], now_s=0.0)
    with pytest.raises(MalformedEvent):
        index.apply("a", [BlockRemoved((1,)), "BlockRemoved"], now_s=0.0)  # type: ignore[list-item]
    assert index.stats() == before
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {"a": 4}


def test_decoded_wire_batches_feed_the_index() -> None:
    tokens = make_tokens(5 * BS)
    ops = [
        make_stored(tokens[: 2 * BS], first_hash=1),
        make_stored(tokens[2 * BS :], first_hash=3, parent_hash=2),
    ]
    index = PrefixIndex()
    for shape in ("map", "array"):
        index.apply(shape, decode_message(encode_batch(1, 0.0, ops, shape=shape)).ops, now_s=0.0)
    assert index.match(token_block_keys(tokens, BS), now_s=0.0) == {"map": 5, "array": 5}


def test_removed_worker_slot_is_reused_without_inheriting_blocks() -> None:
    tokens = make_tokens(3 * BS)
    keys = token_block_keys(tokens, BS)
    index = PrefixIndex()
    stored_prompt(index, "old", tokens, first_hash=1)
    index.record_routed("old", token_block_keys(make_tokens(2 * BS, seed=4), BS), now_s=0.0)
    index.remove_worker("old")
    index.remove_worker("never-seen")
    index.clear_worker("never-seen")
    assert index.stats().entries == 0
    index.set_capacity("new", 100)
    assert index.workers() == ["new"]
    assert index.match(keys, now_s=0.0) == {}
    index.apply("new", [BlockRemoved((1, 2, 3))], now_s=0.0)
    assert index.stats().per_worker == {"new": BlockCounts(0, 0)}


@pytest.mark.parametrize(
    "kwargs", [{"max_entries": 0}, {"approx_ttl_s": 0.0}, {"default_capacity_blocks": -1}]
)
def test_constructor_rejects_nonsense_bounds(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(**kwargs)  # type: ignore[arg-type]


# ---- properties against a reference model ------------------------------------------------

TTL_S = 5.0
PROMPTS = [make_tokens(8 * 4, seed=s, vocab=3) for s in range(3)]  # tiny vocab: shared prefixes
PROMPT_KEYS = [token_block_keys(p, 4) for p in PROMPTS]
WORKERS = ["a", "b", "c"]


def engine_hash(prompt: int, block: int) -> int:
    # vLLM's hash is content-addressed like ours, but a different function
    return PROMPT_KEYS[prompt][block] ^ 0x5A5A5A5A


@dataclass
class Model:
    precise: dict[str, set[int]] = field(default_factory=lambda: {w: set() for w in WORKERS})
    approx: dict[str, dict[int, float]] = field(default_factory=lambda: {w: {} for w in WORKERS})

    def held(self, worker: str, key: int, now_s: float) -> bool:
        return key in self.precise[worker] or self.approx[worker].get(key, -1.0) > now_s

    def match(self, keys: tuple[int, ...], now_s: float) -> dict[str, int]:
        out = {}
        for w in WORKERS:
            n = 0
            while n < len(keys) and self.held(w, keys[n], now_s):
                n += 1
            if n:
                out[w] = n
        return out


ops_strategy = st.lists(
    st.one_of(
        st.tuples(
            st.just("store"),
            st.sampled_from(WORKERS),
            st.integers(0, 2),
            st.integers(0, 7),
            st.integers(1, 8),
        ),
        st.tuples(
            st.just("remove"), st.sampled_from(WORKERS), st.integers(0, 2), st.integers(0, 7)
        ),
        st.tuples(st.just("route"), st.sampled_from(WORKERS), st.integers(0, 2), st.integers(1, 8)),
        st.tuples(st.just("clear"), st.sampled_from(WORKERS)),
        st.tuples(st.just("drop"), st.sampled_from(WORKERS)),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, 4.9, 5.0])),
    ),
    max_size=25,
)


def run(
    index: PrefixIndex,
    model: Model | None,
    ops: list[tuple[Any, ...]],
    only: set[str] | None = None,
) -> float:
    """Apply ``ops`` to the index (and the model); returns the final time."""
    now_s = 0.0
    for op in ops:
        kind = op[0]
        if kind == "tick":
            now_s += op[1]
            continue
        w = str(op[1])
        if only is not None and w not in only:
            continue
        if kind == "store":
            p, start, length = op[2], op[3], op[4]
            end = min(8, start + length)
            stored = BlockStored(
                tuple(engine_hash(p, b) for b in range(start, end)),
                None if start == 0 else engine_hash(p, start - 1),
                tuple(PROMPTS[p][start * 4 : end * 4]),
                4,
            )
            index.apply(w, [stored], now_s=now_s)
            if model and (start == 0 or PROMPT_KEYS[p][start - 1] in model.precise[w]):
                for b in range(start, end):
                    model.precise[w].add(PROMPT_KEYS[p][b])
                    model.approx[w].pop(PROMPT_KEYS[p][b], None)
        elif kind == "remove":
            p, b = op[2], op[3]
            index.apply(w, [BlockRemoved((engine_hash(p, b),))], now_s=now_s)
            if model:
                model.precise[w].discard(PROMPT_KEYS[p][b])
        elif kind == "route":
            p, n = op[2], op[3]
            index.record_routed(w, PROMPT_KEYS[p][:n], now_s=now_s)
            if model:
                for key in PROMPT_KEYS[p][:n]:
                    if key not in model.precise[w]:
                        model.approx[w][key] = now_s + TTL_S
        elif kind in ("clear", "drop"):
            (index.clear_worker if kind == "clear" else index.remove_worker)(w)
            if model:
                model.precise[w].clear()
                model.approx[w].clear()
    return now_s


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy)
def test_index_matches_a_reference_model_exactly_when_unbounded(ops: list[tuple[Any, ...]]) -> None:
    index, model = PrefixIndex(approx_ttl_s=TTL_S), Model()
    now_s = run(index, model, ops)
    for keys in PROMPT_KEYS:
        assert index.match(keys, now_s=now_s) == model.match(keys, now_s)
    stats = index.stats(now_s=now_s)
    for w, counts in stats.per_worker.items():
        live_approx = sum(1 for exp in model.approx[w].values() if exp > now_s)
        assert counts == BlockCounts(len(model.precise[w]), live_approx)


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy, max_entries=st.integers(1, 12), capacity=st.integers(1, 6))
def test_bounded_index_never_reports_more_than_was_stored(
    ops: list[tuple[Any, ...]], max_entries: int, capacity: int
) -> None:
    index = PrefixIndex(
        approx_ttl_s=TTL_S, max_entries=max_entries, default_capacity_blocks=capacity + 1
    )
    model = Model()
    for w in WORKERS:
        index.set_capacity(w, capacity)  # a dropped worker comes back with the default
    now_s = run(index, model, ops)
    stats = index.stats(now_s=now_s)
    assert stats.entries <= max_entries
    for keys in PROMPT_KEYS:
        expected = model.match(keys, now_s)
        for w, n in index.match(keys, now_s=now_s).items():
            assert n <= expected.get(w, 0)
    for w, counts in stats.per_worker.items():
        assert counts.approximate <= capacity + 1
        assert counts.precise <= len(model.precise[w])


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy)
def test_removing_a_worker_leaves_no_trace(ops: list[tuple[Any, ...]]) -> None:
    with_a, without_a = PrefixIndex(approx_ttl_s=TTL_S), PrefixIndex(approx_ttl_s=TTL_S)
    now_s = run(with_a, None, ops)
    run(without_a, None, ops, only={"b", "c"})
    with_a.remove_worker("a")
    assert "a" not in with_a.stats().per_worker
    for keys in PROMPT_KEYS:
        assert with_a.match(keys, now_s=now_s) == without_a.match(keys, now_s=now_s)
    s1, s2 = with_a.stats(now_s=now_s), without_a.stats(now_s=now_s)
    assert (s1.entries, s1.per_worker) == (s2.entries, s2.per_worker)
