"""HTTP routes served by the gateway consumers, and the one `GatewayHandle` the product's
ASGI app (`controlplane.asgi.application`) holds.

- `gateway`: that handle. Its state is built on the serving loop by the lifespan startup
  (`lifespan_app`) or by the first request; by default from the environment
  (`GatewayConfig.from_env`) with the snapshot read from the control plane in this process,
  or over HTTP when `KVROUTE_CONTROL_PLANE_URL` is set.
- `gateway_urlpatterns(handle)`: the routes bound to any handle (tests build their own).
- `gateway_app(handle)`: a standalone ASGI app (gateway routes + lifespan + 404), no Django
  URLconf needed; used by tests and benchmarks.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.routing import URLRouter
from django.urls import path, re_path

from routing.gateway.consumers import (
    ChatCompletionsConsumer,
    CompletionsConsumer,
    GatewayHandle,
    HealthConsumer,
    MetricsConsumer,
    ModelsConsumer,
    NotFoundConsumer,
)

log = logging.getLogger(__name__)


def gateway_urlpatterns(handle: GatewayHandle) -> list[Any]:
    return [
        path("v1/chat/completions", ChatCompletionsConsumer.as_asgi(handle=handle)),
        path("v1/completions", CompletionsConsumer.as_asgi(handle=handle)),
        path("v1/models", ModelsConsumer.as_asgi(handle=handle)),
        path("gateway/metrics", MetricsConsumer.as_asgi(handle=handle)),
        path("gateway/health", HealthConsumer.as_asgi(handle=handle)),
    ]


def lifespan_app(handle: GatewayHandle) -> Any:
    """ASGI lifespan: start the gateway state at startup, stop it at shutdown."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await handle.startup()
                except Exception as exc:
                    log.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await handle.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    return app


def gateway_app(handle: GatewayHandle) -> Any:
    """The gateway alone as an ASGI app (http + lifespan)."""
    router = URLRouter(
        [*gateway_urlpatterns(handle), re_path(r"", NotFoundConsumer.as_asgi(handle=handle))]
    )
    lifespan = lifespan_app(handle)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(scope, receive, send)
        elif scope["type"] == "http":
            await router(scope, receive, send)
        else:
            raise ValueError(f"gateway app does not serve {scope['type']!r}")

    return app


gateway = GatewayHandle()
http_urlpatterns: list[Any] = gateway_urlpatterns(gateway)
