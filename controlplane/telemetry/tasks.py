"""Telemetry jobs: plain functions (testable, callable from the embedded scheduler) and
thin Celery `@shared_task` wrappers around them. Every job is idempotent."""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from celery import shared_task
from django.conf import settings

from controlplane.telemetry import experiments as exp_stats
from controlplane.telemetry import selectors, services
from controlplane.telemetry.models import ExperimentResult, RequestRecord, Rollup
from controlplane.telemetry.sources import RecordSource, RedisStreamSource
from routing.gateway.scraper import parse_vllm_metrics

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
MAX_ARM_SAMPLES = 20_000

# vLLM /metrics counters this job reads (V1 names first, V0 names as fallbacks); the load
# gauges are read by the gateway's own parser (`routing.gateway.scraper.parse_vllm_metrics`).
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREEMPTIONS = ("vllm:num_preemptions_total",)
# The gateway's count of BlockRemoved events it applied, per worker (label `worker`), and
# its KV-event stream state per worker (labels `worker`, `state`; value 1).
GATEWAY_BLOCKS_REMOVED = "kvroute_kv_blocks_removed_total"
GATEWAY_EVENTS_STATE = "kvroute_gateway_worker_events_state"
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class GatewayView:
    """What the gateway knows per worker that /metrics of the worker does not say:
    BlockRemoved counts (evictions) and the KV-event stream state."""

    blocks_removed: Mapping[str, float] = field(default_factory=dict)
    events_state: Mapping[str, str] = field(default_factory=dict)


def gateway_view_from_metrics(text: str) -> GatewayView:
    removed: dict[str, float] = {}
    states: dict[str, str] = {}
    for line in text.splitlines():
        for metric in (GATEWAY_BLOCKS_REMOVED, GATEWAY_EVENTS_STATE):
            if not line.startswith(metric + "{"):
                continue
            close = line.rfind("}")
            labels = dict(_LABEL_RE.findall(line[len(metric) + 1 : close]))
            try:
                value = float(line[close + 1 :].split()[0])
            except (ValueError, IndexError):
                continue
            worker = labels.get("worker")
            if worker is None:
                continue
            if metric == GATEWAY_BLOCKS_REMOVED:
                removed[worker] = removed.get(worker, 0.0) + value
            elif value == 1 and "state" in labels:
                states[worker] = labels["state"]
    return GatewayView(blocks_removed=removed, events_state=states)


def channel_publish(message: dict[str, Any]) -> None:
    """Send one update to the dashboard group from synchronous code (Celery, threads)."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(DASHBOARD_GROUP, message)


def default_source() -> RecordSource | None:
    """The Redis stream when REDIS_URL is set; otherwise None (no Redis, and the in-process
    sink is handed to the embedded scheduler directly by whoever owns the gateway)."""
    if settings.REDIS_URL:
        return RedisStreamSource(url=settings.REDIS_URL)
    return None


# --- drain ---------------------------------------------------------------------


def drain_request_stream_run(
    *, source: RecordSource | None = None, publish: Callable[[dict], None] | None = None
) -> services.DrainResult | None:
    source = source or default_source()
    if source is None:
        logger.debug("no request-record source configured; nothing to drain")
        return None
    return services.request_stream_drain(
        source=source,
        sample_rate=settings.KVROUTE_TELEMETRY_SAMPLE_RATE,
        batch_size=settings.KVROUTE_TELEMETRY_DRAIN_BATCH,
        publish=publish,
    )


# --- fleet scrape -----------------------------------------------------------------


def parse_metric_sums(text: str) -> dict[str, float]:
    """Sum of every sample per metric name in a Prometheus text page (labels ignored;
    several engines behind one URL add up)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        try:
            out[name] = out.get(name, 0.0) + float(rest[0])
        except ValueError:
            continue
    return out


def _first(sums: Mapping[str, float], names: Sequence[str]) -> float:
    for n in names:
        if n in sums:
            return sums[n]
    return 0.0


def worker_metrics_from_text(text: str) -> services.WorkerMetrics:
    # Load as the gateway sees it: gauges summed over engines, KV usage averaged over them.
    load = parse_vllm_metrics(text)
    sums = parse_metric_sums(text)
    return services.WorkerMetrics(
        running=load.running,
        waiting=load.waiting,
        kv_usage_frac=load.kv_usage_frac,
        prefix_hits_total=_first(sums, PREFIX_HITS),
        prefix_queries_total=_first(sums, PREFIX_QUERIES),
        preemptions_total=_first(sums, PREEMPTIONS),
    )


def fleet_targets() -> list[tuple[str, str]]:
    """(worker id, base URL) of every registered worker that is not disabled."""
    from controlplane.registry.selectors import worker_list

    return [(w.name, w.base_url) for w in worker_list() if w.state != "disabled"]


def scrape_fleet_run(
    *,
    targets: Sequence[tuple[str, str]] | None = None,
    now_s: float | None = None,
    publish: Callable[[dict], None] | None = None,
    gateway_metrics_url: str | None = None,
    gateway_getter: Callable[[], GatewayView] | None = None,
    timeout_s: float = 2.0,
) -> list[Any]:
    """Scrape every worker's /metrics once and store one FleetSample each. Evictions and
    the KV-event stream state come from the gateway: read in-process through
    `gateway_getter`, or from its /gateway/metrics page at `gateway_metrics_url`."""
    targets = fleet_targets() if targets is None else targets
    now_s = time.time() if now_s is None else now_s
    gateway_metrics_url = (
        settings.KVROUTE_GATEWAY_METRICS_URL if gateway_metrics_url is None else gateway_metrics_url
    )
    samples = []
    with httpx.Client(timeout=timeout_s) as client:
        gw = GatewayView()
        if gateway_getter is not None:
            gw = gateway_getter()
        elif gateway_metrics_url:
            try:
                resp = client.get(gateway_metrics_url)
                resp.raise_for_status()
                gw = gateway_view_from_metrics(resp.text)
            except httpx.HTTPError as exc:
                logger.warning("gateway metrics unavailable at %s: %s", gateway_metrics_url, exc)
        for worker_id, base_url in targets:
            try:
                resp = client.get(base_url.rstrip("/") + "/metrics")
                resp.raise_for_status()
                metrics: services.WorkerMetrics | None = worker_metrics_from_text(resp.text)
                error = ""
            except httpx.HTTPError as exc:
                metrics, error = None, f"{type(exc).__name__}: {exc}"
            samples.append(
                services.fleet_sample_record(
                    worker_id=worker_id,
                    now_s=now_s,
                    metrics=metrics,
                    error=error,
                    evictions_total=gw.blocks_removed.get(worker_id),
                    events_state=gw.events_state.get(worker_id, ""),
                )
            )
    if publish is not None and samples:
        try:
            publish(selectors.fleet_update(samples=samples))
        except Exception:
            logger.exception("could not push the fleet update to the dashboard")
    return samples


# --- experiments ---------------------------------------------------------------


def experiment_arm_data(
    *, experiment_id: int, arms: Sequence[tuple[str, int]]
) -> list[exp_stats.ArmData]:
    """Per-arm samples (RequestRecord TTFTs) and exact counters (rollups, both granularities)."""
    out = []
    for name, version_id in arms:
        # The newest MAX_ARM_SAMPLES are plenty for the bootstrap (which subsamples again)
        # and keep a long experiment's recompute bounded in time and memory.
        ttfts = list(
            RequestRecord.objects.filter(
                experiment_id=experiment_id, arm=name, status="ok", ttft_ms__isnull=False
            )
            .order_by("-id")
            .values_list("ttft_ms", flat=True)[:MAX_ARM_SAMPLES]
        )
        # Minute and hour rows partition the history; 10 s rows duplicate recent minutes.
        rows = list(
            Rollup.objects.filter(experiment_id=experiment_id, arm=name).exclude(
                granularity=Rollup.TEN_S
            )
        )
        c = services.rollups_merged(rows)
        starts = [r.bucket_start.timestamp() for r in rows]
        duration_s = (max(starts) + 60.0 - min(starts)) if starts else 0.0
        out.append(
            exp_stats.ArmData(
                name=name,
                version_id=version_id,
                ttft_ms=ttfts,
                requests=c["requests"],
                errors=c["errors"],
                hit_requests=c["hit_requests"],
                cached_known_requests=c["cached_known_requests"],
                actual_cached_tokens=c["actual_cached_tokens"],
                cached_known_prompt_tokens=c["cached_known_prompt_tokens"],
                output_tokens=c["output_tokens"],
                duration_s=duration_s,
            )
        )
    return out


def experiment_results_compute(
    *,
    experiment_id: int,
    arms: Sequence[tuple[str, int]],
    seed: int = 0,
    now_s: float | None = None,
) -> dict[str, Any]:
    """Compare the arms (first = control) and store the result; seeded, so re-running on
    the same data gives the same numbers."""
    now_s = time.time() if now_s is None else now_s
    data = experiment_arm_data(experiment_id=experiment_id, arms=arms)
    body = exp_stats.compare_arms(
        data,
        rng=random.Random(seed + experiment_id),
        resamples=settings.KVROUTE_TELEMETRY_BOOTSTRAP_RESAMPLES,
    )
    ExperimentResult.objects.update_or_create(
        experiment_id=experiment_id,
        defaults={"computed_at": services.dt_from_s(now_s), "body": body},
    )
    return body


def experiment_results_run(*, now_s: float | None = None) -> dict[int, str]:
    """Recompute every running experiment and any stopped in the last day."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from controlplane.policies.models import Experiment
    from controlplane.policies.selectors import experiment_info

    recent = timezone.now() - timedelta(days=1)
    verdicts: dict[int, str] = {}
    for exp in Experiment.objects.filter(
        Q(status=Experiment.Status.RUNNING) | Q(stopped_at__gte=recent)
    ):
        info = experiment_info(exp)
        body = experiment_results_compute(
            experiment_id=info.id,
            arms=[(a.name, a.version.version_id) for a in info.arms],
            now_s=now_s,
        )
        verdicts[info.id] = body["verdict"]
    return verdicts


# --- retention --------------------------------------------------------------------


def retention_run(*, now_s: float | None = None) -> services.RetentionResult:
    return services.retention_apply(
        now_s=time.time() if now_s is None else now_s,
        records_max_age_s=settings.KVROUTE_TELEMETRY_RECORDS_MAX_AGE_S,
        minute_rollups_max_age_s=settings.KVROUTE_TELEMETRY_MINUTE_ROLLUPS_MAX_AGE_S,
        hour_rollups_max_age_s=settings.KVROUTE_TELEMETRY_HOUR_ROLLUPS_MAX_AGE_S,
        fleet_max_age_s=settings.KVROUTE_TELEMETRY_FLEET_MAX_AGE_S,
        live_rollups_max_age_s=settings.KVROUTE_TELEMETRY_LIVE_ROLLUPS_MAX_AGE_S,
    )


# --- Celery wrappers ----------------------------------------------------------------


@shared_task(name="telemetry.drain_request_stream")
def drain_request_stream() -> int:
    result = drain_request_stream_run(publish=channel_publish)
    return result.entries if result else 0


@shared_task(name="telemetry.scrape_fleet")
def scrape_fleet() -> int:
    return len(scrape_fleet_run(publish=channel_publish))


@shared_task(name="telemetry.experiment_results")
def experiment_results() -> int:
    return len(experiment_results_run())


@shared_task(name="telemetry.retention")
def retention() -> int:
    r = retention_run()
    return r.records_deleted + r.minute_rollups_compacted
