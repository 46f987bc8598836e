"""Reads of the worker registry. Health is derived here, from heartbeat age and probes."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.utils import timezone

from controlplane.registry.models import Worker
from routing.core.types import WorkerView

# A gateway's probe failing this many times in a row marks the worker unhealthy
# even while its agent still heartbeats (the agent may be up while the engine is not).
PROBE_FAILURE_LIMIT = 3


def heartbeat_timeout() -> timedelta:
    return timedelta(seconds=float(settings.KVROUTE_HEARTBEAT_TIMEOUT_S))


def healthy_q(*, now: datetime) -> Q:
    """Healthy: heard from recently (heartbeat or successful probe) and probes not failing."""
    cutoff = now - heartbeat_timeout()
    return (Q(last_heartbeat_at__gte=cutoff) | Q(last_probe_ok_at__gte=cutoff)) & Q(
        probe_failures__lt=PROBE_FAILURE_LIMIT
    )


def worker_is_healthy(*, worker: Worker, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    cutoff = now - heartbeat_timeout()
    seen = any(
        t is not None and t >= cutoff for t in (worker.last_heartbeat_at, worker.last_probe_ok_at)
    )
    return seen and worker.probe_failures < PROBE_FAILURE_LIMIT


def worker_list(
    *,
    model: str | None = None,
    state: str | None = None,
    healthy: bool | None = None,
    now: datetime | None = None,
) -> QuerySet[Worker]:
    """Workers ordered by model then name, each annotated with a boolean `healthy`."""
    now = now or timezone.now()
    qs = Worker.objects.annotate(
        healthy=ExpressionWrapper(healthy_q(now=now), output_field=BooleanField())
    )
    if model:
        qs = qs.filter(model=model)
    if state:
        qs = qs.filter(state=state)
    if healthy is True:
        qs = qs.filter(healthy_q(now=now))
    elif healthy is False:
        qs = qs.exclude(healthy_q(now=now))
    return qs.order_by("model", "name")


def worker_get(*, name: str, now: datetime | None = None) -> Worker | None:
    return worker_list(now=now).filter(name=name).first()


def worker_models() -> list[str]:
    return sorted(set(Worker.objects.values_list("model", flat=True)))


def worker_views(*, model: str | None = None, now: datetime | None = None) -> list[WorkerView]:
    """Core `WorkerView`s from the last heartbeats (dashboards, offline what-ifs).

    The gateway builds its own views from the routing snapshot and live scrapes;
    `metrics_age_s` here is the age of the last heartbeat in seconds (inf if none).
    """
    now = now or timezone.now()
    views = []
    for w in worker_list(model=model, now=now):
        age_s = (
            (now - w.last_heartbeat_at).total_seconds()
            if w.last_heartbeat_at is not None
            else float("inf")
        )
        views.append(
            WorkerView(
                id=w.name,
                url=w.base_url,
                model=w.model,
                healthy=bool(w.healthy),
                draining=w.state != Worker.State.ACTIVE,
                block_size=w.block_size,
                capacity_blocks=w.capacity_blocks,
                running=w.running,
                waiting=w.waiting,
                kv_usage_frac=w.kv_usage_frac,
                inflight_requests=w.inflight,
                metrics_age_s=max(age_s, 0.0),
                network_ms=w.network_ms,
            )
        )
    return views
