"""REST API routes; each app contributes its own `urls.py`."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("", include("controlplane.registry.urls")),
    path("", include("controlplane.policies.urls")),
    path("", include("controlplane.telemetry.urls")),
]
