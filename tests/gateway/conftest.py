"""Real parts for the gateway tests: simulated vLLM workers (workers/sim) served by uvicorn
on loopback sockets from their own thread, and the gateway app served by uvicorn from
another, each with its own event loop, like separate processes would be."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from routing.gateway.config import GatewayConfig
from routing.gateway.consumers import GatewayHandle
from routing.gateway.routing import gateway_app
from routing.gateway.serve import ServerThread
from routing.gateway.snapshot import StaticSnapshotSource
from routing.gateway.state import build_gateway_state
from workers.sim.server import SimWorker, WorkerConfig

MODEL = "sim-8b"


class SimFleet:
    """N simulated workers in one background event loop, each on its own HTTP port."""

    def __init__(
        self, count: int, *, model: str = MODEL, kv_events: bool = True, **overrides: Any
    ) -> None:
        self.count = count
        self.model = model
        self.kv_events = kv_events
        self.overrides = {"profile": "dev", "time_scale": 0.01, **overrides}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="sim-fleet")
        self.workers: list[SimWorker] = []
        self.servers: list[uvicorn.Server] = []
        self.urls: list[str] = []
        self._serve_tasks: list[Any] = []

    def _call(self, coro: Any, timeout_s: float = 15.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _start_one(self, i: int) -> None:
        import socket

        cfg = WorkerConfig(
            model=self.model,
            kv_events_endpoint="tcp://127.0.0.1:0" if self.kv_events else None,
            replay_endpoint="tcp://127.0.0.1:0" if self.kv_events else None,
            **self.overrides,
        )
        worker = SimWorker(cfg)
        await worker.start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(
                worker,
                log_level="warning",
                lifespan="off",
                access_log=False,
                http="httptools",
                loop="asyncio",
            )
        )
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.005)
        self.workers.append(worker)
        self.servers.append(server)
        self.urls.append(f"http://127.0.0.1:{port}")
        self._serve_tasks.append((task, sock))

    def start(self) -> SimFleet:
        self.thread.start()
        for i in range(self.count):
            self._call(self._start_one(i))
        return self

    def worker_id(self, i: int) -> str:
        return f"sim-{i}"

    def kill(self, i: int) -> None:
        """Stop worker i's HTTP server and engine: connections are refused from now on."""

        async def stop() -> None:
            self.servers[i].should_exit = True
            task, sock = self._serve_tasks[i]
            await task
            sock.close()
            await self.workers[i].stop()

        self._call(stop())

    def stop(self) -> None:
        async def stop_all() -> None:
            for i, server in enumerate(self.servers):
                if not server.should_exit:
                    server.should_exit = True
                    task, sock = self._serve_tasks[i]
                    await task
                    sock.close()
                    await self.workers[i].stop()

        try:
            self._call(stop_all())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()

    def snapshot(
        self,
        *,
        policy: str = "kv_score",
        params: dict[str, Any] | None = None,
        states: dict[int, str] | None = None,
        events: bool | None = None,
        experiment: dict[str, Any] | None = None,
        revision: str = "r1",
    ) -> dict[str, Any]:
        states = states or {}
        use_events = self.kv_events if events is None else events
        workers = []
        for i, (w, url) in enumerate(zip(self.workers, self.urls, strict=True)):
            workers.append(
                {
                    "id": self.worker_id(i),
                    "url": url,
                    "model": self.model,
                    "state": states.get(i, "active"),
                    "healthy": True,
                    "block_size": w.engine.block_size if hasattr(w.engine, "block_size") else 16,
                    "capacity_blocks": 0,
                    "network_ms": 0.0,
                    "kv_events_endpoint": w.events_endpoint if use_events else None,
                    "replay_endpoint": w.replay_endpoint if use_events else None,
                    "labels": {"tokenizer": "builtin"},
                }
            )
        return {
            "revision": revision,
            "generated_at": "2026-11-29T10:00:00Z",
            "workers": workers,
            "models": {
                self.model: {
                    "active": {
                        "policy": f"test-{policy}",
                        "version_id": 1,
                        "version": 1,
                        "type": policy,
                        "params": params or {},
                    },
                    "experiment": experiment,
                }
            },
        }


@pytest.fixture
def fleet_factory() -> Iterator[Any]:
    fleets: list[SimFleet] = []

    def make(count: int, **kw: Any) -> SimFleet:
        fleet = SimFleet(count, **kw).start()
        fleets.append(fleet)
        return fleet

    yield make
    for f in fleets:
        f.stop()


class RunningGateway:
    def __init__(
        self, server: ServerThread, handle: GatewayHandle, source: StaticSnapshotSource | None
    ) -> None:
        self.server = server
        self.handle = handle
        self.source = source
        self.url = server.url

    @property
    def state(self) -> Any:
        assert self.handle.state is not None
        return self.handle.state

    def call(self, fn: Any) -> Any:
        """Run `fn()` (sync) on the gateway's loop, for reading its state consistently."""
        assert self.server.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.server.loop).result(5)

    def refresh(self) -> None:
        assert self.server.loop is not None
        asyncio.run_coroutine_threadsafe(self.state.refresher.refresh(), self.server.loop).result(5)


@pytest.fixture
def gateway_factory() -> Iterator[Any]:
    running: list[RunningGateway] = []

    def make(snapshot: Any, **overrides: Any) -> RunningGateway:
        values: dict[str, Any] = {
            "metrics_interval_s": 0.2,
            "snapshot_poll_s": 30.0,
            "connect_timeout_s": 1.0,
            "read_timeout_s": 10.0,
            "breaker_cooldown_s": 30.0,
            "records_flush_s": 0.05,
        }
        values.update(overrides)
        config = GatewayConfig(**values)
        source = StaticSnapshotSource(snapshot) if isinstance(snapshot, dict) else None
        handle = GatewayHandle(
            lambda: build_gateway_state(config, snapshot=source or snapshot, seed=7), config=config
        )
        server = ServerThread(gateway_app(handle)).start()
        gw = RunningGateway(server, handle, source)
        running.append(gw)
        return gw

    yield make
    for gw in running:
        gw.server.stop()


def chat_body(
    text: str, *, stream: bool = False, max_tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def post(
    url: str, path: str, body: Any, *, headers: dict[str, str] | None = None, timeout: float = 10.0
) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(
            url + path,
            content=body,
            headers={"content-type": "application/json", **(headers or {})},
            timeout=timeout,
        )
    return httpx.post(url + path, json=body, headers=headers, timeout=timeout)
