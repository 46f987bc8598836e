"""Worker registry over HTTP: idempotent registration, filters, lifecycle, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.registry.models import Worker
from tests.controlplane.conftest import worker_body

pytestmark = pytest.mark.django_db


def test_register_is_idempotent_by_name(operator: APIClient) -> None:
    first = operator.post("/api/workers/", worker_body(), format="json")
    assert first.status_code == 201
    body = first.json()
    assert body["name"] == "sim-0"
    assert body["healthy"] is True  # registering counts as a heartbeat
    assert body["state"] == "active"
    again = operator.post(
        "/api/workers/",
        worker_body(base_url="http://127.0.0.1:9000/", capacity_blocks=8192),
        format="json",
    )
    assert again.status_code == 200
    assert again.json()["base_url"] == "http://127.0.0.1:9000"  # trailing slash dropped
    assert again.json()["capacity_blocks"] == 8192
    assert Worker.objects.count() == 1


def test_reregister_keeps_a_drained_worker_drained(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    assert operator.post("/api/workers/sim-0/drain/").json()["state"] == "draining"
    assert (
        operator.post("/api/workers/", worker_body(), format="json").json()["state"] == "draining"
    )
    assert operator.post("/api/workers/sim-0/enable/").json()["state"] == "active"


def test_list_filters_by_model_state_and_health(operator: APIClient) -> None:
    for name, model in [("a", "m1"), ("b", "m1"), ("c", "m2")]:
        operator.post("/api/workers/", worker_body(name, model=model), format="json")
    operator.post("/api/workers/b/drain/")
    Worker.objects.filter(name="c").update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))

    def names(query: str) -> list[str]:
        resp = operator.get(f"/api/workers/{query}")
        assert resp.status_code == 200
        return [w["name"] for w in resp.json()]

    assert names("") == ["a", "b", "c"]
    assert names("?model=m1") == ["a", "b"]
    assert names("?state=draining") == ["b"]
    assert names("?healthy=true") == ["a", "b"]
    assert names("?healthy=false") == ["c"]
    assert names("?model=m1&state=active&healthy=true") == ["a"]
    bad = operator.get("/api/workers/?state=sleeping")
    assert bad.status_code == 400 and "state" in bad.json()
    assert operator.get("/api/workers/?healthy=maybe").status_code == 400


def test_heartbeat_records_load_and_restores_health(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    Worker.objects.filter(name="sim-0").update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    assert operator.get("/api/workers/sim-0/").json()["healthy"] is False
    resp = operator.post(
        "/api/workers/sim-0/heartbeat/",
        {"running": 3, "waiting": 2, "kv_usage_frac": 0.42, "inflight": 5, "capacity_blocks": 1000},
        format="json",
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["healthy"] is True
    assert body["load"] == {"running": 3, "waiting": 2, "kv_usage_frac": 0.42, "inflight": 5}
    assert body["capacity_blocks"] == 1000


def test_failing_probes_make_a_worker_unhealthy(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    for _ in range(2):
        assert operator.post(
            "/api/workers/sim-0/probe/", {"ok": False, "error": "refused"}, format="json"
        ).json()["healthy"]
    third = operator.post(
        "/api/workers/sim-0/probe/", {"ok": False, "error": "refused"}, format="json"
    ).json()
    assert third["healthy"] is False
    assert third["probe"]["failures"] == 3 and third["probe"]["error"] == "refused"
    ok = operator.post("/api/workers/sim-0/probe/", {"ok": True}, format="json").json()
    assert ok["healthy"] is True and ok["probe"]["failures"] == 0


def test_patch_and_deregister(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    resp = operator.patch(
        "/api/workers/sim-0/",
        {"network_ms": 2.5, "state": "disabled", "labels": {"zone": "b"}},
        format="json",
    )
    assert resp.status_code == 200
    assert (resp.json()["network_ms"], resp.json()["state"], resp.json()["labels"]) == (
        2.5,
        "disabled",
        {"zone": "b"},
    )
    assert operator.patch("/api/workers/sim-0/", {"healthy": True}, format="json").json() == {
        "healthy": ["Unknown or read-only field."]
    }
    assert operator.delete("/api/workers/sim-0/").status_code == 204
    assert operator.get("/api/workers/sim-0/").status_code == 404
    assert operator.delete("/api/workers/sim-0/").status_code == 404
    assert operator.post("/api/workers/nope/heartbeat/", {}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"base_url": "ftp://127.0.0.1:8101"}, "base_url"),
        ({"base_url": "127.0.0.1:8101"}, "base_url"),
        ({"base_url": "http://"}, "base_url"),
        ({"base_url": "http://host:99999"}, "base_url"),
        ({"base_url": "javascript:alert(1)"}, "base_url"),
        ({"kv_events_endpoint": "http://127.0.0.1:5601"}, "kv_events_endpoint"),
        ({"replay_endpoint": "tcp://127.0.0.1"}, "replay_endpoint"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": "sixteen"}, "block_size"),
        ({"capacity_blocks": -1}, "capacity_blocks"),
        ({"network_ms": -1.0}, "network_ms"),
        ({"network_ms": "NaN"}, "network_ms"),
        ({"network_ms": "Infinity"}, "network_ms"),
        ({"labels": ["a"]}, "labels"),
        ({"name": "has space"}, "name"),
        ({"name": ""}, "name"),
        ({"model": "two words"}, "model"),
    ],
)
def test_register_rejects_bad_input_naming_the_field(
    operator: APIClient, overrides: dict[str, object], field: str
) -> None:
    resp = operator.post("/api/workers/", worker_body(**overrides), format="json")
    assert resp.status_code == 400, resp.content
    assert list(resp.json()) == [field]
    assert Worker.objects.count() == 0


def test_heartbeat_rejects_out_of_range_load(operator: APIClient) -> None:
    operator.post("/api/workers/", worker_body(), format="json")
    for body, field in [
        ({"kv_usage_frac": 1.5}, "kv_usage_frac"),
        ({"kv_usage_frac": "NaN"}, "kv_usage_frac"),
        ({"running": -1}, "running"),
        ({"block_size": 0}, "block_size"),
    ]:
        resp = operator.post("/api/workers/sim-0/heartbeat/", body, format="json")
        assert resp.status_code == 400 and list(resp.json()) == [field], body


def test_malformed_json_is_400(operator: APIClient) -> None:
    for raw in ['{"name": ', '{"name": "x", "network_ms": NaN}', "[1, 2"]:
        resp = operator.post("/api/workers/", raw, content_type="application/json")
        assert resp.status_code == 400
        assert "JSON parse error" in resp.json()["detail"]
