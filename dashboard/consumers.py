"""Live dashboard updates over a websocket: the consumer joins the `dashboard` group and
forwards what the telemetry jobs publish there (new minute points, fleet samples)."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

DASHBOARD_GROUP = "dashboard"
CLOSE_UNAUTHENTICATED = 4401


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Logged-in users only. The page may send {"action": "pause"} while its tab is
    hidden and {"action": "resume"} when shown; nothing is forwarded in between."""

    paused = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not getattr(user, "is_authenticated", False):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "group": DASHBOARD_GROUP})

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        action = content.get("action") if isinstance(content, dict) else None
        if action == "pause":
            self.paused = True
        elif action == "resume":
            self.paused = False
        elif action == "ping":
            await self.send_json({"kind": "pong"})
        else:
            await self.send_json(
                {"kind": "error", "detail": "action must be one of pause, resume, ping"}
            )

    async def dashboard_update(self, event: dict[str, Any]) -> None:
        if self.paused:
            return
        await self.send_json({k: v for k, v in event.items() if k != "type"})
