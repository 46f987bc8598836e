"""Websocket routes of the dashboard."""

from __future__ import annotations

websocket_urlpatterns: list = []
