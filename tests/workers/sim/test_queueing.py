"""Queueing emerges from the step model behind the real HTTP server (TTFT in model seconds,
read from the worker's own vllm:time_to_first_token_seconds, so wall-clock noise on a busy
machine does not decide the outcome)."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from workers.sim.fleet import start_fleet

MODEL = "sim-8b"


def mean_ttft_s(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:time_to_first_token_seconds":
            total = next(s.value for s in family.samples if s.name.endswith("_sum"))
            count = next(s.value for s in family.samples if s.name.endswith("_count"))
            return total / count
    raise AssertionError("no TTFT histogram")


async def burst(url: str, prompts: list[list[int]]) -> float:
    async with httpx.AsyncClient(timeout=30) as client:
        bodies = [{"model": MODEL, "prompt": p, "max_tokens": 4} for p in prompts]
        replies = await asyncio.gather(
            *(client.post(f"{url}/v1/completions", json=b) for b in bodies)
        )
        assert all(r.status_code == 200 for r in replies)
        return mean_ttft_s((await client.get(f"{url}/metrics")).text)


async def test_a_burst_above_capacity_queues_and_a_shared_prefix_shortens_the_queue() -> None:
    # time_scale 0.25: client-side arrival jitter (ms of wall time) stays small in model time.
    with start_fleet(3, model=MODEL, profile="dev", time_scale=0.25, kv_events=False) as fleet:
        alone_url, unique_url, shared_url = (w.url for w in fleet.workers)
        unique = [list(range(1000 + 2000 * i, 1000 + 2000 * i + 1600)) for i in range(16)]
        system = list(range(50_000, 51_552))
        shared = [system + list(range(60_000 + 100 * i, 60_000 + 100 * i + 48)) for i in range(16)]
        alone = await burst(alone_url, unique[:1])
        queued = await burst(unique_url, unique)
        prefixed = await burst(shared_url, shared)
    # One 1600-token prompt is 4 chunked-prefill steps; sixteen at once wait for each other
    # (the engine-level test pins the exact ratios in virtual time).
    assert queued > 4 * alone
    assert prefixed < queued / 2
