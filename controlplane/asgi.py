"""ASGI entry point: /v1/* to the gateway consumers, everything else to Django;
websockets to the dashboard."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from controlplane.jobs import with_embedded_jobs  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from routing.gateway.routing import gateway, http_urlpatterns, lifespan_app  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": URLRouter([*http_urlpatterns, re_path(r"", django_asgi_app)]),
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        # Gateway state start/stop, plus the embedded telemetry jobs when KVROUTE_EMBEDDED_JOBS=1.
        "lifespan": with_embedded_jobs(lifespan_app(gateway)),
    }
)
