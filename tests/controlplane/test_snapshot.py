"""The routing snapshot document and the change notices that tell gateways to refetch it."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.registry.models import Worker
from controlplane.snapshot import CONFIG_GROUP, REDIS_CONFIG_CHANNEL, routing_snapshot
from tests.controlplane.conftest import policy_body, worker_body

pytestmark = pytest.mark.django_db

WORKER_KEYS = {
    "id",
    "url",
    "model",
    "state",
    "healthy",
    "block_size",
    "capacity_blocks",
    "network_ms",
    "kv_events_endpoint",
    "replay_endpoint",
    "labels",
}
VERSION_KEYS = {"policy", "version_id", "version", "type", "params"}


def fleet(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body("sim-0"), format="json")
    operator.post(
        "/api/workers/",
        worker_body("sim-1", kv_events_endpoint="", replay_endpoint=""),
        format="json",
    )
    operator.post("/api/policies/", policy_body("kv"), format="json")
    operator.post(
        "/api/policies/", policy_body("least", type="least_load", params={}), format="json"
    )
    operator.post("/api/policies/kv/activate/", {"version": 1}, format="json")


def test_snapshot_document_shape(operator: APIClient, reader: APIClient) -> None:
    fleet(operator)
    operator.post(
        "/api/experiments/",
        {
            "name": "ab",
            "model": "sim-8b",
            "sticky_key": "tenant",
            "arms": [
                {"name": "A", "policy": "kv", "version": 1, "share": 70},
                {"name": "B", "policy": "least", "version": 1, "share": 30},
            ],
        },
        format="json",
    )
    draft = reader.get("/api/routing-snapshot/").json()
    assert draft["models"]["sim-8b"]["experiment"] is None  # drafts do not route
    operator.post("/api/experiments/ab/start/")

    doc = reader.get("/api/routing-snapshot/").json()
    assert set(doc) == {"revision", "generated_at", "workers", "models"}
    assert re.fullmatch(r"[0-9a-f]{40}", doc["revision"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["generated_at"])
    body = {"workers": doc["workers"], "models": doc["models"]}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert doc["revision"] == hashlib.sha1(canonical.encode()).hexdigest()

    sim0, sim1 = doc["workers"]
    assert set(sim0) == WORKER_KEYS
    assert sim0 == {
        "id": "sim-0",
        "url": "http://127.0.0.1:8101",
        "model": "sim-8b",
        "state": "active",
        "healthy": True,
        "block_size": 16,
        "capacity_blocks": 4096,
        "network_ms": 0.5,
        "kv_events_endpoint": "tcp://127.0.0.1:5601",
        "replay_endpoint": "tcp://127.0.0.1:5701",
        "labels": {"zone": "a"},
    }
    assert (sim1["kv_events_endpoint"], sim1["replay_endpoint"]) == (None, None)

    route = doc["models"]["sim-8b"]
    assert set(route) == {"active", "experiment"}
    assert set(route["active"]) == VERSION_KEYS
    assert (route["active"]["policy"], route["active"]["version"], route["active"]["type"]) == (
        "kv",
        1,
        "kv_score",
    )
    experiment = route["experiment"]
    assert set(experiment) == {"id", "name", "sticky_key", "arms", "shadow"}
    assert (experiment["name"], experiment["sticky_key"], experiment["shadow"]) == (
        "ab",
        "tenant",
        None,
    )
    assert [set(a) for a in experiment["arms"]] == [VERSION_KEYS | {"name", "share"}] * 2
    assert [(a["name"], a["type"], a["share"]) for a in experiment["arms"]] == [
        ("A", "kv_score", 70),
        ("B", "least_load", 30),
    ]


def test_revision_tracks_routing_changes_not_load(operator: APIClient) -> None:
    fleet(operator)
    rev = routing_snapshot()["revision"]
    operator.post(
        "/api/workers/sim-0/heartbeat/", {"running": 7, "kv_usage_frac": 0.9}, format="json"
    )
    assert routing_snapshot()["revision"] == rev
    operator.post("/api/workers/sim-0/drain/")
    drained = routing_snapshot()["revision"]
    assert drained != rev
    Worker.objects.filter(name="sim-1").update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    stale = routing_snapshot()
    assert stale["revision"] != drained
    assert [w["healthy"] for w in stale["workers"]] == [True, False]
    operator.post("/api/policies/kv/versions/", {"params": {"cache_weight": 9.0}}, format="json")
    assert routing_snapshot()["revision"] == stale["revision"]  # a new version routes nothing yet
    operator.post("/api/policies/kv/activate/", {"version": 2}, format="json")
    assert routing_snapshot()["models"]["sim-8b"]["active"]["params"]["cache_weight"] == 9.0


@pytest.fixture
def config_listener() -> str:
    layer = get_channel_layer()
    assert layer is not None
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(CONFIG_GROUP, channel)
    return channel


def test_changes_publish_on_commit_to_the_channel_layer(
    operator: APIClient, config_listener: str, django_capture_on_commit_callbacks: Any
) -> None:
    layer = get_channel_layer()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        operator.post("/api/workers/", worker_body(), format="json")
    assert len(callbacks) == 1
    message = async_to_sync(layer.receive)(config_listener)  # type: ignore[union-attr]
    assert message == {"type": "config.changed", "revision": routing_snapshot()["revision"]}

    # A routine heartbeat of a healthy worker, an invalid write and a no-op announce nothing.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        operator.post("/api/workers/sim-0/heartbeat/", {"running": 1}, format="json")
        operator.post("/api/workers/", worker_body(base_url="ftp://x"), format="json")
        operator.patch("/api/workers/sim-0/", {"network_ms": 0.5}, format="json")
    assert callbacks == []

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        operator.post("/api/policies/", policy_body(), format="json")  # routes nothing yet
    assert callbacks == []
    for action in [
        lambda: operator.post("/api/policies/kv-default/activate/", {"version": 1}, format="json"),
        lambda: operator.post("/api/workers/sim-0/drain/"),
        lambda: operator.delete("/api/workers/sim-0/"),
    ]:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            action()
        assert len(callbacks) == 1
        message = async_to_sync(layer.receive)(config_listener)  # type: ignore[union-attr]
        assert message["revision"] == routing_snapshot()["revision"]


def test_changes_publish_on_redis_when_configured(
    operator: APIClient, redis_url: str, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    import redis

    settings.REDIS_URL = redis_url
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(REDIS_CONFIG_CHANNEL)
    try:
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
        with django_capture_on_commit_callbacks(execute=True):
            operator.post("/api/workers/", worker_body(), format="json")
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["type"] == "message"
        assert message["data"].decode() == routing_snapshot()["revision"]
    finally:
        pubsub.close()
        client.close()


def test_nothing_is_published_when_the_transaction_rolls_back(
    operator: APIClient, config_listener: str, django_capture_on_commit_callbacks: Any
) -> None:
    from django.db import transaction

    from controlplane.common.auth import SYSTEM
    from controlplane.registry.services import worker_register

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        worker_register(name="doomed", base_url="http://127.0.0.1:1", model="m", actor=SYSTEM)
        raise RuntimeError("abort")
    assert callbacks == []
    assert not Worker.objects.filter(name="doomed").exists()


def test_snapshot_etag_is_the_revision(operator: APIClient, reader: APIClient) -> None:
    fleet(operator)
    first = reader.get("/api/routing-snapshot/")
    etag = first["ETag"]
    assert etag == f'"{first.json()["revision"]}"'
    unchanged = reader.get("/api/routing-snapshot/", HTTP_IF_NONE_MATCH=etag)
    assert unchanged.status_code == 304 and unchanged["ETag"] == etag
    operator.post("/api/workers/sim-1/drain/")
    changed = reader.get("/api/routing-snapshot/", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag


def test_the_gateway_parses_the_snapshot(operator: APIClient, reader: APIClient) -> None:
    # Both sides of the seam: the control plane's document through the gateway's parser.
    from routing.gateway.snapshot import parse_snapshot

    fleet(operator)
    operator.post("/api/workers/sim-1/drain/")
    operator.post("/api/workers/", worker_body("sim-2"), format="json")
    operator.patch("/api/workers/sim-2/", {"state": "disabled"}, format="json")
    operator.post(
        "/api/experiments/",
        {
            "name": "ab",
            "model": "sim-8b",
            "arms": [
                {"policy": "kv", "version": 1, "share": 50},
                {"policy": "least", "version": 1, "share": 50},
            ],
            "shadow_version_id": operator.get("/api/policies/least/").json()["versions"][0][
                "version_id"
            ],
        },
        format="json",
    )
    operator.post("/api/experiments/ab/start/")
    snapshot = parse_snapshot(reader.get("/api/routing-snapshot/").json())
    assert [(w.id, w.state) for w in snapshot.workers] == [
        ("sim-0", "active"),
        ("sim-1", "draining"),
    ]
    assert snapshot.workers[0].kv_events_endpoint == "tcp://127.0.0.1:5601"
    route = snapshot.models["sim-8b"]
    assert route.active is not None and route.experiment is not None
    assert [(a.name, a.share) for a in route.experiment.arms] == [("A", 50.0), ("B", 50.0)]
    assert route.experiment.shadow is not None


def test_health_flips_publish_but_steady_probes_do_not(
    operator: APIClient, config_listener: str, django_capture_on_commit_callbacks: Any
) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    Worker.objects.filter(name="sim-0").update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        operator.post("/api/workers/sim-0/heartbeat/", {}, format="json")  # stale -> healthy
    assert len(callbacks) == 1
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        for _ in range(2):
            operator.post("/api/workers/sim-0/probe/", {"ok": False}, format="json")
    assert callbacks == []  # still healthy after two failures
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        operator.post("/api/workers/sim-0/probe/", {"ok": False}, format="json")  # third: unhealthy
    assert len(callbacks) == 1
    assert routing_snapshot()["workers"][0]["healthy"] is False
