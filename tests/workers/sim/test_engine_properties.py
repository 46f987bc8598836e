"""Invariants of the engine under random traffic (hypothesis)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.events import BlockRemoved, BlockStored
from workers.sim.engine import Engine
from workers.sim.profiles import DEV

PROFILE = replace(
    DEV, block_size=4, num_blocks=24, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=64
)

request = st.tuples(
    st.integers(0, 3),  # which shared prefix
    st.integers(0, 12),  # shared prefix length
    st.lists(st.integers(0, 50), min_size=1, max_size=20),  # own suffix
    st.integers(1, 12),  # max_tokens
    st.floats(0, 0.05),  # inter-arrival (model s)
    st.booleans(),  # abort it after a few steps
)


@settings(max_examples=60, deadline=None)
@given(st.lists(request, min_size=1, max_size=25))
def test_blocks_events_and_accounting_stay_consistent(
    reqs: list[tuple[int, int, list[int], int, float, bool]],
) -> None:
    engine = Engine(profile=PROFILE, eos_range=None)
    prefixes = [[100 * p + i for i in range(12)] for p in range(4)]
    live = Counter[int]()  # copies per engine hash, as a subscriber would count them
    t = 0.0
    arrival = 0.0
    to_abort: dict[str, int] = {}
    finished: dict[str, int] = {}
    prompts: dict[str, int] = {}
    for i, (p, n_shared, suffix, max_tokens, gap, abort) in enumerate(reqs):
        arrival += gap
        tokens = prefixes[p][:n_shared] + suffix
        engine.add_request(
            request_id=f"r{i}", prompt_token_ids=tokens, max_tokens=max_tokens, arrival_s=arrival
        )
        prompts[f"r{i}"] = len(tokens)
        if abort:
            to_abort[f"r{i}"] = 2
    steps = 0
    while engine.has_work():
        nxt = engine.next_step_time_s(now_s=t)
        assert nxt is not None
        r = engine.step(now_s=nxt)
        t = r.end_s
        steps += 1
        assert steps < 5000, "engine stopped making progress"
        for op in r.events:
            if isinstance(op, BlockStored):
                assert len(op.token_ids) == len(op.engine_hashes) * PROFILE.block_size
                live.update(op.engine_hashes)
            else:
                assert isinstance(op, BlockRemoved)
                (h,) = op.engine_hashes
                assert live[h] > 0, "removed a block that was never stored"
                live[h] -= 1
        assert r.prefill_tokens <= PROFILE.max_num_batched_tokens
        s = engine.stats()
        assert s.running <= PROFILE.max_num_seqs
        assert 0 <= s.free_blocks <= s.usable_blocks
        assert {h for h, c in live.items() if c > 0} == set(engine._cached)  # noqa: SLF001
        for done in r.finished:
            finished[done.request_id] = done.output_tokens
            assert done.cached_tokens % PROFILE.block_size == 0
            assert done.cached_tokens <= prompts[done.request_id] - 1
            assert done.ttft_s is not None and done.ttft_s > 0 and done.queue_s >= 0
        for rid in list(to_abort):
            to_abort[rid] -= 1
            if to_abort[rid] == 0:
                engine.abort_request(rid)
                del to_abort[rid]
    assert engine.stats().free_blocks == engine.stats().usable_blocks
    for i, (_, _, _, max_tokens, _, abort) in enumerate(reqs):
        if not abort:
            assert finished[f"r{i}"] == max_tokens
