"""Telemetry reads: plain dicts/lists ready for JSON, figures and templates."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from controlplane.telemetry import rollups
from controlplane.telemetry.models import (
    ExperimentResult,
    FleetSample,
    RequestRecord,
    Rollup,
)
from controlplane.telemetry.services import dt_from_s, rollups_merged

WIDTH_S = {
    Rollup.TEN_S: rollups.TEN_S,
    Rollup.MINUTE: rollups.MINUTE_S,
    Rollup.HOUR: rollups.HOUR_S,
}
# Windows up to this long are drawn from 10 s rows; longer ones from minute rows.
LIVE_WINDOW_MAX_S = 3600.0


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def _point(bucket_start: datetime, rows: list[Rollup], *, now_s: float) -> dict[str, Any]:
    start_s = bucket_start.timestamp()
    width_s = WIDTH_S[rows[0].granularity]
    # The current bucket is still filling: its rate is over the seconds seen so far.
    duration_s = min(float(width_s), max(now_s - start_s, 1.0))
    summary = rollups.summarize(rollups_merged(rows), duration_s=duration_s)
    return {"t": _iso(bucket_start), **summary}


def overview_points(
    *,
    since_s: float,
    now_s: float | None = None,
    model: str | None = None,
    granularity: str = Rollup.MINUTE,
) -> list[dict[str, Any]]:
    """Fleet-wide points (all workers and arms summed) from `since_s` on."""
    now_s = time.time() if now_s is None else now_s
    qs = Rollup.objects.filter(granularity=granularity, bucket_start__gte=dt_from_s(since_s))
    if model:
        qs = qs.filter(model=model)
    by_bucket: dict[datetime, list[Rollup]] = defaultdict(list)
    for row in qs.order_by("bucket_start"):
        by_bucket[row.bucket_start].append(row)
    return [_point(b, rows, now_s=now_s) for b, rows in sorted(by_bucket.items())]


def overview_update(
    *,
    bucket_starts_s: Iterable[int],
    now_s: float | None = None,
    granularity: str = Rollup.TEN_S,
) -> dict:
    """The channels message pushed after a drain: the re-computed touched buckets."""
    now_s = time.time() if now_s is None else now_s
    starts = [dt_from_s(s) for s in bucket_starts_s]
    by_bucket: dict[datetime, list[Rollup]] = defaultdict(list)
    for row in Rollup.objects.filter(granularity=granularity, bucket_start__in=starts):
        by_bucket[row.bucket_start].append(row)
    points = [_point(b, rows, now_s=now_s) for b, rows in sorted(by_bucket.items())]
    return {
        "type": "dashboard.update",
        "kind": "overview",
        "granularity": granularity,
        "points": points,
    }


def fleet_series(*, since_s: float, worker_id: str | None = None) -> dict[str, Any]:
    """Per-worker load series and the fleet eviction rate from `since_s` on."""
    qs = FleetSample.objects.filter(ts__gte=dt_from_s(since_s), ok=True)
    if worker_id:
        qs = qs.filter(worker_id=worker_id)
    workers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    evictions: dict[datetime, float] = defaultdict(float)
    for s in qs.order_by("ts"):
        workers[s.worker_id].append(fleet_point(s))
        if s.interval_s > 0:
            # One scrape round stamps every worker within a second; key on that second.
            evictions[s.ts.replace(microsecond=0)] += s.evictions_delta / s.interval_s
    return {
        "workers": dict(workers),
        "evictions": [{"t": _iso(t), "evictions_per_s": v} for t, v in sorted(evictions.items())],
    }


def fleet_point(s: FleetSample) -> dict[str, Any]:
    return {
        "t": _iso(s.ts),
        "worker_id": s.worker_id,
        "running": s.running,
        "waiting": s.waiting,
        "kv_usage_frac": s.kv_usage_frac,
        "prefix_hit_rate": (
            s.prefix_hits_delta / s.prefix_queries_delta if s.prefix_queries_delta else None
        ),
        "preemptions_per_s": s.preemptions_delta / s.interval_s if s.interval_s else 0.0,
        "evictions_per_s": s.evictions_delta / s.interval_s if s.interval_s else 0.0,
        "events_state": s.events_state,
    }


def fleet_update(*, samples: Iterable[FleetSample]) -> dict[str, Any]:
    """The channels message pushed after a fleet scrape."""
    pts = [fleet_point(s) for s in samples if s.ok]
    total_evict = sum(p["evictions_per_s"] for p in pts)
    t = max((p["t"] for p in pts), default=None)
    return {
        "type": "dashboard.update",
        "kind": "fleet",
        "points": pts,
        "evictions": [{"t": t, "evictions_per_s": total_evict}] if t else [],
    }


def latest_fleet_by_worker() -> dict[str, dict[str, Any]]:
    """Latest sample (ok or not) of every worker ever scraped, with its age."""
    out: dict[str, dict[str, Any]] = {}
    now_s = time.time()
    for s in FleetSample.objects.order_by("worker_id", "-ts"):
        if s.worker_id in out:
            continue
        out[s.worker_id] = {
            **fleet_point(s),
            "ok": s.ok,
            "error": s.error,
            "age_s": now_s - s.ts.timestamp(),
        }
    return out


def worker_rollup_summary(*, since_s: float, now_s: float | None = None) -> dict[str, dict]:
    """Per-worker summary (requests, hit rates, TTFT percentiles) over the window."""
    now_s = time.time() if now_s is None else now_s
    rows: dict[str, list[Rollup]] = defaultdict(list)
    for r in Rollup.objects.filter(granularity=Rollup.MINUTE, bucket_start__gte=dt_from_s(since_s)):
        rows[r.worker_id].append(r)
    # Rates over the time the worker has had traffic in the window, not the whole window,
    # so a worker that started a minute ago does not look idle.
    return {
        w: rollups.summarize(
            rollups_merged(rs),
            duration_s=max(now_s - min(r.bucket_start.timestamp() for r in rs), 1.0),
        )
        for w, rs in rows.items()
    }


def worker_points(
    *, worker_id: str, since_s: float, now_s: float | None = None
) -> list[dict[str, Any]]:
    now_s = time.time() if now_s is None else now_s
    by_bucket: dict[datetime, list[Rollup]] = defaultdict(list)
    for row in Rollup.objects.filter(
        granularity=Rollup.TEN_S, worker_id=worker_id, bucket_start__gte=dt_from_s(since_s)
    ).order_by("bucket_start"):
        by_bucket[row.bucket_start].append(row)
    return [_point(b, rs, now_s=now_s) for b, rs in sorted(by_bucket.items())]


def overview_snapshot(*, window_s: float = 3600.0, now_s: float | None = None) -> dict[str, Any]:
    """Everything the overview page draws first, before websocket updates arrive."""
    now_s = time.time() if now_s is None else now_s
    since_s = now_s - window_s
    fleet = fleet_series(since_s=since_s)
    granularity = Rollup.TEN_S if window_s <= LIVE_WINDOW_MAX_S else Rollup.MINUTE
    return {
        "generated_at": _iso(dt_from_s(now_s)),
        "window_s": window_s,
        "granularity": granularity,
        "points": overview_points(since_s=since_s, now_s=now_s, granularity=granularity),
        "fleet": fleet["workers"],
        "evictions": fleet["evictions"],
    }


def record_to_dict(r: RequestRecord) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "ts": _iso(r.ts),
        "ts_s": r.ts.timestamp(),
        "model": r.model,
        "tenant": r.tenant,
        "session_key": r.session_key,
        "worker_id": r.worker_id,
        "policy": r.policy,
        "policy_version_id": r.policy_version_id,
        "policy_type": r.policy_type,
        "experiment_id": r.experiment_id,
        "arm": r.arm,
        "prompt_tokens": r.prompt_tokens,
        "predicted_cached_tokens": r.predicted_cached_tokens,
        "actual_cached_tokens": r.actual_cached_tokens,
        "ttft_ms": r.ttft_ms,
        "e2e_ms": r.e2e_ms,
        "output_tokens": r.output_tokens,
        "status": r.status,
        "http_status": r.http_status,
        "retries": r.retries,
        "routing_overhead_us": r.routing_overhead_us,
        "stream": r.stream,
        "candidates": r.candidates,
        "shadow": r.shadow,
        "reason": r.reason,
        "block_keys": r.block_keys,
        "block_size": r.block_size,
    }


def recent_requests(
    *,
    limit: int = 100,
    worker_id: str | None = None,
    model: str | None = None,
    status: str | None = None,
    experiment_id: int | None = None,
) -> list[RequestRecord]:
    qs = RequestRecord.objects.all()
    if worker_id:
        qs = qs.filter(worker_id=worker_id)
    if model:
        qs = qs.filter(model=model)
    if status:
        qs = qs.filter(status=status)
    if experiment_id:
        qs = qs.filter(experiment_id=experiment_id)
    return list(qs.order_by("-ts", "-id")[:limit])


def request_get(*, request_id: str) -> RequestRecord | None:
    return RequestRecord.objects.filter(request_id=request_id).first()


def recent_request_dicts(*, limit: int, model: str | None = None) -> list[dict[str, Any]]:
    """The last `limit` recorded requests, oldest first (input to what-if replays)."""
    return [record_to_dict(r) for r in reversed(recent_requests(limit=limit, model=model))]


def experiment_result_get(*, experiment_id: int) -> dict[str, Any] | None:
    row = ExperimentResult.objects.filter(experiment_id=experiment_id).first()
    if row is None:
        return None
    return {"computed_at": _iso(row.computed_at), **row.body}


def experiment_results(*, experiment: Any) -> dict[str, Any] | None:
    """Hook read by `controlplane.policies.selectors.experiment_results`: the latest
    computed comparison of the experiment's arms (None until the job has run)."""
    return experiment_result_get(experiment_id=experiment.pk)
