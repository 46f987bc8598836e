"""Control-plane fixtures: API clients per token scope, and builders for workers and policies."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.common.auth import OPERATOR, Actor
from controlplane.common.services import api_token_create

OPS = Actor(label="test:operator", scope=OPERATOR)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    # SQLite's in-memory test database is shared between threads through a shared
    # cache whose table locks fail at once instead of waiting; the concurrency tests
    # need real waiting, so use a throwaway file (one per test process).
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        path = os.path.join(tempfile.gettempdir(), f"kvroute-test-cp-{os.getpid()}.sqlite3")
        db.setdefault("TEST", {})["NAME"] = path
    elif not db.get("TEST", {}).get("NAME"):
        # Several engineers' suites share one Postgres: a test database per process.
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def _static_root() -> None:
    # WhiteNoise warns (an error under filterwarnings=error) when STATIC_ROOT is missing,
    # as it is before `collectstatic`.
    from django.conf import settings

    os.makedirs(settings.STATIC_ROOT, exist_ok=True)


def client_with(secret: str | None) -> APIClient:
    client = APIClient()
    if secret is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def make_token(db: None) -> Callable[..., str]:
    counter = iter(range(10_000))

    def make(scope: str, name: str | None = None) -> str:
        _, secret = api_token_create(name=name or f"{scope}-{next(counter)}", scope=scope)
        return secret

    return make


@pytest.fixture
def operator(make_token: Callable[..., str]) -> APIClient:
    return client_with(make_token("operator"))


@pytest.fixture
def worker_agent(make_token: Callable[..., str]) -> APIClient:
    return client_with(make_token("worker"))


@pytest.fixture
def reader(make_token: Callable[..., str]) -> APIClient:
    return client_with(make_token("read"))


@pytest.fixture
def anon(db: None) -> APIClient:
    return APIClient()


def worker_body(name: str = "sim-0", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "base_url": "http://127.0.0.1:8101",
        "model": "sim-8b",
        "kv_events_endpoint": "tcp://127.0.0.1:5601",
        "replay_endpoint": "tcp://127.0.0.1:5701",
        "block_size": 16,
        "capacity_blocks": 4096,
        "network_ms": 0.5,
        "labels": {"zone": "a"},
    }
    body.update(overrides)
    return body


def policy_body(name: str = "kv-default", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "model": "sim-8b",
        "type": "kv_score",
        "params": {"cache_weight": 2.0},
    }
    body.update(overrides)
    return body
