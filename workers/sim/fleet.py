"""Run several simulated workers in one process: in the current event loop (`serve_fleet`,
used by the CLI) or in a background thread (`start_fleet`, used by tests and the demo).

    with start_fleet(3, profile="dev", time_scale=0.05) as fleet:
        fleet.workers[0].url               # "http://127.0.0.1:40123"
        fleet.workers[0].events_endpoint   # "tcp://127.0.0.1:40125" (None when kv_events=False)
        fleet.workers[0].replay_endpoint   # "tcp://127.0.0.1:40127"
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import uvicorn
import zmq.asyncio

from workers.sim.kv_publisher import EventShape
from workers.sim.server import SimWorker, WorkerConfig


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Where one running simulated worker listens."""

    id: str
    url: str
    port: int
    model: str
    events_endpoint: str | None
    replay_endpoint: str | None
    block_size: int
    num_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "port": self.port,
            "model": self.model,
            "kv_events_endpoint": self.events_endpoint,
            "replay_endpoint": self.replay_endpoint,
            "block_size": self.block_size,
            "capacity_blocks": self.num_blocks,
        }


class _QuietServer(uvicorn.Server):
    # Several servers share one process: the CLI owns signal handling, not each server.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when proto says TCP;
    # without it Nagle + delayed ACK add ~40 ms to every keep-alive reply.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def worker_configs(
    count: int,
    *,
    model: str = "sim-8b",
    profile: str = "dev",
    host: str = "127.0.0.1",
    events_base_port: int | None = 0,
    replay: bool = True,
    **overrides: Any,
) -> list[WorkerConfig]:
    """Configs for `count` workers; events on `events_base_port + 2i`, replay on `+2i+1`
    (port 0: any free port; None: no KV events)."""
    configs = []
    for i in range(count):
        events = replay_ep = None
        if events_base_port is not None:
            ev_port = 0 if events_base_port == 0 else events_base_port + 2 * i
            rp_port = 0 if events_base_port == 0 else events_base_port + 2 * i + 1
            events = f"tcp://{host}:{ev_port}"
            replay_ep = f"tcp://{host}:{rp_port}" if replay else None
        configs.append(
            WorkerConfig(
                model=model,
                profile=profile,
                kv_events_endpoint=events,
                replay_endpoint=replay_ep,
                **overrides,
            )
        )
    return configs


class Fleet:
    """Workers served by uvicorn inside the running event loop."""

    def __init__(
        self,
        configs: list[WorkerConfig],
        *,
        host: str = "127.0.0.1",
        base_port: int = 0,
        id_prefix: str = "sim",
    ) -> None:
        self.configs = configs
        self.host = host
        self.base_port = base_port
        self.id_prefix = id_prefix
        self.sims: list[SimWorker] = []
        self.workers: list[WorkerInfo] = []
        self._servers: list[_QuietServer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._ctx: zmq.asyncio.Context | None = None

    async def start(self) -> list[WorkerInfo]:
        self._ctx = zmq.asyncio.Context()
        for i, config in enumerate(self.configs):
            sim = SimWorker(config, zmq_ctx=self._ctx)
            await sim.start()
            sock = _bind(self.host, 0 if self.base_port == 0 else self.base_port + i)
            port = sock.getsockname()[1]
            server = _QuietServer(
                uvicorn.Config(
                    sim,
                    lifespan="off",
                    log_level="warning",
                    access_log=False,
                    timeout_keep_alive=30,
                )
            )
            self._tasks.append(asyncio.get_running_loop().create_task(server.serve(sockets=[sock])))
            self._servers.append(server)
            self.sims.append(sim)
            p = sim.engine.profile
            self.workers.append(
                WorkerInfo(
                    id=f"{self.id_prefix}-{i}",
                    url=f"http://{self.host}:{port}",
                    port=port,
                    model=config.model,
                    events_endpoint=sim.events_endpoint,
                    replay_endpoint=sim.replay_endpoint,
                    block_size=p.block_size,
                    num_blocks=p.num_blocks,
                )
            )
        while not all(s.started for s in self._servers):
            if any(t.done() for t in self._tasks):
                for t in self._tasks:
                    if t.done() and t.exception() is not None:
                        raise RuntimeError("a simulated worker failed to start") from t.exception()
            await asyncio.sleep(0.01)
        return self.workers

    async def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        # Open SSE streams would hold a graceful shutdown forever: stop the engines first,
        # which ends every stream.
        for sim in self.sims:
            await sim.stop()
        for server in self._servers:
            server.force_exit = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


class FleetHandle:
    """A fleet running in a daemon thread; `stop()` (or leaving the `with`) tears it down."""

    def __init__(
        self, fleet: Fleet, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.fleet = fleet
        self.loop = loop
        self.thread = thread
        self.workers: list[WorkerInfo] = fleet.workers

    @property
    def sims(self) -> list[SimWorker]:
        """The live workers (read them from the fleet's thread via `call`)."""
        return self.fleet.sims

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the fleet's event loop and return its result (thread-safe)."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def stop(self) -> None:
        if not self.loop.is_closed() and self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.fleet.stop(), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def __enter__(self) -> FleetHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_fleet(
    count: int = 2,
    *,
    model: str = "sim-8b",
    profile: str = "dev",
    time_scale: float = 1.0,
    kv_events: bool = True,
    replay: bool = True,
    host: str = "127.0.0.1",
    base_port: int = 0,
    events_base_port: int = 0,
    event_shape: EventShape = "map",
    id_prefix: str = "sim",
    configs: list[WorkerConfig] | None = None,
    **overrides: Any,
) -> FleetHandle:
    """Start `count` simulated workers on free ports (port 0) in a background thread.

    `overrides` go to every `WorkerConfig` (num_blocks, block_size, max_num_seqs,
    eos_range, ...); pass `configs` instead for a heterogeneous fleet (then `count` and
    the other worker options are ignored). Returns once every worker accepts connections.
    """
    configs = configs or worker_configs(
        count,
        model=model,
        profile=profile,
        host=host,
        events_base_port=events_base_port if kv_events else None,
        replay=replay,
        time_scale=time_scale,
        event_shape=event_shape,
        **overrides,
    )
    fleet = Fleet(configs, host=host, base_port=base_port, id_prefix=id_prefix)
    loop = asyncio.new_event_loop()
    started: list[BaseException | None] = []
    ready = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(fleet.start())
            started.append(None)
        except BaseException as exc:
            started.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=main, name="sim-fleet", daemon=True)
    thread.start()
    ready.wait(timeout=60)
    if not started or started[0] is not None:
        raise RuntimeError("simulated fleet failed to start") from (started[0] if started else None)
    return FleetHandle(fleet, loop, thread)
