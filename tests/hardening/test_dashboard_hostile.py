"""Dashboard pages with a NUL byte (%00) in their path or query: 404 or 400, never the 500
that reaching a PostgreSQL query with it would give. SQLite already answers 404, so these
run in make test's Postgres pass (scripts/test.sh) and skip on SQLite."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="NUL only breaks PostgreSQL queries; SQLite already answers 404",
    ),
]


@pytest.fixture
def staff() -> Client:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("ops", password="pw-123456", is_staff=True)
    client = Client(raise_request_exception=False)
    assert client.login(username="ops", password="pw-123456")
    return client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/workers/w%00/"),
        ("get", "/policies/p%00/"),
        ("get", "/experiments/e%00/"),
        ("get", "/requests/r%00/"),
        ("get", "/requests/?worker=%00"),
        ("post", "/workers/w%00/drain/"),
        ("post", "/experiments/e%00/start/"),
    ],
)
def test_nul_in_dashboard_path_or_query_is_not_a_500(staff: Client, method: str, path: str) -> None:
    resp = getattr(staff, method)(path)
    assert resp.status_code in (400, 404), resp.status_code
