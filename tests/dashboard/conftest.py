"""Dashboard fixtures: logged-in clients (operator = staff, viewer = read only)."""

from __future__ import annotations

import os

import pytest
from django.test import Client


@pytest.fixture(scope="session", autouse=True)
def _static_root() -> None:
    # WhiteNoise warns (an error under filterwarnings=error) when STATIC_ROOT is missing.
    from django.conf import settings

    os.makedirs(settings.STATIC_ROOT, exist_ok=True)


@pytest.fixture
def staff_user(db: None):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import User

    return User.objects.create_user("ops", password="ops-pass-123", is_staff=True)


@pytest.fixture
def ops_client(staff_user) -> Client:  # type: ignore[no-untyped-def]
    c = Client()
    c.force_login(staff_user)
    return c


@pytest.fixture
def viewer_client(db: None) -> Client:
    from django.contrib.auth.models import User

    c = Client()
    c.force_login(User.objects.create_user("viewer", password="viewer-pass-123"))
    return c


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    # The browser test serves the product from threads (uvicorn, jobs, gateway) that write
    # concurrently; SQLite's shared-cache in-memory test database fails lock waits at once,
    # so use a throwaway file like the control-plane suite does.
    import tempfile

    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        path = os.path.join(tempfile.gettempdir(), f"kvroute-test-dash-{os.getpid()}.sqlite3")
        db.setdefault("TEST", {})["NAME"] = path
    elif not db.get("TEST", {}).get("NAME"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"
