from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from controlplane.telemetry import rollups, selectors, services, tasks
from controlplane.telemetry.models import RequestRecord, Rollup, StreamCursor
from controlplane.telemetry.sources import MemorySinkSource, RedisStreamSource
from routing.gateway.records import MemorySink

T0 = 1_800_000_000.0  # a minute boundary: 1_800_000_000 % 60 == 0


def make_record(i: int, **overrides: Any) -> dict[str, Any]:
    rec = {
        "request_id": f"req-{i}",
        "ts_s": T0 + i,
        "model": "sim-8b",
        "tenant": "t1",
        "session_key": f"s{i % 3}",
        "worker_id": f"sim-{i % 2}",
        "policy": "kv-default",
        "policy_version_id": 3,
        "policy_type": "kv_score",
        "experiment_id": None,
        "arm": None,
        "shadow": None,
        "prompt_tokens": 1000,
        "predicted_cached_tokens": 800,
        "actual_cached_tokens": 640,
        "ttft_ms": 100.0 + i,
        "e2e_ms": 1000.0 + i,
        "output_tokens": 20,
        "status": "ok",
        "http_status": 200,
        "retries": 0,
        "routing_overhead_us": 42.0,
        "stream": True,
        "candidates": [
            {"worker": "sim-0", "score": 1.0, "cached_blocks": 50, "terms": {"cache": 1.0}}
        ],
        "reason": "longest cached prefix",
    }
    rec.update(overrides)
    return rec


def test_rollup_arithmetic_on_known_records() -> None:
    recs = [rollups.normalize_record(make_record(i, worker_id="w")) for i in range(10)]
    recs.append(
        rollups.normalize_record(
            make_record(
                10,
                worker_id="w",
                status="error",
                ttft_ms=None,
                actual_cached_tokens=None,
                retries=2,
            )
        )
    )
    ((key, acc),) = rollups.accumulate(recs).items()
    assert key.bucket_start_s == T0 and key.worker_id == "w" and key.policy_version_id == 3
    assert acc["requests"] == 11 and acc["errors"] == 1 and acc["retries"] == 2
    assert acc["cached_known_requests"] == 10
    assert acc["prediction_abs_error_tokens"] == 10 * 160
    s = rollups.summarize(acc, duration_s=60.0)
    assert s["hit_rate_actual"] == pytest.approx(0.64)
    assert s["prediction_error_frac"] == pytest.approx(0.16)
    assert s["rps"] == pytest.approx(11 / 60)
    assert s["ttft_mean_ms"] == pytest.approx(104.5)
    assert s["ttft_p50_ms"] == pytest.approx(104.0, rel=0.023)
    assert s["ttft_p99_ms"] == pytest.approx(109.0, rel=0.023)
    assert s["error_rate"] == pytest.approx(1 / 11)


def test_malformed_records_are_rejected_with_the_field() -> None:
    with pytest.raises(rollups.MalformedRecord, match="ts_s"):
        rollups.normalize_record({"request_id": "x", "model": "m"})
    with pytest.raises(rollups.MalformedRecord, match="ttft_ms"):
        rollups.normalize_record(make_record(1, ttft_ms="fast"))
    with pytest.raises(rollups.MalformedRecord, match="block_keys"):
        rollups.normalize_record(make_record(1, block_keys=[1, True]))
    assert rollups.normalize_record(make_record(1, block_keys=[1, 2]))["block_keys"] == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_drain_is_idempotent_and_sampled_records_stay_stable() -> None:
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(150)])
    source = MemorySinkSource(sink, name="memory:test")
    first = services.request_stream_drain(source=source, sample_rate=1.0, batch_size=40)
    assert first.entries == 150 and first.records_stored == 150 and first.malformed == 0
    again = services.request_stream_drain(source=source, sample_rate=1.0, batch_size=40)
    assert again.entries == 0
    assert RequestRecord.objects.count() == 150
    totals = services.rollups_merged(list(Rollup.objects.filter(granularity="minute")))
    assert totals["requests"] == 150
    # 150 s from a minute boundary: three minutes, two workers each.
    assert Rollup.objects.filter(granularity="minute").count() == 6
    assert Rollup.objects.filter(granularity="10s").count() == 30  # 15 buckets x 2 workers
    assert StreamCursor.objects.get(name="memory:test").last_id == "150"

    # New entries continue from the cursor; a reset cursor would double count, so the
    # rollups prove the cursor is honoured.
    sink.append_many([make_record(i) for i in range(150, 160)])
    services.request_stream_drain(source=source, sample_rate=1.0)
    assert (
        services.rollups_merged(list(Rollup.objects.filter(granularity="minute")))["requests"]
        == 160
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_drains_never_double_count() -> None:
    from django.db import connection

    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip(
            "in-memory shared-cache SQLite fails lock waits at once; runs on Postgres/file DBs"
        )
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(400)])
    source = MemorySinkSource(sink, name="memory:race")
    errors: list[BaseException] = []

    def run() -> None:
        from django.db import connection

        try:
            services.request_stream_drain(source=source, sample_rate=1.0, batch_size=50)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert (
        services.rollups_merged(list(Rollup.objects.filter(granularity="minute")))["requests"]
        == 400
    )
    assert RequestRecord.objects.count() == 400


@pytest.mark.django_db
def test_sampling_keeps_a_fraction_but_rollups_count_everything() -> None:
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(1000)])
    result = services.request_stream_drain(
        source=MemorySinkSource(sink, name="m"), sample_rate=0.1, batch_size=1000
    )
    assert 50 < result.records_stored < 150
    assert RequestRecord.objects.count() == result.records_stored
    assert (
        services.rollups_merged(list(Rollup.objects.filter(granularity="minute")))["requests"]
        == 1000
    )


@pytest.mark.django_db
def test_malformed_entries_are_skipped_and_the_cursor_moves_on() -> None:
    sink = MemorySink()
    sink.append_many([make_record(0), {"request_id": "bad"}, "not a dict", make_record(1)])  # type: ignore[list-item]
    result = services.request_stream_drain(source=MemorySinkSource(sink, name="m"))
    assert result.entries == 4 and result.malformed == 2 and result.records_stored == 2


@pytest.mark.django_db
def test_drain_publishes_the_touched_live_buckets() -> None:
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(90)])
    sent: list[dict] = []
    services.request_stream_drain(source=MemorySinkSource(sink, name="m"), publish=sent.append)
    (msg,) = sent
    assert msg["type"] == "dashboard.update" and msg["kind"] == "overview"
    assert msg["granularity"] == "10s"
    assert [p["requests"] for p in msg["points"]] == [10] * 9
    assert msg["points"][1]["t"] == "2027-01-15T08:00:10Z"
    json.dumps(msg)  # must survive the channel layer


@pytest.mark.django_db(transaction=True)
def test_redis_stream_source_end_to_end(redis_url: str) -> None:
    writer = RedisStreamSource(url=redis_url)
    ids = [writer.append(make_record(i)) for i in range(25)]
    source = RedisStreamSource(url=redis_url)
    result = services.request_stream_drain(source=source, batch_size=10)
    assert result.entries == 25 and result.last_id == ids[-1]
    assert services.request_stream_drain(source=source).entries == 0
    writer.append(make_record(99))
    assert services.request_stream_drain(source=source).entries == 1
    assert RequestRecord.objects.count() == 26
    writer.close()
    source.close()


@pytest.mark.django_db
def test_overview_snapshot_shape() -> None:
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(120)])
    services.request_stream_drain(source=MemorySinkSource(sink, name="m"))
    snap = selectors.overview_snapshot(window_s=7200, now_s=T0 + 180)
    assert snap["granularity"] == "minute"
    assert [p["requests"] for p in snap["points"]] == [60, 60]
    live = selectors.overview_snapshot(window_s=600, now_s=T0 + 180)
    assert live["granularity"] == "10s" and len(live["points"]) == 12
    assert live["points"][0]["rps"] == pytest.approx(1.0)
    p = snap["points"][0]
    assert p["rps"] == pytest.approx(1.0)
    assert p["hit_rate_actual"] == pytest.approx(0.64)
    assert p["hit_rate_predicted"] == pytest.approx(0.8)
    assert p["t"].endswith("Z")


@pytest.mark.django_db
def test_retention_folds_minutes_into_hours_without_losing_counts() -> None:
    sink = MemorySink()
    # Two hours of traffic, one request every 30 s.
    sink.append_many([make_record(i, ts_s=T0 + 30 * i, request_id=f"r{i}") for i in range(240)])
    services.request_stream_drain(source=MemorySinkSource(sink, name="m"), batch_size=1000)
    before = services.rollups_merged(list(Rollup.objects.exclude(granularity="10s")))
    now_s = T0 + 3 * 3600
    r1 = services.retention_apply(
        now_s=now_s,
        records_max_age_s=2.5 * 3600,
        minute_rollups_max_age_s=3600,
        hour_rollups_max_age_s=10 * 86400,
        fleet_max_age_s=3600,
    )
    assert r1.minute_rollups_compacted > 0
    assert not Rollup.objects.filter(
        granularity=Rollup.MINUTE, bucket_start__lt=services.dt_from_s(T0 + 7200)
    ).exists()
    after = services.rollups_merged(list(Rollup.objects.exclude(granularity="10s")))
    assert after == before  # counters and histograms identical after folding
    # Records older than 2.5 h are gone: those of the first half hour.
    assert RequestRecord.objects.count() == 240 - 60
    r2 = services.retention_apply(
        now_s=now_s,
        records_max_age_s=2.5 * 3600,
        minute_rollups_max_age_s=3600,
        hour_rollups_max_age_s=10 * 86400,
        fleet_max_age_s=3600,
    )
    assert r2.minute_rollups_compacted == 0 and r2.records_deleted == 0
    # 10 s rows older than their (default 2 h) age are gone; their data lives on in minutes.
    assert not Rollup.objects.filter(
        granularity="10s", bucket_start__lt=services.dt_from_s(now_s - 7200)
    ).exists()
    assert Rollup.objects.filter(granularity="10s").exists()
    assert services.rollups_merged(list(Rollup.objects.exclude(granularity="10s"))) == before


@pytest.mark.django_db
def test_drain_task_without_a_source_is_a_no_op(settings: Any) -> None:
    settings.REDIS_URL = ""
    assert tasks.drain_request_stream_run() is None
