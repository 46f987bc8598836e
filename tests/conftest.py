"""Fixtures shared by the whole suite: real Redis and Postgres when reachable,
otherwise a skip that says why."""

from __future__ import annotations

import os
import socket

import pytest


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def redis_url() -> str:
    """A Redis URL on database 15, flushed before the test; skips when none runs."""
    url = os.environ.get("KVROUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    if not _reachable("127.0.0.1", 6379) and "127.0.0.1:6379" in url:
        pytest.skip("Redis is not running at 127.0.0.1:6379 (make test starts it when installed)")
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url
