"""Services and selectors called directly, as the dashboard, telemetry and gateway do."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.common.auth import OPERATOR, READ, WORKER, Actor
from controlplane.common.errors import Conflict, Forbidden, NotFound, ServiceError
from controlplane.common.services import api_token_create
from controlplane.policies import selectors as policy_selectors
from controlplane.policies import services as policy_services
from controlplane.registry import selectors, services
from routing.core.types import WorkerView

pytestmark = pytest.mark.django_db

OPS = Actor(label="test", scope=OPERATOR)


def test_worker_views_are_core_dataclasses_from_heartbeats() -> None:
    services.worker_register(
        name="a", base_url="http://10.0.0.1:8000", model="m", actor=OPS, capacity_blocks=100
    )
    services.worker_register(name="b", base_url="https://b.internal", model="m", actor=OPS)
    services.worker_heartbeat(
        name="a", actor=OPS, running=2, waiting=1, kv_usage_frac=0.25, inflight=3
    )
    services.worker_drain(name="b", actor=OPS)
    now = timezone.now() + timedelta(seconds=2)
    a, b = selectors.worker_views(model="m", now=now)
    assert isinstance(a, WorkerView)
    assert (
        a.id,
        a.running,
        a.waiting,
        a.kv_usage_frac,
        a.inflight_requests,
        a.capacity_blocks,
    ) == ("a", 2, 1, 0.25, 3, 100)
    assert a.routable and 1.5 < a.metrics_age_s < 60
    assert b.draining and not b.routable
    later = timezone.now() + timedelta(hours=1)
    assert not any(v.healthy for v in selectors.worker_views(now=later))


def test_health_follows_the_heartbeat_timeout(settings: object) -> None:
    settings.KVROUTE_HEARTBEAT_TIMEOUT_S = 10.0  # type: ignore[attr-defined]
    worker, _ = services.worker_register(name="a", base_url="http://h:1", model="m", actor=OPS)
    seen = worker.last_heartbeat_at
    assert selectors.worker_is_healthy(worker=worker, now=seen + timedelta(seconds=9))
    assert not selectors.worker_is_healthy(worker=worker, now=seen + timedelta(seconds=11))
    assert [
        w.name for w in selectors.worker_list(healthy=True, now=seen + timedelta(seconds=9))
    ] == ["a"]
    assert [
        w.name for w in selectors.worker_list(healthy=False, now=seen + timedelta(seconds=11))
    ] == ["a"]


def test_worker_services_check_scope_and_existence() -> None:
    token, _ = api_token_create(name="agent", scope=WORKER)
    agent = Actor(label="token:agent", scope=WORKER, token_id=token.pk)
    reader = Actor(label="token:r", scope=READ)
    with pytest.raises(Forbidden):
        services.worker_register(name="a", base_url="http://h:1", model="m", actor=reader)
    worker, created = services.worker_register(
        name="a", base_url="http://h:1", model="m", actor=agent
    )
    assert created and worker.owner_token_id == token.pk and worker.registered_by == "token:agent"
    with pytest.raises(NotFound):
        services.worker_drain(name="zz", actor=OPS)
    with pytest.raises(ServiceError) as err:
        services.worker_heartbeat(name="a", actor=agent, kv_usage_frac=math.nan)
    assert err.value.field == "kv_usage_frac"
    with pytest.raises(ServiceError) as err:
        services.worker_update(name="a", actor=OPS, colour="blue")
    assert "colour" in err.value.message


def test_policy_selectors_give_plain_values() -> None:
    _, v1 = policy_services.policy_create(
        name="p", model="m", type="kv_score", params={"cache_weight": 2}, actor=OPS
    )
    _, w1 = policy_services.policy_create(
        name="q", model="m", type="round_robin", params=None, actor=OPS
    )
    assert v1.params["cache_weight"] == 2.0 and w1.params == {}
    policy_services.policy_activate(policy_name="p", version=1, actor=OPS, model="m")
    active = policy_selectors.active_versions()["m"]
    assert active.to_dict() == {
        "policy": "p",
        "version_id": v1.pk,
        "version": 1,
        "type": "kv_score",
        "params": v1.params,
    }
    experiment = policy_services.experiment_create(
        name="e",
        model="m",
        arms=[{"version_id": v1.pk, "share": 90}, {"version_id": w1.pk, "share": 10}],
        shadow_version_id=w1.pk,
        sticky_key="request",
        actor=OPS,
    )
    info = policy_selectors.experiment_info(experiment)
    assert [(a.name, a.share, a.version.type) for a in info.arms] == [
        ("A", 90, "kv_score"),
        ("B", 10, "round_robin"),
    ]
    assert info.shadow is not None and info.shadow.policy == "q"
    assert policy_selectors.experiments_running() == {}
    policy_services.experiment_start(name="e", actor=OPS)
    assert policy_selectors.experiments_running()["m"].to_dict()["arms"][0]["share"] == 90
    results = policy_selectors.experiment_results(experiment=experiment)
    assert [a["name"] for a in results["arms"]] == ["A", "B"] and "results" in results
    with pytest.raises(Conflict):
        policy_services.experiment_delete(name="e", actor=OPS)
