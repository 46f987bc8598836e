"""The engine's vLLM rules, one by one, in virtual time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from routing.core.events import BlockRemoved, BlockStored
from routing.core.tokenizer import EOS_ID
from workers.sim.engine import Engine, FinishedRequest, RequestRejected, StepResult
from workers.sim.profiles import DEV, H100_8B

SMALL = replace(DEV, block_size=16, num_blocks=9, max_num_batched_tokens=4096, max_model_len=4096)


def make_engine(**overrides: object) -> Engine:
    kwargs: dict[str, object] = {"profile": SMALL, "eos_range": None}
    kwargs.update(overrides)
    return Engine(**kwargs)  # type: ignore[arg-type]


def prompt(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def run(engine: Engine, now_s: float = 0.0) -> tuple[list[StepResult], dict[str, FinishedRequest]]:
    results: list[StepResult] = []
    done: dict[str, FinishedRequest] = {}
    while engine.has_work():
        r = engine.step(now_s=now_s)
        now_s = r.end_s
        results.append(r)
        done.update({f.request_id: f for f in r.finished})
    return results, done


def events(results: list[StepResult]) -> list[object]:
    return [op for r in results for op in r.events]


def test_repeated_640_token_prompt_reports_624_cached() -> None:
    engine = make_engine(profile=DEV)
    engine.add_request(request_id="a", prompt_token_ids=prompt(640), max_tokens=1, arrival_s=0)
    run(engine)
    engine.add_request(request_id="b", prompt_token_ids=prompt(640), max_tokens=1, arrival_s=1)
    _, done = run(engine, 1.0)
    assert done["b"].cached_tokens == 624
    assert engine.cached_prefix_tokens(prompt(640)) == 624
    assert engine.cached_prefix_tokens(prompt(641)) == 640


def test_only_full_blocks_are_stored_and_chained_on_the_parent() -> None:
    engine = make_engine()
    engine.add_request(request_id="a", prompt_token_ids=prompt(40), max_tokens=1, arrival_s=0)
    results, _ = run(engine)
    (stored,) = events(results)
    assert isinstance(stored, BlockStored)
    assert len(stored.engine_hashes) == 2 and stored.parent_engine_hash is None
    assert list(stored.token_ids) == prompt(32)
    engine.add_request(request_id="b", prompt_token_ids=prompt(60), max_tokens=1, arrival_s=1)
    results, done = run(engine, 1.0)
    (ext,) = events(results)
    assert isinstance(ext, BlockStored)
    assert ext.parent_engine_hash == stored.engine_hashes[-1]
    assert list(ext.token_ids) == prompt(60)[32:48]
    assert done["b"].cached_tokens == 32


def test_null_block_is_reserved() -> None:
    engine = make_engine()
    assert engine.stats().usable_blocks == 8 and engine.stats().free_blocks == 8
    with pytest.raises(RequestRejected) as err:
        engine.add_request(request_id="a", prompt_token_ids=prompt(130), max_tokens=1, arrival_s=0)
    assert err.value.field == "max_tokens"
    engine.add_request(request_id="b", prompt_token_ids=prompt(127), max_tokens=1, arrival_s=0)
    _, done = run(engine)
    assert done["b"].finish_reason == "length"


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first() -> None:
    engine = make_engine()
    a = prompt(64, 1000)  # 4 full blocks, all stored, 4 blocks held
    engine.add_request(request_id="a", prompt_token_ids=a, max_tokens=1, arrival_s=0)
    (stored_a,) = events(run(engine)[0])
    assert isinstance(stored_a, BlockStored)
    assert engine.stats().free_blocks == 8  # freed, still cached:
    assert engine.cached_prefix_tokens(a + [1]) == 64
    # 5 new blocks: 4 never-used blocks first, then the LRU cached one: a's *tail* block.
    engine.add_request(request_id="b", prompt_token_ids=prompt(80, 5000), max_tokens=1, arrival_s=1)
    ops = events(run(engine, 1.0)[0])
    assert isinstance(ops[0], BlockRemoved) and isinstance(ops[-1], BlockStored)
    removed = [op.engine_hashes for op in ops if isinstance(op, BlockRemoved)]
    assert removed == [(stored_a.engine_hashes[3],)]
    assert engine.cached_prefix_tokens(a + [1]) == 48  # the prefix survives


def test_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue() -> None:
    engine = make_engine()
    a = prompt(64, 1000)
    engine.add_request(request_id="a", prompt_token_ids=a, max_tokens=1, arrival_s=0)
    run(engine)
    # b takes 3 cached blocks out of the free queue and 1 new one (4 left); c needs 5:
    # the hit blocks must not be handed to c, so c waits for b.
    engine.add_request(request_id="b", prompt_token_ids=a, max_tokens=3, arrival_s=1)
    engine.add_request(request_id="c", prompt_token_ids=prompt(80, 7000), max_tokens=1, arrival_s=1)
    first = engine.step(now_s=1.0)
    assert [t.request_id for t in first.tokens] == ["b"]
    assert not any(isinstance(op, BlockRemoved) for op in first.events)
    assert engine.stats().free_blocks == 4 and engine.stats().waiting == 1


def test_hit_arithmetic_duplicate_copy_of_recomputed_last_block() -> None:
    engine = make_engine()
    a = prompt(32)
    engine.add_request(request_id="a", prompt_token_ids=a, max_tokens=1, arrival_s=0)
    (first,) = events(run(engine)[0])
    engine.add_request(request_id="b", prompt_token_ids=a, max_tokens=1, arrival_s=1)
    results, done = run(engine, 1.0)
    assert done["b"].cached_tokens == 16
    (again,) = events(results)
    assert isinstance(first, BlockStored) and isinstance(again, BlockStored)
    assert again.engine_hashes == first.engine_hashes[1:]
    assert again.parent_engine_hash == first.engine_hashes[0]


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = make_engine(profile=DEV, max_num_batched_tokens=256)
    engine.add_request(request_id="a", prompt_token_ids=prompt(600), max_tokens=2, arrival_s=0)
    results, done = run(engine)
    assert [r.prefill_tokens for r in results] == [256, 256, 88, 0]
    assert [len(r.tokens) for r in results] == [0, 0, 1, 1]
    assert done["a"].ttft_s == pytest.approx(sum(r.duration_s for r in results[:3]))


def test_step_time_model() -> None:
    engine = make_engine(profile=H100_8B)
    engine.add_request(request_id="a", prompt_token_ids=prompt(1000), max_tokens=3, arrival_s=0)
    engine.add_request(
        request_id="b", prompt_token_ids=prompt(500, 9000), max_tokens=3, arrival_s=0
    )
    results, _ = run(engine)
    assert results[0].duration_s == pytest.approx((6.5 + 0.06 * 1500) / 1000)
    assert results[1].decode_seqs == 2
    assert results[1].duration_s == pytest.approx((6.5 + 0.08 * 2) / 1000)


def test_max_num_seqs_caps_the_running_batch() -> None:
    engine = make_engine(profile=DEV, max_num_seqs=2)
    for i in range(5):
        engine.add_request(
            request_id=f"r{i}", prompt_token_ids=prompt(20, 100 * i), max_tokens=4, arrival_s=0
        )
    first = engine.step(now_s=0.0)
    assert engine.stats().running == 2 and engine.stats().waiting == 3
    assert {t.request_id for t in first.tokens} == {"r0", "r1"}
    _, done = run(engine, first.end_s)
    assert done["r4"].queue_s > done["r2"].queue_s > 0


def test_preemption_recomputes_when_blocks_run_out_mid_decode() -> None:
    engine = make_engine()  # 8 usable blocks of 16
    engine.add_request(
        request_id="a",
        prompt_token_ids=prompt(60, 1000),
        max_tokens=60,
        arrival_s=0,
        ignore_eos=True,
    )
    engine.add_request(
        request_id="b",
        prompt_token_ids=prompt(60, 3000),
        max_tokens=60,
        arrival_s=0,
        ignore_eos=True,
    )
    results, done = run(engine)
    assert any(r.preempted == ("b",) for r in results)
    assert done["b"].preemptions >= 1 and done["a"].preemptions == 0
    assert engine.stats().preemptions == done["b"].preemptions
    assert done["a"].output_tokens == done["b"].output_tokens == 60
    assert engine.stats().free_blocks == 8


def test_output_is_deterministic_and_honours_max_tokens_and_eos() -> None:
    def outputs(ignore_eos: bool, max_tokens: int) -> list[int]:
        engine = make_engine(profile=DEV, eos_range=(5, 5))
        engine.add_request(
            request_id="a",
            prompt_token_ids=prompt(20),
            max_tokens=max_tokens,
            arrival_s=0,
            ignore_eos=ignore_eos,
        )
        results, _ = run(engine)
        return [t.token_id for r in results for t in r.tokens]

    assert outputs(False, 50) == outputs(False, 50)
    assert len(outputs(False, 50)) == 5 and outputs(False, 50)[-1] == EOS_ID
    assert len(outputs(True, 50)) == 50 and EOS_ID not in outputs(True, 50)
    assert len(outputs(False, 3)) == 3


def test_abort_frees_blocks_immediately() -> None:
    engine = make_engine()
    engine.add_request(request_id="a", prompt_token_ids=prompt(60), max_tokens=30, arrival_s=0)
    engine.step(now_s=0.0)
    assert engine.stats().free_blocks == 4
    assert engine.abort_request("a") and not engine.abort_request("a")
    assert engine.stats().free_blocks == 8 and not engine.has_work()


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "field"),
    [([], 1, "prompt"), ([1] * 5000, 1, "prompt"), ([1, 2], 0, "max_tokens")],
)
def test_impossible_requests_are_rejected(tokens: list[int], max_tokens: int, field: str) -> None:
    with pytest.raises(RequestRejected) as err:
        make_engine().add_request(
            request_id="x", prompt_token_ids=tokens, max_tokens=max_tokens, arrival_s=0
        )
    assert err.value.field == field


def test_queueing_emerges_and_a_shared_prefix_lowers_ttft() -> None:
    def mean_ttft(rate_per_s: float, shared: bool, n: int = 60) -> float:
        engine = Engine(profile=H100_8B, eos_range=None)
        pending = [(i / rate_per_s, i) for i in range(n)]
        done: dict[str, FinishedRequest] = {}
        t = 0.0
        while pending or engine.has_work():
            while pending and pending[0][0] <= t:
                arrival, i = pending.pop(0)
                body = prompt(2048, 50_000) if shared else prompt(2048, 100_000 + 4096 * i)
                engine.add_request(
                    request_id=f"r{i}",
                    prompt_token_ids=body + prompt(64, 10 * i),
                    max_tokens=32,
                    arrival_s=arrival,
                )
            if not engine.has_work():
                t = pending[0][0]
                continue
            r = engine.step(now_s=t)
            t = r.end_s
            done.update({f.request_id: f for f in r.finished})
        ttfts = [d.ttft_s for d in done.values() if d.ttft_s is not None]
        return sum(ttfts) / len(ttfts)

    light, heavy = mean_ttft(2.0, False), mean_ttft(40.0, False)
    assert heavy > 3 * light  # above capacity (~8 req/s of 2k-token prefill) TTFT grows
    assert mean_ttft(40.0, True) < heavy / 3


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use() -> None:
    engine = make_engine()
    engine.add_request(request_id="a", prompt_token_ids=prompt(40), max_tokens=5, arrival_s=0)
    engine.step(now_s=0.0)
    assert not engine.reset_prefix_cache()
    run(engine)
    assert engine.cached_prefix_tokens(prompt(40)) == 32
    assert engine.reset_prefix_cache()
    assert engine.cached_prefix_tokens(prompt(40)) == 0
