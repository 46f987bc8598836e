"""The routing snapshot (everything a gateway needs, one document) and change notices.

Gateways never query the ORM per request: they hold the last snapshot in memory and
refetch `GET /api/routing-snapshot/` when a "config changed" notice arrives on the
channel-layer group `kvroute.config` or the Redis channel `kvroute:config`.
Notices are sent after the writing transaction commits, so a gateway that reacts
at once reads the new state.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone

CONFIG_GROUP = "kvroute.config"
CONFIG_MESSAGE_TYPE = "config.changed"
REDIS_CONFIG_CHANNEL = "kvroute:config"

log = logging.getLogger(__name__)


SNAPSHOT_WORKER_FIELDS = (
    "name",
    "base_url",
    "model",
    "state",
    "healthy",
    "block_size",
    "capacity_blocks",
    "network_ms",
    "kv_events_endpoint",
    "replay_endpoint",
    "labels",
)


def _worker_doc(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["name"],
        "url": row["base_url"],
        "model": row["model"],
        "state": row["state"],
        "healthy": bool(row["healthy"]),
        "block_size": row["block_size"],
        "capacity_blocks": row["capacity_blocks"],
        "network_ms": row["network_ms"],
        "kv_events_endpoint": row["kv_events_endpoint"] or None,
        "replay_endpoint": row["replay_endpoint"] or None,
        "labels": dict(row["labels"]),
    }


def snapshot_body(*, now: datetime | None = None) -> dict[str, Any]:
    """Workers and, per model, the active version and running experiment (no revision)."""
    from controlplane.policies.selectors import active_versions, experiments_running
    from controlplane.registry.selectors import worker_list

    # Plain rows, not model instances: this runs on every change notice and gateway poll.
    rows = worker_list(now=now or timezone.now()).values(*SNAPSHOT_WORKER_FIELDS)
    workers = [_worker_doc(row) for row in rows]
    active = active_versions()
    running = experiments_running()
    models: dict[str, dict[str, Any]] = {}
    for model in sorted(set(active) | set(running)):
        version = active.get(model)
        experiment = running.get(model)
        models[model] = {
            "active": version.to_dict() if version else None,
            "experiment": experiment.to_dict() if experiment else None,
        }
    return {"workers": workers, "models": models}


def snapshot_revision(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()


def routing_snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    """The `GET /api/routing-snapshot/` document of docs/contracts.md.

    `revision` is the SHA-1 of the canonical JSON of workers + models, so it changes
    exactly when something a gateway routes on changes (heartbeat load does not count,
    a worker turning healthy or unhealthy does).
    """
    now = now or timezone.now()
    body = snapshot_body(now=now)
    generated_at = now.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {"revision": snapshot_revision(body), "generated_at": generated_at, **body}


def config_changed_publish() -> str:
    """Tell every gateway the routing config changed; returns the new revision.

    A failure to publish is logged, never raised: the write it reports is already
    committed, and gateways also refetch the snapshot periodically.
    """
    revision = snapshot_revision(snapshot_body())
    layer = get_channel_layer()
    if layer is not None:
        try:
            async_to_sync(layer.group_send)(
                CONFIG_GROUP, {"type": CONFIG_MESSAGE_TYPE, "revision": revision}
            )
        except Exception:
            log.exception("could not publish config change on the channel layer")
    if settings.REDIS_URL:
        try:
            import redis

            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
            try:
                client.publish(REDIS_CONFIG_CHANNEL, revision)
            finally:
                client.close()
        except Exception:
            log.exception("could not publish config change on Redis")
    return revision


def config_changed() -> None:
    """Schedule a change notice for when the current transaction commits (at once outside one)."""
    transaction.on_commit(config_changed_publish)
