"""Writes to the worker registry. Every change a gateway routes on publishes a config notice."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.common.auth import OPERATOR, WORKER, Actor
from controlplane.common.errors import Forbidden, NotFound, ServiceError
from controlplane.common.validation import (
    check_float,
    check_http_url,
    check_int,
    check_labels,
    check_model,
    check_name,
    check_name_case_unique,
    check_tcp_endpoint,
)
from controlplane.registry.models import Worker
from controlplane.registry.selectors import worker_is_healthy
from controlplane.snapshot import config_changed

MAX_BLOCK_SIZE = 4096
MAX_CAPACITY_BLOCKS = 2**31 - 1
MAX_NETWORK_MS = 60_000.0
MAX_LOAD_COUNT = 1_000_000


def _clean_config(fields: dict[str, Any]) -> dict[str, Any]:
    """Validate the worker configuration fields present in `fields`."""
    checks = {
        "base_url": lambda v: check_http_url(v, field="base_url"),
        "model": lambda v: check_model(v),
        "kv_events_endpoint": lambda v: check_tcp_endpoint(v, field="kv_events_endpoint"),
        "replay_endpoint": lambda v: check_tcp_endpoint(v, field="replay_endpoint"),
        "block_size": lambda v: check_int(v, field="block_size", low=1, high=MAX_BLOCK_SIZE),
        "capacity_blocks": lambda v: check_int(
            v, field="capacity_blocks", low=0, high=MAX_CAPACITY_BLOCKS
        ),
        "network_ms": lambda v: check_float(v, field="network_ms", low=0.0, high=MAX_NETWORK_MS),
        "labels": lambda v: check_labels(v),
        "state": _check_state,
    }
    unknown = set(fields) - set(checks)
    if unknown:
        raise ServiceError(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    return {key: checks[key](value) for key, value in fields.items()}


def _check_state(value: Any) -> str:
    if value not in Worker.State.values:
        raise ServiceError(f"State must be one of {', '.join(Worker.State.values)}.", field="state")
    return str(value)


def _check_access(*, worker: Worker, actor: Actor) -> None:
    """Operators act on any worker; a worker token only on the workers it registered."""
    if actor.scope == OPERATOR:
        return
    if (
        actor.scope == WORKER
        and actor.token_id is not None
        and worker.owner_token_id == actor.token_id
    ):
        return
    raise Forbidden(f"This token may not act on worker {worker.name!r}: it did not register it.")


def _locked(*, name: str) -> Worker:
    worker = Worker.objects.select_for_update().filter(name=name).first()
    if worker is None:
        raise NotFound(f"No worker named {name!r}.")
    return worker


def worker_register(
    *,
    name: str,
    base_url: str,
    model: str,
    actor: Actor,
    kv_events_endpoint: str = "",
    replay_endpoint: str = "",
    block_size: int = 16,
    capacity_blocks: int = 0,
    network_ms: float = 0.0,
    labels: dict[str, str] | None = None,
) -> tuple[Worker, bool]:
    """Create or update a worker by name; returns (worker, created).

    Idempotent: an agent re-registering after a restart updates its configuration
    and keeps the worker's state (a drained or disabled worker stays so until an
    operator enables it). Registering counts as a heartbeat.
    """
    check_name(name)
    config = _clean_config(
        {
            "base_url": base_url,
            "model": model,
            "kv_events_endpoint": kv_events_endpoint,
            "replay_endpoint": replay_endpoint,
            "block_size": block_size,
            "capacity_blocks": capacity_blocks,
            "network_ms": network_ms,
            "labels": labels or {},
        }
    )
    if actor.scope not in (OPERATOR, WORKER):
        raise Forbidden("Only operator and worker tokens may register workers.")
    now = timezone.now()
    with transaction.atomic():
        worker = Worker.objects.select_for_update().filter(name=name).first()
        created = worker is None
        if worker is None:
            check_name_case_unique(Worker.objects, name, kind="Worker")
            try:
                with transaction.atomic():
                    worker = Worker.objects.create(
                        name=name,
                        registered_by=actor.label,
                        owner_token_id=actor.token_id if actor.scope == WORKER else None,
                        last_heartbeat_at=now,
                        **config,
                    )
            except IntegrityError:
                # Another registration won the race: update that row if it is this name; a
                # name differing only in case is a conflict, as check_name_case_unique says.
                if not Worker.objects.filter(name=name).exists():
                    check_name_case_unique(Worker.objects, name, kind="Worker")
                    raise
                worker = _locked(name=name)
                created = False
        if not created:
            _check_access(worker=worker, actor=actor)
            for key, value in config.items():
                setattr(worker, key, value)
            worker.last_heartbeat_at = now
            worker.save()
        config_changed()
    return worker, created


def worker_update(*, name: str, actor: Actor, **fields: Any) -> Worker:
    """Operator edit of a worker's configuration or state (PATCH)."""
    config = _clean_config(fields)
    with transaction.atomic():
        worker = _locked(name=name)
        _check_access(worker=worker, actor=actor)
        changed = [key for key, value in config.items() if getattr(worker, key) != value]
        for key in changed:
            setattr(worker, key, config[key])
        if changed:
            worker.save(update_fields=[*changed, "updated_at"])
            config_changed()
    return worker


def _set_state(*, name: str, actor: Actor, state: str) -> Worker:
    with transaction.atomic():
        worker = _locked(name=name)
        _check_access(worker=worker, actor=actor)
        if worker.state != state:
            worker.state = state
            worker.save(update_fields=["state", "updated_at"])
            config_changed()
    return worker


def worker_drain(*, name: str, actor: Actor) -> Worker:
    """Stop routing new requests to the worker; in-flight ones finish."""
    return _set_state(name=name, actor=actor, state=Worker.State.DRAINING)


def worker_enable(*, name: str, actor: Actor) -> Worker:
    return _set_state(name=name, actor=actor, state=Worker.State.ACTIVE)


def worker_deregister(*, name: str, actor: Actor) -> None:
    with transaction.atomic():
        worker = _locked(name=name)
        _check_access(worker=worker, actor=actor)
        worker.delete()
        config_changed()


def worker_heartbeat(
    *,
    name: str,
    actor: Actor,
    running: int = 0,
    waiting: int = 0,
    kv_usage_frac: float = 0.0,
    inflight: int = 0,
    block_size: int | None = None,
    capacity_blocks: int | None = None,
    now: datetime | None = None,
) -> Worker:
    """Record a worker's load (and, when given, its cache config).

    Notifies gateways only when the worker comes back to health or its cache config
    changes, so routine heartbeats cost one UPDATE and no broadcast.
    """
    load = {
        "running": check_int(running, field="running", low=0, high=MAX_LOAD_COUNT),
        "waiting": check_int(waiting, field="waiting", low=0, high=MAX_LOAD_COUNT),
        "kv_usage_frac": check_float(kv_usage_frac, field="kv_usage_frac", low=0.0, high=1.0),
        "inflight": check_int(inflight, field="inflight", low=0, high=MAX_LOAD_COUNT),
    }
    config = _clean_config(
        {
            key: value
            for key, value in (("block_size", block_size), ("capacity_blocks", capacity_blocks))
            if value is not None
        }
    )
    now = now or timezone.now()
    with transaction.atomic():
        worker = _locked(name=name)
        _check_access(worker=worker, actor=actor)
        was_healthy = worker_is_healthy(worker=worker, now=now)
        config_change = any(getattr(worker, k) != v for k, v in config.items())
        for key, value in {**load, **config}.items():
            setattr(worker, key, value)
        worker.last_heartbeat_at = now
        worker.save(update_fields=[*load, *config, "last_heartbeat_at", "updated_at"])
        if config_change or not was_healthy:
            config_changed()
    return worker


def worker_probe_record(
    *, name: str, actor: Actor, ok: bool, error: str = "", now: datetime | None = None
) -> Worker:
    """Record a gateway's reachability probe; consecutive failures make the worker unhealthy."""
    now = now or timezone.now()
    with transaction.atomic():
        worker = _locked(name=name)
        _check_access(worker=worker, actor=actor)
        was_healthy = worker_is_healthy(worker=worker, now=now)
        worker.last_probe_at = now
        if ok:
            worker.last_probe_ok_at = now
            worker.probe_failures = 0
            worker.last_probe_error = ""
        else:
            worker.probe_failures += 1
            worker.last_probe_error = error[:300]
        worker.save(
            update_fields=[
                "last_probe_at",
                "last_probe_ok_at",
                "probe_failures",
                "last_probe_error",
                "updated_at",
            ]
        )
        if worker_is_healthy(worker=worker, now=now) != was_healthy:
            config_changed()
    return worker
