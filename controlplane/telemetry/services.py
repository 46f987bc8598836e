"""Telemetry writes: drain the request stream into records and rollups, store fleet
samples, compact and expire old rows. Every function here is safe to run twice."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.telemetry import rollups
from controlplane.telemetry.models import FleetSample, RequestRecord, Rollup, StreamCursor
from controlplane.telemetry.sources import RecordSource

logger = logging.getLogger(__name__)

Publisher = Callable[[dict[str, Any]], None]


def dt_from_s(ts_s: float) -> datetime:
    return datetime.fromtimestamp(ts_s, tz=UTC)


def sampled(request_id: str, *, rate: float) -> bool:
    """Deterministic per-request sampling, so a re-drain keeps the same records."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    return (zlib.crc32(request_id.encode()) & 0xFFFFFFFF) / 2**32 < rate


@dataclass(frozen=True, slots=True)
class DrainResult:
    entries: int
    records_stored: int
    malformed: int
    rollups_touched: int
    last_id: str
    bucket_starts_s: tuple[int, ...]


def _lock_cursor(name: str) -> StreamCursor:
    # Write before any read: the UPDATE takes the write lock first (SQLite then serialises
    # writers with its busy timeout instead of failing a read-to-write upgrade; Postgres
    # locks the row), so two concurrent drains never read from the same cursor.
    if not StreamCursor.objects.filter(name=name).update(updated_at=timezone.now()):
        try:
            with transaction.atomic():
                StreamCursor.objects.create(name=name)
        except IntegrityError:
            pass  # created by a concurrent drain; the row lock below orders us after it
    return StreamCursor.objects.select_for_update().get(name=name)


def _apply_rollups(
    deltas: Mapping[rollups.RollupKey, Mapping[str, Any]], *, granularity: str
) -> None:
    for key, delta in deltas.items():
        row, _ = Rollup.objects.select_for_update().get_or_create(
            granularity=granularity,
            bucket_start=dt_from_s(key.bucket_start_s),
            model=key.model,
            worker_id=key.worker_id,
            policy_version_id=key.policy_version_id,
            experiment_id=key.experiment_id,
            arm=key.arm,
        )
        merged = rollups.merge_counters(
            {f: getattr(row, f) for f in (*rollups.COUNTER_FIELDS, *rollups.HIST_FIELDS)}, delta
        )
        for f, v in merged.items():
            setattr(row, f, v)
        row.save()


def records_store(records: Iterable[Mapping[str, Any]], *, sample_rate: float) -> int:
    """Insert the sampled subset of normalised records; duplicates are ignored."""
    rows = [
        RequestRecord(
            ts=dt_from_s(r["ts_s"]),
            **{k: v for k, v in r.items() if k != "ts_s"},
        )
        for r in records
        if sampled(r["request_id"], rate=sample_rate)
    ]
    RequestRecord.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def request_stream_drain(
    *,
    source: RecordSource,
    sample_rate: float = 1.0,
    batch_size: int = 1000,
    max_batches: int = 50,
    publish: Publisher | None = None,
) -> DrainResult:
    """Move new request records from `source` into RequestRecord (sampled) and minute
    Rollups; the cursor advances in the same transaction, so a crash or a second run
    never counts an entry twice. Malformed entries are skipped (and counted)."""
    total = stored = malformed = 0
    touched: set[rollups.RollupKey] = set()
    last_id = ""
    for _ in range(max_batches):
        with transaction.atomic():
            cursor = _lock_cursor(source.name)
            entries = source.read_after(cursor.last_id, count=batch_size)
            if not entries:
                last_id = cursor.last_id
                break
            good: list[dict[str, Any]] = []
            for entry_id, raw in entries:
                try:
                    good.append(rollups.normalize_record(raw))
                except rollups.MalformedRecord as exc:
                    malformed += 1
                    logger.warning("skipping malformed request record %s: %s", entry_id, exc)
            deltas = rollups.accumulate(good)
            _apply_rollups(deltas, granularity=Rollup.MINUTE)
            live = rollups.accumulate(good, width_s=rollups.TEN_S)
            _apply_rollups(live, granularity=Rollup.TEN_S)
            stored += records_store(good, sample_rate=sample_rate)
            cursor.last_id = last_id = entries[-1][0]
            cursor.save(update_fields=["last_id", "updated_at"])
        total += len(entries)
        touched.update(live)
        if len(entries) < batch_size:
            break
    buckets = tuple(sorted({k.bucket_start_s for k in touched}))
    if publish is not None and buckets:
        from controlplane.telemetry import selectors

        try:
            publish(selectors.overview_update(bucket_starts_s=buckets, granularity=Rollup.TEN_S))
        except Exception:  # the push is best effort; the rows are already committed
            logger.exception("could not push the overview update to the dashboard")
    return DrainResult(
        entries=total,
        records_stored=stored,
        malformed=malformed,
        rollups_touched=len(touched),
        last_id=last_id,
        bucket_starts_s=buckets,
    )


# --- fleet ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    """Load and cache signals parsed from one worker's /metrics (counters cumulative)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage_frac: float = 0.0
    prefix_hits_total: float = 0.0
    prefix_queries_total: float = 0.0
    preemptions_total: float = 0.0


def _delta(current: float, previous: float | None) -> float:
    if previous is None:
        return 0.0
    # A counter that went down was reset (engine restart): count from zero.
    return current - previous if current >= previous else current


def fleet_sample_record(
    *,
    worker_id: str,
    now_s: float,
    metrics: WorkerMetrics | None,
    error: str = "",
    evictions_total: float | None = None,
    events_state: str = "",
) -> FleetSample:
    """Store one scrape of one worker, with counter deltas against its previous sample."""
    prev = FleetSample.objects.filter(worker_id=worker_id, ok=True).order_by("-ts").first()
    ts = dt_from_s(now_s)
    if metrics is None:
        return FleetSample.objects.create(
            worker_id=worker_id, ts=ts, ok=False, error=error[:300], events_state=events_state
        )
    prev_evict = prev.evictions_total if prev is not None else None
    return FleetSample.objects.create(
        worker_id=worker_id,
        ts=ts,
        ok=True,
        running=metrics.running,
        waiting=metrics.waiting,
        kv_usage_frac=metrics.kv_usage_frac,
        prefix_hits_total=metrics.prefix_hits_total,
        prefix_queries_total=metrics.prefix_queries_total,
        preemptions_total=metrics.preemptions_total,
        evictions_total=evictions_total,
        events_state=events_state[:16],
        prefix_hits_delta=_delta(metrics.prefix_hits_total, prev and prev.prefix_hits_total),
        prefix_queries_delta=_delta(
            metrics.prefix_queries_total, prev and prev.prefix_queries_total
        ),
        preemptions_delta=_delta(metrics.preemptions_total, prev and prev.preemptions_total),
        evictions_delta=(
            _delta(evictions_total, prev_evict) if evictions_total is not None else 0.0
        ),
        interval_s=(now_s - prev.ts.timestamp()) if prev is not None else 0.0,
    )


# --- retention ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetentionResult:
    records_deleted: int
    minute_rollups_compacted: int
    hour_rollups_deleted: int
    fleet_samples_deleted: int


def retention_apply(
    *,
    now_s: float,
    records_max_age_s: float,
    minute_rollups_max_age_s: float,
    hour_rollups_max_age_s: float,
    fleet_max_age_s: float,
    live_rollups_max_age_s: float = 7200.0,
) -> RetentionResult:
    """Drop raw records and fleet samples past their age; fold minute rollups past their
    age into hour rollups (merge then delete, in one transaction, so nothing is counted
    twice or lost); drop hour rollups past theirs, and 10 s (live) rollups past theirs
    (their data is also in the minute rows)."""
    now = dt_from_s(now_s)
    with transaction.atomic():
        rec_deleted, _ = RequestRecord.objects.filter(
            ts__lt=now - timedelta(seconds=records_max_age_s)
        ).delete()
        fleet_deleted, _ = FleetSample.objects.filter(
            ts__lt=now - timedelta(seconds=fleet_max_age_s)
        ).delete()
        # Only whole hours are folded, so a later minute row of the same hour never
        # meets an hour row that already holds part of that hour's data.
        cutoff_s = rollups.bucket_start_s(now_s - minute_rollups_max_age_s, width_s=rollups.HOUR_S)
        old = list(
            Rollup.objects.select_for_update().filter(
                granularity=Rollup.MINUTE, bucket_start__lt=dt_from_s(cutoff_s)
            )
        )
        groups: dict[rollups.RollupKey, list[Rollup]] = {}
        for row in old:
            key = rollups.RollupKey(
                bucket_start_s=rollups.bucket_start_s(
                    row.bucket_start.timestamp(), width_s=rollups.HOUR_S
                ),
                model=row.model,
                worker_id=row.worker_id,
                policy_version_id=row.policy_version_id,
                experiment_id=row.experiment_id,
                arm=row.arm,
            )
            groups.setdefault(key, []).append(row)
        hour_deltas = {
            key: rollups.merge_counters(*(_row_counters(r) for r in rows))
            for key, rows in groups.items()
        }
        _apply_rollups(hour_deltas, granularity=Rollup.HOUR)
        Rollup.objects.filter(pk__in=[r.pk for r in old]).delete()
        Rollup.objects.filter(
            granularity=Rollup.TEN_S,
            bucket_start__lt=now - timedelta(seconds=live_rollups_max_age_s),
        ).delete()
        hour_deleted, _ = Rollup.objects.filter(
            granularity=Rollup.HOUR,
            bucket_start__lt=now - timedelta(seconds=hour_rollups_max_age_s),
        ).delete()
    return RetentionResult(
        records_deleted=rec_deleted,
        minute_rollups_compacted=len(old),
        hour_rollups_deleted=hour_deleted,
        fleet_samples_deleted=fleet_deleted,
    )


def _row_counters(row: Rollup) -> dict[str, Any]:
    return {f: getattr(row, f) for f in (*rollups.COUNTER_FIELDS, *rollups.HIST_FIELDS)}


def rollups_merged(rows: Sequence[Rollup]) -> dict[str, Any]:
    return rollups.merge_counters(*(_row_counters(r) for r in rows))
