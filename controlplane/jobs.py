"""The embedded stand-in for Celery beat + worker, for when Redis is absent.

`EmbeddedScheduler` is a daemon thread that calls the same task functions Celery would
(controlplane.telemetry.tasks), on the intervals of the beat schedule in settings. The
demo starts it in-process next to the ASGI server:

    scheduler = EmbeddedScheduler(source=MemorySinkSource(gateway_sink), loop=server_loop)
    scheduler.start()
    ...
    scheduler.stop()

With `loop` given, dashboard updates are sent on that event loop (required for the
in-memory channel layer, whose queues belong to the loop serving the websockets);
without it they go through `async_to_sync` (fine for the Redis channel layer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, connections

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    name: str
    interval_s: float
    run: Callable[[], Any]
    next_s: float = 0.0
    runs: int = 0
    failures: int = 0
    last_error: str = ""
    last_result: Any = field(default=None, repr=False)


def loop_publisher(loop: asyncio.AbstractEventLoop) -> Callable[[dict[str, Any]], None]:
    """A publisher that sends dashboard updates on `loop` (thread-safe, fire and forget)."""
    from channels.layers import get_channel_layer

    from controlplane.telemetry.tasks import DASHBOARD_GROUP

    def publish(message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is None or loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(layer.group_send(DASHBOARD_GROUP, message), loop)

    return publish


class EmbeddedScheduler:
    """Runs the telemetry jobs periodically in one background thread.

    Jobs never overlap (one thread), a failing job is logged and retried on its next
    tick, and every job is idempotent, so running this next to a real Celery beat would
    only do redundant work, not double-count.
    """

    def __init__(
        self,
        *,
        source: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
        publish: Callable[[dict[str, Any]], None] | None = None,
        drain_interval_s: float | None = None,
        scrape_interval_s: float | None = None,
        results_interval_s: float | None = None,
        retention_interval_s: float | None = None,
        targets: Any = None,
        gateway_getter: Callable[[], Any] | None = None,
        tick_s: float = 0.2,
    ) -> None:
        from controlplane.telemetry import tasks

        if publish is None:
            publish = loop_publisher(loop) if loop is not None else tasks.channel_publish
        self.publish = publish
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_s = tick_s
        self.jobs = [
            Job(
                "drain_request_stream",
                drain_interval_s or settings.KVROUTE_TELEMETRY_DRAIN_INTERVAL_S,
                lambda: tasks.drain_request_stream_run(source=source, publish=publish),
            ),
            Job(
                "scrape_fleet",
                scrape_interval_s or settings.KVROUTE_TELEMETRY_SCRAPE_INTERVAL_S,
                lambda: tasks.scrape_fleet_run(
                    targets=targets, publish=publish, gateway_getter=gateway_getter
                ),
            ),
            Job(
                "experiment_results",
                results_interval_s or settings.KVROUTE_TELEMETRY_RESULTS_INTERVAL_S,
                tasks.experiment_results_run,
            ),
            Job(
                "retention",
                retention_interval_s or settings.KVROUTE_TELEMETRY_RETENTION_INTERVAL_S,
                tasks.retention_run,
            ),
        ]

    def run_due(self, *, now_s: float | None = None) -> list[str]:
        """Run every job whose time has come; returns their names (used by tests too)."""
        now_s = time.monotonic() if now_s is None else now_s
        ran = []
        for job in self.jobs:
            if now_s < job.next_s:
                continue
            job.next_s = now_s + job.interval_s
            try:
                job.last_result = job.run()
                job.runs += 1
            except Exception as exc:
                job.failures += 1
                job.last_error = f"{type(exc).__name__}: {exc}"
                logger.exception("embedded job %s failed", job.name)
            finally:
                # Drop this thread's connection between jobs (CONN_MAX_AGE applies), but
                # never inside a caller's transaction (management command under a test).
                if not connection.in_atomic_block:
                    close_old_connections()
            ran.append(job.name)
        return ran

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.run_due()
                self._stop.wait(self._tick_s)
        finally:
            connections.close_all()  # this thread's own connections

    def start(self) -> EmbeddedScheduler:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="kvroute-embedded-jobs", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, *, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def embedded_jobs_enabled() -> bool:
    """KVROUTE_EMBEDDED_JOBS=1 (set by `make demo` for the web process when REDIS_URL is
    unset) asks the web process to run the jobs itself."""
    return os.environ.get("KVROUTE_EMBEDDED_JOBS", "").strip().lower() in {"1", "true", "yes", "on"}


def gateway_record_source() -> Any:
    """The request records of the gateway in this process: its in-process MemorySink, or
    the Redis stream when the gateway writes there (None when neither is available)."""
    from controlplane.telemetry.sources import MemorySinkSource
    from controlplane.telemetry.tasks import default_source
    from routing.gateway.records import MemorySink
    from routing.gateway.routing import gateway

    sink = getattr(getattr(gateway.state, "records", None), "sink", None)
    if isinstance(sink, MemorySink):
        return MemorySinkSource(sink)
    return default_source()


def gateway_view() -> Any:
    """Per-worker BlockRemoved counts and KV-event stream states from the gateway in this
    process (empty without one)."""
    from controlplane.telemetry.tasks import GatewayView
    from routing.gateway.routing import gateway

    subscribers = getattr(gateway.state, "subscribers", None) or {}
    try:
        items = list(subscribers.items())
    except RuntimeError:  # the gateway's loop changed the dict mid-copy; next scrape catches up
        return GatewayView()
    return GatewayView(
        blocks_removed={wid: float(sub.status.blocks_removed) for wid, sub in items},
        events_state={wid: str(sub.status.state) for wid, sub in items},
    )


def with_embedded_jobs(inner: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an ASGI lifespan app: once it reports startup complete, start the embedded
    scheduler on this loop (when enabled); stop it before the inner app shuts down."""

    async def app(
        scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        scheduler: EmbeddedScheduler | None = None

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal scheduler
            if message["type"] == "lifespan.startup.complete" and embedded_jobs_enabled():
                scheduler = EmbeddedScheduler(
                    source=gateway_record_source(),
                    loop=asyncio.get_running_loop(),
                    gateway_getter=gateway_view,
                ).start()
                logger.info("embedded job scheduler started")
            await send(message)

        async def receive_wrapper() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and scheduler is not None:
                await asyncio.to_thread(scheduler.stop)
            return message

        await inner(scope, receive_wrapper, send_wrapper)

    return app
