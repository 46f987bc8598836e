from __future__ import annotations

import json

import pytest

from bench.workloads import (
    DEFAULT_TRACE,
    BenchRequest,
    Segment,
    build_workload,
    cacheable_tokens,
    load_trace,
    oracle_hit_rate,
    poisson_arrivals,
    resolve_params,
    segment_tokens,
    trace_request,
)
from routing.core.blocks import token_block_keys
from routing.core.tokenizer import BUILTIN_VOCAB_SIZE

SMALL = {
    "tenants": {
        "tenants": 3,
        "prefix_tokens": 100,
        "users": 2,
        "questions_per_user": 2,
        "question_tokens": 20,
    },
    "chat": {
        "conversations": 3,
        "turns": 4,
        "system_tokens": 50,
        "user_tokens": 10,
        "reply_tokens": 12,
    },
    "agent": {
        "agents": 4,
        "steps": 3,
        "instruction_sets": 2,
        "instruction_tokens": 64,
        "task_tokens": 8,
        "action_tokens": 5,
        "tool_tokens": 20,
    },
    "unique": {"requests": 10, "prompt_tokens": 40},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_workloads_are_deterministic_in_the_seed(name: str) -> None:
    a = build_workload(name, SMALL[name], seed=7)
    b = build_workload(name, SMALL[name], seed=7)
    c = build_workload(name, SMALL[name], seed=8)
    assert [r.token_ids() for r in a] == [r.token_ids() for r in b]
    assert [r.request_id for r in a] == [r.request_id for r in b]
    assert [r.token_ids() for r in a] != [r.token_ids() for r in c]
    for r in a:
        assert all(0 <= t < BUILTIN_VOCAB_SIZE for t in r.token_ids())


def test_tenants_shape() -> None:
    reqs = build_workload("tenants", SMALL["tenants"], seed=1)
    assert len(reqs) == 3 * 2 * 2
    assert {r.prompt_tokens for r in reqs} == {120}
    by_tenant: dict[str | None, set[tuple[int, ...]]] = {}
    for r in reqs:
        by_tenant.setdefault(r.tenant, set()).add(tuple(r.token_ids()[:100]))
    assert len(by_tenant) == 3 and all(len(v) == 1 for v in by_tenant.values())
    assert len({next(iter(v)) for v in by_tenant.values()}) == 3
    assert len({tuple(r.token_ids()[100:]) for r in reqs}) == len(reqs)


def test_chat_history_grows_and_keeps_turn_order() -> None:
    reqs = build_workload("chat", SMALL["chat"], seed=2)
    turns: dict[str | None, list[BenchRequest]] = {}
    for r in reqs:
        turns.setdefault(r.session_key, []).append(r)
    assert len(turns) == 3
    for conv in turns.values():
        assert [r.request_id.split("-k")[1] for r in conv] == ["0", "1", "2", "3"]
        lens = [r.prompt_tokens for r in conv]
        assert lens == [50 + 10, 50 + 10 + 12 + 10, 50 + 2 * 22 + 10, 50 + 3 * 22 + 10]
        for prev, nxt in zip(conv, conv[1:], strict=False):
            assert nxt.token_ids()[: prev.prompt_tokens] == prev.token_ids()


def test_agent_shares_instruction_blocks() -> None:
    reqs = build_workload("agent", SMALL["agent"], seed=3)
    firsts = {tuple(r.token_ids()[:64]) for r in reqs}
    assert len(firsts) == 2
    assert len(reqs) == 4 * 3


def test_unique_has_no_reuse_and_scale_limit() -> None:
    reqs = build_workload("unique", SMALL["unique"], seed=4, scale=0.5, limit=6)
    assert len(reqs) == 6 and {r.prompt_tokens for r in reqs} == {20}
    assert oracle_hit_rate(reqs, block_size=4).hit_rate == 0.0


def test_unknown_param_is_named() -> None:
    with pytest.raises(ValueError, match="bogus"):
        resolve_params("tenants", {"bogus": 1})
    with pytest.raises(ValueError, match="nope"):
        build_workload("nope")


def test_block_keys_match_core_hashing_across_unaligned_segments() -> None:
    r = BenchRequest(
        "x", (Segment("a", 32), Segment("b", 5), Segment("c", 40), Segment("d", 16)), 1, seed=0
    )
    assert r.block_keys(16) == token_block_keys(r.token_ids(), 16)
    assert r.block_keys(8) == token_block_keys(r.token_ids(), 8)


def test_trace_expansion_same_hash_same_tokens_and_tail() -> None:
    a = trace_request(
        {"timestamp": 1500, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        index=0,
        seed=0,
        speed=2.0,
    )
    b = trace_request(
        {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [7, 11]},
        index=1,
        seed=0,
    )
    c = trace_request(
        {"timestamp": 0, "input_length": 1200, "output_length": 3, "hash_ids": [7]}, index=2, seed=0
    )
    ta, tb, tc = a.token_ids(), b.token_ids(), c.token_ids()
    assert len(ta) == 1100 and len(tb) == 700 and len(tc) == 1200
    assert ta[:512] == tb[:512] == tc[:512] == list(segment_tokens(0, "hash7", 512))
    assert ta[512:1024] != tb[512:700]
    # The cut last block is the prefix of the same hash id in full.
    assert ta[1024:1100] == list(segment_tokens(0, "hash9", 512))[:76]
    # Filled tail is unique to the request.
    assert tc[512:] == list(segment_tokens(0, "req2/tail", 688))
    assert a.arrival_s == pytest.approx(0.75)


def test_trace_bad_record_names_the_field() -> None:
    with pytest.raises(ValueError, match="hash_ids"):
        trace_request({"timestamp": 0, "input_length": 5, "output_length": 1}, index=3, seed=0)


def test_shipped_trace_loads() -> None:
    reqs = load_trace(DEFAULT_TRACE, limit=50)
    assert len(reqs) == 50
    first = json.loads(DEFAULT_TRACE.read_text().splitlines()[0])
    assert reqs[0].prompt_tokens == first["input_length"]
    assert reqs[0].max_tokens == first["output_length"]


def test_oracle_hit_rate_arithmetic() -> None:
    # Block size 4. r1: 10 tokens (2 full blocks) all new. r2 shares r1's first 8 tokens:
    # 2 blocks seen; 12 tokens -> cap (12-1)//4 = 2 blocks -> 8 cached. r3 identical to r1:
    # 2 blocks seen, but cap (10-1)//4 = 2 -> 8 cached.
    base = Segment("p", 8)
    r1 = BenchRequest("r1", (base, Segment("x", 2)), 1, seed=0, arrival_s=0.0)
    r2 = BenchRequest("r2", (base, Segment("y", 4)), 1, seed=0, arrival_s=1.0)
    r3 = BenchRequest("r3", (base, Segment("x", 2)), 1, seed=0, arrival_s=2.0)
    o = oracle_hit_rate([r3, r2, r1], block_size=4)  # arrival order, not list order
    assert o.per_request == {"r1": 0, "r2": 8, "r3": 8}
    assert o.hit_rate == pytest.approx(16 / 32)
    assert cacheable_tokens(5, 16, 4) == 12
    assert cacheable_tokens(2, 17, 4) == 8


def test_poisson_arrivals_rate() -> None:
    reqs = build_workload("unique", {"requests": 2000, "prompt_tokens": 1}, seed=0)
    timed = poisson_arrivals(reqs, rate_rps=50.0, seed=0)
    assert timed[0].arrival_s == 0.0
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(timed, timed[1:], strict=False))
    assert timed[-1].arrival_s == pytest.approx(2000 / 50.0, rel=0.1)


def test_records_with_block_keys_or_token_ids() -> None:
    from bench.workloads import requests_from_records

    recs = [
        {
            "request_id": "b",
            "ts_s": 101.0,
            "block_keys": [11, 12, 13],
            "prompt_tokens": 50,
            "output_tokens": 4,
        },
        {"request_id": "a", "ts_s": 100.0, "block_keys": [11, 12], "prompt_tokens": 40},
        {"request_id": "c", "ts_s": 102.5, "prompt_token_ids": [5, 6, 7, 8, 9]},
    ]
    reqs = requests_from_records(recs, block_size=16)
    assert [r.request_id for r in reqs] == ["a", "b", "c"]
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.5]
    a, b, c = reqs
    assert (a.prompt_tokens, b.prompt_tokens, c.prompt_tokens) == (40, 50, 5)
    assert b.max_tokens == 4 and a.max_tokens == 16
    assert a.token_ids()[:32] == b.token_ids()[:32] and a.token_ids()[32:] != b.token_ids()[32:40]
    assert c.token_ids() == [5, 6, 7, 8, 9]
    assert a.block_keys(16) == b.block_keys(16)[:2]
    # b reuses a's two keyed blocks: 32 of b's 50 tokens; a and c reuse nothing.
    assert oracle_hit_rate(reqs, block_size=16).per_request == {"a": 0, "b": 32, "c": 0}
    with pytest.raises(ValueError, match="record 0.*prompt_tokens"):
        requests_from_records([{"block_keys": [1]}])
    with pytest.raises(ValueError, match="record 0"):
        requests_from_records([{"ts_s": 1.0}])
