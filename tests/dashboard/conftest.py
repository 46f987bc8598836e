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
