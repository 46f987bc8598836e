"""The whole product app (Django control plane + gateway, `controlplane.asgi.application`)
under uvicorn: the gateway's snapshot comes from the control plane in the same process and
follows policy changes made through the control plane's services."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Any

import httpx
import pytest

from routing.gateway.config import GatewayConfig
from routing.gateway.records import MemorySink
from routing.gateway.serve import serve_in_thread
from tests.gateway.conftest import MODEL, chat_body, post


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    # A file database: the gateway reads it from its own thread while the test writes, and
    # SQLite's shared-cache in-memory database fails such table locks instead of waiting.
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db.setdefault("TEST", {})["NAME"] = os.path.join(
            tempfile.gettempdir(), f"kvroute-test-gw-{os.getpid()}.sqlite3"
        )
    elif not db.get("TEST", {}).get("NAME"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


@pytest.mark.django_db(transaction=True)
def test_product_app_routes_with_the_control_planes_snapshot(fleet_factory: Any) -> None:
    from django.conf import settings

    from controlplane.common.auth import SYSTEM
    from controlplane.policies.services import policy_activate, policy_create, policy_version_add
    from controlplane.registry.services import worker_register

    os.makedirs(settings.STATIC_ROOT, exist_ok=True)
    fleet = fleet_factory(2)
    for i, w in enumerate(fleet.workers):
        worker_register(
            name=f"sim-{i}",
            base_url=fleet.urls[i],
            model=MODEL,
            actor=SYSTEM,
            kv_events_endpoint=w.events_endpoint or "",
            replay_endpoint=w.replay_endpoint or "",
            labels={"tokenizer": "builtin"},
        )
    policy_create(name="kv-default", model=MODEL, type="kv_score", params={}, actor=SYSTEM)
    policy_activate(policy_name="kv-default", version=1, actor=SYSTEM)

    from controlplane.asgi import application
    from routing.gateway.routing import gateway

    saved_config = gateway.config
    gateway.config = GatewayConfig.from_env(
        listen_channel_layer=True, snapshot_poll_s=0.3, metrics_interval_s=0.2
    )
    server = serve_in_thread(application)
    try:
        resp = post(server.url, "/v1/chat/completions", chat_body("hello from the product " * 20))
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-kvroute-policy"] == "kv-default@1"
        assert resp.headers["x-kvroute-worker"] in ("sim-0", "sim-1")
        models = httpx.get(server.url + "/v1/models").json()
        assert [(m["id"], m["workers"]) for m in models["data"]] == [(MODEL, 2)]

        policy_version_add(policy_name="kv-default", type="least_load", params={}, actor=SYSTEM)
        policy_activate(policy_name="kv-default", version=2, actor=SYSTEM)
        deadline = time.monotonic() + 5
        while True:
            resp = post(server.url, "/v1/chat/completions", chat_body("after the change"))
            if resp.headers.get("x-kvroute-policy") == "kv-default@2":
                break
            assert time.monotonic() < deadline, "gateway did not pick up the new active version"
            time.sleep(0.1)

        # A gateway in another process reads the same snapshot over HTTP with a read token.
        from controlplane.common.services import api_token_create
        from routing.gateway.consumers import GatewayHandle
        from routing.gateway.routing import gateway_app
        from routing.gateway.serve import ServerThread
        from routing.gateway.snapshot import HttpSnapshotSource
        from routing.gateway.state import build_gateway_state

        _, secret = api_token_create(name="gateway-b", scope="read")
        remote_cfg = GatewayConfig(
            control_plane_url=server.url, control_plane_token=secret, metrics_interval_s=0
        )
        remote = GatewayHandle(lambda: build_gateway_state(remote_cfg), config=remote_cfg)
        other = ServerThread(gateway_app(remote)).start()
        try:
            resp = post(other.url, "/v1/chat/completions", chat_body("over http"))
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-kvroute-policy"] == "kv-default@2"
            source = remote.state.refresher._source
            assert isinstance(source, HttpSnapshotSource)
            revision = remote.state.snapshot.revision
            fut = asyncio.run_coroutine_threadsafe(remote.state.refresher.refresh(), other.loop)
            assert fut.result(5) is True
            assert source.not_modified >= 1  # answered 304: the same document is kept
            assert remote.state.snapshot.revision == revision
        finally:
            other.stop()

        # Django still serves everything that is not the gateway's.
        assert httpx.get(server.url + "/api/routing-snapshot/").status_code in (200, 401, 403)
        time.sleep(0.2)
        sink = gateway.state.records.sink if gateway.state else None
        assert isinstance(sink, MemorySink)
        policies = {r["policy_version_id"] for _, r in sink.read()}
        assert len(policies) == 2
    finally:
        server.stop()
        gateway.config = saved_config
    assert gateway.state is None  # lifespan shutdown stopped it


@pytest.mark.django_db(transaction=True)
def test_an_activation_through_the_api_reaches_the_gateway_by_notice(fleet_factory: Any) -> None:
    from django.conf import settings

    from controlplane.common.auth import SYSTEM
    from controlplane.common.services import api_token_create
    from controlplane.policies.services import policy_create, policy_version_add
    from controlplane.registry.services import worker_register

    os.makedirs(settings.STATIC_ROOT, exist_ok=True)
    fleet = fleet_factory(1, kv_events=False)
    worker_register(name="sim-0", base_url=fleet.urls[0], model=MODEL, actor=SYSTEM)
    policy_create(name="notice-test", model=MODEL, type="kv_score", params={}, actor=SYSTEM)
    policy_version_add(policy_name="notice-test", type="round_robin", params={}, actor=SYSTEM)
    _, operator = api_token_create(name="ops-notice", scope="operator")

    from controlplane.asgi import application
    from routing.gateway.routing import gateway

    saved_config = gateway.config
    # No polling to speak of: only the change notice can bring the new version in time.
    gateway.config = GatewayConfig.from_env(
        listen_channel_layer=True, snapshot_poll_s=600, metrics_interval_s=0
    )
    server = serve_in_thread(application)
    try:
        # Workers but no active version yet: the gateway's built-in default policy routes.
        resp = post(server.url, "/v1/chat/completions", chat_body("before"))
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-kvroute-policy"] == "default"
        for version in (1, 2):
            r = httpx.post(
                server.url + "/api/policies/notice-test/activate/",
                json={"version": version},
                headers={"Authorization": f"Bearer {operator}"},
                timeout=10,
            )
            assert r.status_code in (200, 201), r.text
            deadline = time.monotonic() + 3
            while True:
                resp = post(server.url, "/v1/chat/completions", chat_body(f"v{version}"))
                if resp.headers.get("x-kvroute-policy") == f"notice-test@{version}":
                    break
                assert time.monotonic() < deadline, (
                    f"version {version} not picked up: {resp.headers}"
                )
                time.sleep(0.05)
        assert gateway.state is not None and gateway.state.refresher.refreshes >= 3
    finally:
        server.stop()
        gateway.config = saved_config
