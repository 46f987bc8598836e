"""Evictions end to end: a small simulated engine evicts KV blocks, the gateway counts the
BlockRemoved events it applies, and scrape_fleet turns the count into an eviction rate."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from controlplane.telemetry import selectors, tasks
from tests.gateway.conftest import chat_body, fleet_factory, gateway_factory, post  # noqa: F401


def blocks_removed(gw_url: str) -> dict[str, float]:
    text = httpx.get(gw_url + "/gateway/metrics", timeout=5).text
    return dict(tasks.gateway_view_from_metrics(text).blocks_removed)


@pytest.mark.django_db
def test_evictions_reach_fleet_samples(fleet_factory: Any, gateway_factory: Any) -> None:  # noqa: F811
    fleet = fleet_factory(1, num_blocks=48)
    gw = gateway_factory(fleet.snapshot())
    target = [("sim-0", fleet.urls[0])]
    gw_metrics = gw.url + "/gateway/metrics"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "sim-0" not in blocks_removed(gw.url):
        time.sleep(0.05)  # the gateway's subscriber for sim-0 is up: its count starts at 0
    tasks.scrape_fleet_run(targets=target, now_s=time.time(), gateway_metrics_url=gw_metrics)

    # Distinct long prompts: each fills most of the 48 blocks, so the next evicts them.
    for i in range(6):
        text = " ".join(f"document {i} paragraph {j} says something new." for j in range(60))
        resp = post(gw.url, "/v1/chat/completions", chat_body(text))
        assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not blocks_removed(gw.url).get("sim-0"):
        time.sleep(0.1)
    removed = blocks_removed(gw.url)["sim-0"]
    assert removed > 0

    samples = tasks.scrape_fleet_run(
        targets=target, now_s=time.time() + 1.0, gateway_metrics_url=gw_metrics
    )
    (s,) = samples
    assert s.evictions_total == removed and s.evictions_delta == removed
    assert s.events_state in ("live", "waiting")
    assert selectors.fleet_point(s)["evictions_per_s"] > 0
