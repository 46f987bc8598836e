"""Run an ASGI app (by default the whole product: Django control plane + gateway) with
uvicorn inside this process.

    from routing.gateway.serve import serve_in_thread
    with serve_in_thread(host="127.0.0.1", port=8000) as server:   # background thread
        print(server.url)                                           # http://127.0.0.1:8000

    from routing.gateway.serve import serve_forever
    serve_forever(host="127.0.0.1", port=8000)                      # blocking, main thread

With the default app, the gateway reads its routing snapshot from the control plane in the
same process (`controlplane.snapshot.routing_snapshot`, off the event loop) at lifespan
startup, again on every `kvroute.config` channel-layer notice (same process: in-memory
layer; or Redis pub/sub `kvroute:config` when REDIS_URL is set), and every
KVROUTE_GATEWAY_SNAPSHOT_POLL_S seconds as a safety net. Set KVROUTE_CONTROL_PLANE_URL to
read it over HTTP instead (a gateway in its own process).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Literal

import uvicorn


def _default_app() -> Any:
    from controlplane.asgi import application

    return application


def _config(
    app: Any,
    *,
    log_level: str,
    lifespan: Literal["auto", "on", "off"],
    host: str = "127.0.0.1",
    port: int = 8000,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan=lifespan,
        access_log=False,
        http="httptools",
        loop="asyncio",
        timeout_keep_alive=30,
    )


class ServerThread:
    """uvicorn serving `app` on a loopback socket from a daemon thread."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        lifespan: Literal["auto", "on", "off"] = "on",
    ) -> None:
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP, and without it Nagle + delayed ACK add ~40 ms per keep-alive reply.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(_config(app, log_level=log_level, lifespan=lifespan))
        self.thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        asyncio.run(main())

    def start(self, *, timeout_s: float = 15.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, *, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: Any = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "on",
) -> ServerThread:
    """Start uvicorn for `app` (default: `controlplane.asgi.application`) in a daemon thread
    and return once it accepts connections. `port=0` picks a free port (see `.url`).
    Stop it with `.stop()` or use it as a context manager."""
    return ServerThread(
        app if app is not None else _default_app(),
        host=host,
        port=port,
        log_level=log_level,
        lifespan=lifespan,
    ).start()


def serve_forever(
    app: Any = None, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve `app` (default: the whole product) in the calling thread until interrupted."""
    app = app if app is not None else _default_app()
    uvicorn.Server(_config(app, log_level=log_level, lifespan="on", host=host, port=port)).run()
