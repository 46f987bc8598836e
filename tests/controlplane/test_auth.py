"""Who may do what: 401 without valid credentials, 403 for the wrong scope."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from controlplane.common.models import ApiToken
from controlplane.common.services import api_token_revoke
from tests.controlplane.conftest import client_with, policy_body, worker_body

pytestmark = pytest.mark.django_db


def test_no_token_is_401_with_bearer_challenge(anon: APIClient) -> None:
    for method, url in [
        ("get", "/api/workers/"),
        ("post", "/api/workers/"),
        ("get", "/api/routing-snapshot/"),
        ("post", "/api/policies/"),
        ("get", "/api/experiments/"),
    ]:
        resp = getattr(anon, method)(url, {}, format="json")
        assert resp.status_code == 401, (method, url)
        assert resp["WWW-Authenticate"].startswith("Bearer")


def test_unknown_malformed_and_revoked_tokens_are_401(make_token: Callable[..., str]) -> None:
    assert client_with("kvr_not-a-real-token").get("/api/workers/").status_code == 401
    malformed = APIClient()
    malformed.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    assert malformed.get("/api/workers/").status_code == 401
    secret = make_token("operator", name="soon-revoked")
    assert client_with(secret).get("/api/workers/").status_code == 200
    api_token_revoke(name="soon-revoked")
    resp = client_with(secret).get("/api/workers/")
    assert resp.status_code == 401
    assert "revoked" in resp.json()["detail"]


def test_read_token_reads_but_cannot_write(reader: APIClient) -> None:
    assert reader.get("/api/workers/").status_code == 200
    assert reader.get("/api/routing-snapshot/").status_code == 200
    assert reader.post("/api/workers/", worker_body(), format="json").status_code == 403
    assert reader.post("/api/policies/", policy_body(), format="json").status_code == 403


def test_worker_token_manages_its_own_workers_only(
    make_token: Callable[..., str], operator: APIClient
) -> None:
    agent_a = client_with(make_token("worker", name="agent-a"))
    agent_b = client_with(make_token("worker", name="agent-b"))
    assert agent_a.post("/api/workers/", worker_body("w-a"), format="json").status_code == 201
    assert (
        agent_a.post("/api/workers/w-a/heartbeat/", {"running": 1}, format="json").status_code
        == 200
    )
    # Another agent may neither heartbeat, drain, re-register nor delete it.
    assert agent_b.post("/api/workers/w-a/heartbeat/", {}, format="json").status_code == 403
    assert agent_b.post("/api/workers/w-a/drain/").status_code == 403
    assert agent_b.post("/api/workers/", worker_body("w-a"), format="json").status_code == 403
    assert agent_b.delete("/api/workers/w-a/").status_code == 403
    # Operator-only actions are closed to worker tokens even on their own workers.
    assert agent_a.post("/api/workers/w-a/enable/").status_code == 403
    assert agent_a.patch("/api/workers/w-a/", {"network_ms": 1.0}, format="json").status_code == 403
    assert agent_a.post("/api/policies/", policy_body(), format="json").status_code == 403
    assert agent_a.post("/api/workers/w-a/drain/").status_code == 200
    assert agent_a.delete("/api/workers/w-a/").status_code == 204
    # An operator-registered worker belongs to no agent.
    assert operator.post("/api/workers/", worker_body("w-op"), format="json").status_code == 201
    assert agent_a.post("/api/workers/w-op/heartbeat/", {}, format="json").status_code == 403


def test_open_reads_setting(anon: APIClient, settings: object) -> None:
    settings.KVROUTE_OPEN_READS = True  # type: ignore[attr-defined]
    assert anon.get("/api/workers/").status_code == 200
    assert anon.get("/api/routing-snapshot/").status_code == 200
    assert anon.post("/api/workers/", worker_body(), format="json").status_code == 401


def test_staff_session_is_operator_and_needs_csrf() -> None:
    user_model = get_user_model()
    staff = user_model.objects.create_user("ops", password="pw-123456", is_staff=True)
    plain = user_model.objects.create_user("viewer", password="pw-123456")

    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.get("/api/workers/").status_code == 200
    # Session writes without the CSRF token are refused.
    resp = client.post("/api/workers/", worker_body(), format="json")
    assert resp.status_code == 403
    assert "CSRF" in resp.json()["detail"]
    # What a browser holds after loading a page: the CSRF cookie, echoed in a header.
    token = get_random_string(32)
    client.cookies["csrftoken"] = token
    resp = client.post("/api/workers/", worker_body(), format="json", HTTP_X_CSRFTOKEN=token)
    assert resp.status_code == 201
    assert resp.json()["registered_by"] == "user:ops"

    viewer = APIClient()
    viewer.force_login(plain)
    assert viewer.get("/api/workers/").status_code == 200
    assert viewer.post("/api/workers/", worker_body("x"), format="json").status_code == 403


def test_createapitoken_prints_a_working_secret_once() -> None:
    out = io.StringIO()
    call_command("createapitoken", "--name", "ci", "--scope", "operator", stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("kvr_")
    row = ApiToken.objects.get(name="ci")
    assert secret not in (row.token_hash, row.prefix)  # only a hash is stored
    assert (
        client_with(secret).post("/api/workers/", worker_body(), format="json").status_code == 201
    )
    row.refresh_from_db()
    assert row.last_used_at is not None
    with pytest.raises(CommandError, match="already exists"):
        call_command("createapitoken", "--name", "ci", "--scope", "read", stdout=io.StringIO())


def test_browsable_api_renders_for_sessions_and_open_reads(settings: object) -> None:
    staff = get_user_model().objects.create_user("ops", password="pw-123456", is_staff=True)
    client = APIClient()
    client.force_login(staff)
    page = client.get("/api/workers/", HTTP_ACCEPT="text/html")
    assert page.status_code == 200 and b"Worker List" in page.content
    settings.KVROUTE_OPEN_READS = True  # type: ignore[attr-defined]
    anon_page = APIClient().get("/api/policies/", HTTP_ACCEPT="text/html")
    assert anon_page.status_code == 200 and b"Policy List" in anon_page.content
