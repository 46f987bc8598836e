"""Hostile-caller fixtures: the control plane served by uvicorn on a loopback port (the
ASGI path production uses), a fresh operator token per test, and a look at the database
after each refused request (a 4xx must leave nothing behind); one simulated vLLM worker
(workers/sim) and the gateway in front of it, each on its own loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    # The server thread and the test share the database, so the test database must be
    # visible across connections: a throwaway SQLite file (one per test process), or a
    # per-process Postgres database when DATABASE_URL points at Postgres.
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        path = os.path.join(tempfile.gettempdir(), f"kvroute-test-hardening-{os.getpid()}.sqlite3")
        db.setdefault("TEST", {})["NAME"] = path
    elif not db.get("TEST", {}).get("NAME"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_hardening_{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def _static_root() -> None:
    # WhiteNoise warns (an error under filterwarnings=error) when STATIC_ROOT is missing.
    from django.conf import settings

    os.makedirs(settings.STATIC_ROOT, exist_ok=True)


class LiveServer:
    """uvicorn serving an ASGI app from a daemon thread on 127.0.0.1:<free port>."""

    def __init__(self, app: Any, *, lifespan: str = "off") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            app, log_level="error", lifespan=lifespan, access_log=False, http="httptools"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def cp_server(django_db_setup: None) -> Iterator[LiveServer]:
    """The control plane's Django ASGI app (what `/api/` is routed to in production)."""
    from django.core.asgi import get_asgi_application

    with LiveServer(get_asgi_application()) as server:
        yield server


@pytest.fixture
def operator_token(transactional_db: None) -> str:
    from controlplane.common.services import api_token_create

    _, secret = api_token_create(name="hostile-operator", scope="operator")
    return secret


@pytest.fixture
def api(cp_server: LiveServer, operator_token: str) -> Iterator[httpx.Client]:
    """An operator's HTTP client for the live control plane."""
    with httpx.Client(
        base_url=cp_server.url,
        headers={"authorization": f"Bearer {operator_token}"},
        timeout=10,
    ) as client:
        yield client


@pytest.fixture
def db_state() -> Callable[[], dict[str, Any]]:
    """Every control-plane row that an API write can create or change, as plain values."""

    def snapshot() -> dict[str, Any]:
        from controlplane.policies.models import (
            Activation,
            ActiveVersion,
            Experiment,
            ExperimentArm,
            Policy,
            PolicyVersion,
        )
        from controlplane.registry.models import Worker

        def rows(model: Any, *exclude: str) -> list[dict[str, Any]]:
            return [
                {k: v for k, v in row.items() if k not in exclude}
                for row in model.objects.order_by("pk").values()
            ]

        return {
            "workers": rows(Worker),
            "policies": rows(Policy),
            "versions": rows(PolicyVersion),
            "active": rows(ActiveVersion),
            "activations": rows(Activation),
            "experiments": rows(Experiment),
            "arms": rows(ExperimentArm),
        }

    return snapshot


def openai_error(resp: httpx.Response) -> dict[str, Any] | None:
    """The `error` object of an OpenAI-shaped error body, or None if the body is not one."""
    try:
        body = resp.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return None
    err = body["error"]
    if not {"message", "type", "param", "code"} <= set(err) or not err["message"]:
        return None
    return err


SIM_MODEL = "sim-8b"
GATEWAY_MAX_BODY_BYTES = 256 * 1024
GATEWAY_MAX_TOKENS = 4096


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[Any]:
    """One simulated worker (dev profile, 100x faster than real time), no KV events."""
    from workers.sim.fleet import start_fleet

    with start_fleet(1, model=SIM_MODEL, profile="dev", time_scale=0.01, kv_events=False) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def sim_url(sim_fleet: Any) -> str:
    return str(sim_fleet.workers[0].url)


def gateway_snapshot(fleet: Any, *, policy: str = "kv_score") -> dict[str, Any]:
    """A routing snapshot (docs/contracts.md) sending SIM_MODEL to `fleet`'s workers."""
    return {
        "revision": "hardening-1",
        "generated_at": "2026-11-29T10:00:00Z",
        "workers": [
            {
                "id": w.id,
                "url": w.url,
                "model": w.model,
                "state": "active",
                "healthy": True,
                "block_size": w.block_size,
                "capacity_blocks": w.num_blocks,
                "network_ms": 0.0,
                "kv_events_endpoint": None,
                "replay_endpoint": None,
                "labels": {"tokenizer": "builtin"},
            }
            for w in fleet.workers
        ],
        "models": {
            SIM_MODEL: {
                "active": {
                    "policy": "hardening",
                    "version_id": 1,
                    "version": 1,
                    "type": policy,
                    "params": {},
                },
                "experiment": None,
            }
        },
    }


@contextlib.contextmanager
def serve_gateway(snapshot: dict[str, Any], **config: Any) -> Iterator[str]:
    """The gateway app (routing/gateway) on a loopback port, from a fixed snapshot."""
    from routing.gateway.config import GatewayConfig
    from routing.gateway.consumers import GatewayHandle
    from routing.gateway.routing import gateway_app
    from routing.gateway.state import build_gateway_state

    cfg = GatewayConfig(metrics_interval_s=0, **config)
    handle = GatewayHandle(lambda: build_gateway_state(cfg, snapshot=snapshot), config=cfg)
    with LiveServer(gateway_app(handle), lifespan="on") as server:
        yield server.url


@pytest.fixture(scope="module")
def gateway_url(sim_fleet: Any) -> Iterator[str]:
    """The gateway in front of the simulated worker, with small body and max_tokens limits."""
    with serve_gateway(
        gateway_snapshot(sim_fleet),
        max_body_bytes=GATEWAY_MAX_BODY_BYTES,
        max_tokens_limit=GATEWAY_MAX_TOKENS,
    ) as url:
        yield url
