from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from controlplane.telemetry import services, tasks
from controlplane.telemetry.sources import MemorySinkSource
from routing.gateway.records import MemorySink
from tests.controlplane.conftest import client_with
from tests.controlplane.telemetry.test_drain import make_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader_client(make_token: Callable[..., str]) -> APIClient:
    return client_with(make_token("read"))


def _drain(records: list[dict]) -> None:
    sink = MemorySink()
    sink.append_many(records)
    services.request_stream_drain(source=MemorySinkSource(sink, name="m"))


def test_reads_need_a_token(anon: APIClient) -> None:
    assert anon.get("/api/telemetry/overview/").status_code == 401
    assert anon.get("/api/telemetry/requests/").status_code == 401


def test_requests_list_filters_and_validates(reader_client: APIClient) -> None:
    import time

    now = time.time()
    _drain([make_record(i, ts_s=now - 60 + i, block_keys=[1, 2, 3]) for i in range(12)])
    body = reader_client.get("/api/telemetry/requests/?limit=5").json()
    assert [r["request_id"] for r in body["results"]] == [f"req-{i}" for i in (11, 10, 9, 8, 7)]
    assert "block_keys" not in body["results"][0]
    only = reader_client.get("/api/telemetry/requests/?worker=sim-1").json()["results"]
    assert only and all(r["worker_id"] == "sim-1" for r in only)
    bad = reader_client.get("/api/telemetry/requests/?limit=0")
    assert bad.status_code == 400 and "limit" in bad.json()
    assert "status" in reader_client.get("/api/telemetry/requests/?status=weird").json()
    detail = reader_client.get("/api/telemetry/requests/req-3/").json()
    assert detail["block_keys"] == [1, 2, 3] and detail["candidates"][0]["worker"] == "sim-0"
    assert reader_client.get("/api/telemetry/requests/nope/").status_code == 404

    over = reader_client.get("/api/telemetry/overview/?window_s=600").json()
    assert over["granularity"] == "10s" and sum(p["requests"] for p in over["points"]) == 12
    assert reader_client.get("/api/telemetry/overview/?window_s=5").status_code == 400
    series = reader_client.get("/api/telemetry/workers/sim-0/series/").json()
    assert sum(p["requests"] for p in series["points"]) == 6


def test_experiment_results_endpoint(reader_client: APIClient) -> None:
    assert reader_client.get("/api/telemetry/experiments/7/results/").status_code == 404
    _drain(
        [
            make_record(i, experiment_id=7, arm="A" if i % 2 else "B", ttft_ms=100.0 + i)
            for i in range(80)
        ]
    )
    tasks.experiment_results_compute(experiment_id=7, arms=[("A", 1), ("B", 2)])
    body = reader_client.get("/api/telemetry/experiments/7/results/").json()
    assert [a["name"] for a in body["arms"]] == ["A", "B"]
    assert body["arms"][0]["n"] == 40 and "verdict" in body and "computed_at" in body
