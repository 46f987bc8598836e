from __future__ import annotations

import pytest

from bench.loadgen import Target, discover_model, run_load
from bench.report import summarize
from bench.workloads import build_workload, with_arrivals
from workers.sim.fleet import start_fleet


@pytest.fixture(scope="module")
def worker():
    with start_fleet(1, profile="dev", time_scale=0.05, kv_events=False) as fleet:
        yield fleet.workers[0]


async def test_closed_loop_against_a_real_simulated_worker(worker) -> None:
    model = await discover_model(worker.url)
    assert model == worker.model
    reqs = build_workload(
        "tenants",
        {
            "tenants": 2,
            "prefix_tokens": 96,
            "users": 2,
            "questions_per_user": 2,
            "question_tokens": 20,
            "output_tokens": 5,
        },
        seed=3,
    )
    results, wall_s = await run_load(
        reqs, target=Target(base_url=worker.url, model=model), concurrency=2
    )
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert all(r.output_tokens == 5 and r.prompt_tokens == 116 for r in results)
    assert all(0 < r.ttft_ms <= r.e2e_ms for r in results)
    assert all(len(r.itl_ms) == 4 for r in results)
    # Concurrency 2 on one worker: the second request of a tenant may race the first,
    # but most repeats of a 96-token prefix (6 blocks of 16) hit the cache.
    s = summarize(results, label="x")
    assert 0.2 < s.hit_rate <= 6 * 16 * 6 / (116 * 8)
    assert wall_s > 0


async def test_open_loop_time_scale_and_errors(worker) -> None:
    reqs = with_arrivals(
        build_workload("unique", {"requests": 4, "prompt_tokens": 40, "output_tokens": 3}, seed=0),
        rate_rps=20.0,
        seed=0,
    )
    results, _ = await run_load(
        reqs, target=Target(base_url=worker.url, model=worker.model), time_scale=0.05
    )
    assert all(r.ok and r.cached_tokens == 0 for r in results)
    # Model-time TTFT of a 40-token prefill on the dev profile is a few ms; the measured wall
    # time divided by the scale must be in that range, not 20x it.
    assert all(r.ttft_ms > 1.0 for r in results)
    bad, _ = await run_load(
        reqs[:1], target=Target(base_url=worker.url, model="no-such-model"), concurrency=1
    )
    assert not bad[0].ok and "HTTP 4" in (bad[0].error or "")


def test_text_prompt_keeps_one_token_per_token_id() -> None:
    from bench.loadgen import prompt_text
    from routing.core.tokenizer import builtin_encode

    a, b = build_workload(
        "tenants",
        {
            "tenants": 1,
            "prefix_tokens": 64,
            "users": 2,
            "questions_per_user": 1,
            "question_tokens": 16,
        },
        seed=0,
    )
    ea, eb = builtin_encode(prompt_text(a)), builtin_encode(prompt_text(b))
    assert len(ea) == a.prompt_tokens == 80
    assert ea[:64] == eb[:64] and ea[64:] != eb[64:]
