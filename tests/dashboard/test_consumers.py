from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from controlplane.jobs import EmbeddedScheduler
from controlplane.telemetry.sources import MemorySinkSource
from dashboard.consumers import CLOSE_UNAUTHENTICATED
from dashboard.routing import websocket_urlpatterns
from routing.gateway.records import MemorySink
from tests.controlplane.telemetry.test_drain import make_record

APP = URLRouter(websocket_urlpatterns)


async def in_thread(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run sync DB code in a worker thread and close that thread's connection after (an
    open one would block dropping the Postgres test database)."""
    from django.db import connections

    def run():  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


def communicator(user: object) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(APP, "/ws/dashboard/")
    comm.scope["user"] = user
    return comm


async def test_anonymous_sockets_are_refused() -> None:
    comm = communicator(AnonymousUser())
    connected, code = await comm.connect()
    assert not connected and code == CLOSE_UNAUTHENTICATED


@pytest.mark.django_db(transaction=True)
async def test_group_updates_reach_the_page_and_pause_stops_them() -> None:
    user = await database_sync_to_async(User.objects.create_user)("u", password="p-123-abc")
    comm = communicator(user)
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from())["kind"] == "hello"
    layer = get_channel_layer()
    msg = {"type": "dashboard.update", "kind": "overview", "points": [{"t": "x", "rps": 1.0}]}
    await layer.group_send("dashboard", msg)
    got = await comm.receive_json_from(timeout=2)
    assert got == {"kind": "overview", "points": [{"t": "x", "rps": 1.0}]}

    await comm.send_json_to({"action": "pause"})
    await comm.send_json_to({"action": "ping"})
    assert (await comm.receive_json_from())["kind"] == "pong"  # pause took effect before this
    await layer.group_send("dashboard", msg)
    assert await comm.receive_nothing(timeout=0.3)
    await comm.send_json_to({"action": "resume"})
    await comm.send_json_to({"action": "ping"})
    assert (await comm.receive_json_from())["kind"] == "pong"
    await layer.group_send("dashboard", msg)
    assert (await comm.receive_json_from(timeout=2))["kind"] == "overview"

    await comm.send_json_to({"action": "dance"})
    assert (await comm.receive_json_from())["kind"] == "error"
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_embedded_scheduler_pushes_drained_minutes_to_the_socket() -> None:
    """The scheduler thread drains the in-process sink and publishes on the serving loop."""
    user = await database_sync_to_async(User.objects.create_user)("u2", password="p-123-abc")
    comm = communicator(user)
    assert (await comm.connect())[0]
    await comm.receive_json_from()  # hello
    sink = MemorySink()
    sink.append_many([make_record(i) for i in range(20)])
    scheduler = EmbeddedScheduler(
        source=MemorySinkSource(sink, name="m"), loop=asyncio.get_running_loop(), targets=[]
    )
    ran = await in_thread(scheduler.run_due, now_s=0.0)
    assert ran == ["drain_request_stream", "scrape_fleet", "experiment_results", "retention"]
    assert all(j.failures == 0 for j in scheduler.jobs), [j.last_error for j in scheduler.jobs]
    got = await comm.receive_json_from(timeout=3)
    assert got["kind"] == "overview"
    assert [p["requests"] for p in got["points"]] == [10, 10]  # two 10 s buckets
    # Nothing is due again before the interval passes.
    assert await in_thread(scheduler.run_due, now_s=0.1) == []
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_celery_style_publish_through_redis_reaches_the_socket(
    redis_url: str, settings
) -> None:  # type: ignore[no-untyped-def]
    """The fleet path: a Celery worker drains the Redis stream and publishes through the
    Redis channel layer (from sync code); the web process's socket receives the points."""
    from controlplane.telemetry import tasks
    from controlplane.telemetry.sources import RedisStreamSource

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis_url], "prefix": "kvroute-test"},
        }
    }
    user = await database_sync_to_async(User.objects.create_user)("u3", password="p-123-abc")
    comm = communicator(user)
    assert (await comm.connect())[0]
    await comm.receive_json_from()  # hello
    writer = RedisStreamSource(url=redis_url)
    for i in range(5):
        writer.append(make_record(i))
    writer.close()

    def celery_worker() -> int:
        source = RedisStreamSource(url=redis_url)
        try:
            result = tasks.drain_request_stream_run(source=source, publish=tasks.channel_publish)
            return result.entries if result else -1
        finally:
            source.close()

    assert await in_thread(celery_worker) == 5
    got = await comm.receive_json_from(timeout=5)
    assert got["kind"] == "overview" and sum(p["requests"] for p in got["points"]) == 5
    await comm.disconnect()
    await get_channel_layer().close_pools()
