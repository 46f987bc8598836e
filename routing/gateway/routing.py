"""HTTP routes served by the gateway consumers (/v1/*)."""

from __future__ import annotations

http_urlpatterns: list = []
