"""Worker agent: registers one engine with the control plane, heartbeats its load, and
drains it on SIGTERM.

    python -m workers.agent --control-plane http://127.0.0.1:8000 --token T \\
        --worker-url http://127.0.0.1:8301 --name cpu-0 \\
        [--model M] [--kv-events tcp://127.0.0.1:5601] [--replay tcp://127.0.0.1:5701] \\
        [--network-ms 0.5] [--launch-spec JSON | --supervise -- CMD ...]

The block size and KV capacity come from the engine's own `/metrics`
(`vllm:cache_config_info{block_size, num_gpu_blocks}`), never from flags, so a
registration always matches what the engine allocated. Load (running, waiting, KV
usage) rides on every heartbeat. It works the same for real vLLM and the simulated
engine. With `--launch-spec` (a `workers.vllm.LaunchSpec` as JSON) or `--supervise`
the agent also runs the engine and re-registers it after every restart.

On SIGTERM or SIGINT: mark the worker draining (no new requests are routed to it), wait
(bounded) until the engine has nothing running or waiting, deregister, then stop the
engine if the agent started it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from routing.gateway.scraper import CACHE_CONFIG as M_CACHE_CONFIG
from routing.gateway.scraper import parse_vllm_metrics
from workers.vllm import (
    CommandSpec,
    EngineProcess,
    EngineStartError,
    InvalidLaunchSpec,
    LaunchSpec,
    Supervisor,
)

log = logging.getLogger("kvroute.workers.agent")


class MetricsUnavailable(RuntimeError):
    """The engine's /metrics could not be read or lacks the cache config."""


class ControlPlaneError(RuntimeError):
    """The control plane refused a request; the message carries its answer."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What the agent reads from one scrape of an engine's `/metrics`.

    `kv_usage_frac` is in [0, 1] (vLLM's `kv_cache_usage_perc` is a fraction despite its
    name); `num_gpu_blocks` is the KV capacity in blocks (0 when the engine did not say).
    """

    block_size: int
    num_gpu_blocks: int
    running: int = 0
    waiting: int = 0
    kv_usage_frac: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting


def parse_metrics(text: str) -> EngineMetrics:
    """Parse Prometheus text from a vLLM (or simulated) engine with the gateway's scraper
    parser (sums over engines, averages KV usage); refuses a page with no block size."""
    metrics = parse_vllm_metrics(text)
    if not metrics.block_size or metrics.block_size <= 0:
        raise MetricsUnavailable(f"/metrics has no {M_CACHE_CONFIG} with a block_size label")
    return EngineMetrics(
        block_size=metrics.block_size,
        num_gpu_blocks=metrics.num_gpu_blocks or 0,
        running=metrics.running,
        waiting=metrics.waiting,
        kv_usage_frac=metrics.kv_usage_frac,
    )


@dataclass(frozen=True, slots=True)
class AgentConfig:
    control_plane: str
    token: str
    worker_url: str
    name: str
    model: str | None = None
    kv_events_endpoint: str | None = None
    replay_endpoint: str | None = None
    network_ms: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = 2.0
    drain_timeout_s: float = 120.0
    drain_poll_s: float = 0.5
    request_timeout_s: float = 10.0


class Agent:
    """One worker's registration lifecycle against the control plane's REST API."""

    def __init__(
        self, config: AgentConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self._cp = httpx.AsyncClient(
            base_url=config.control_plane.rstrip("/"),
            headers={"Authorization": f"Bearer {config.token}"},
            timeout=config.request_timeout_s,
            transport=transport,
        )
        self._engine = httpx.AsyncClient(
            base_url=config.worker_url.rstrip("/"), timeout=config.request_timeout_s
        )
        self.model: str | None = config.model
        self.registrations = 0
        self.heartbeats = 0
        self.last_metrics: EngineMetrics | None = None

    async def aclose(self) -> None:
        await self._cp.aclose()
        await self._engine.aclose()

    # engine side
    async def scrape(self) -> EngineMetrics:
        try:
            response = await self._engine.get("/metrics")
        except httpx.HTTPError as exc:
            raise MetricsUnavailable(f"GET {self.config.worker_url}/metrics: {exc!r}") from exc
        if response.status_code != 200:
            raise MetricsUnavailable(f"GET /metrics answered {response.status_code}")
        self.last_metrics = parse_metrics(response.text)
        return self.last_metrics

    async def discover_model(self) -> str:
        if self.model:
            return self.model
        response = await self._engine.get("/v1/models")
        response.raise_for_status()
        data = response.json().get("data") or []
        if not data:
            raise MetricsUnavailable("the engine serves no model (/v1/models is empty)")
        self.model = str(data[0]["id"])
        return self.model

    # control-plane side
    def registration_body(self, metrics: EngineMetrics) -> dict[str, Any]:
        assert self.model is not None
        body: dict[str, Any] = {
            "name": self.config.name,
            "base_url": self.config.worker_url,
            "model": self.model,
            "block_size": metrics.block_size,
            "capacity_blocks": metrics.num_gpu_blocks,
            "network_ms": self.config.network_ms,
            "labels": dict(self.config.labels),
        }
        if self.config.kv_events_endpoint:
            body["kv_events_endpoint"] = self.config.kv_events_endpoint
        if self.config.replay_endpoint:
            body["replay_endpoint"] = self.config.replay_endpoint
        return body

    def heartbeat_body(self, metrics: EngineMetrics) -> dict[str, Any]:
        return {
            "running": metrics.running,
            "waiting": metrics.waiting,
            "kv_usage_frac": round(metrics.kv_usage_frac, 6),
            "inflight": metrics.in_flight,
            "block_size": metrics.block_size,
            "capacity_blocks": metrics.num_gpu_blocks,
        }

    async def register(self) -> dict[str, Any]:
        """Register (idempotent by name); re-registering re-activates a known worker."""
        metrics = await self.scrape()
        await self.discover_model()
        data = await self._call("POST", "/api/workers/", json=self.registration_body(metrics))
        self.registrations += 1
        log.info(
            "registered %s (%s, block_size=%d, capacity_blocks=%d)",
            self.config.name,
            self.model,
            metrics.block_size,
            metrics.num_gpu_blocks,
        )
        return data

    async def register_until_done(self, *, stop: asyncio.Event, max_delay_s: float = 10.0) -> bool:
        """Retry registration with backoff until it succeeds or `stop` is set."""
        delay_s = 0.25
        while not stop.is_set():
            try:
                await self.register()
                return True
            except (httpx.HTTPError, MetricsUnavailable, ControlPlaneError) as exc:
                log.warning(
                    "registration of %s failed (%s); retrying in %.1f s",
                    self.config.name,
                    exc,
                    delay_s,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)
            delay_s = min(max_delay_s, delay_s * 2)
        return False

    async def heartbeat(self) -> dict[str, Any]:
        metrics = await self.scrape()
        path = f"/api/workers/{self.config.name}/heartbeat/"
        data = await self._call("POST", path, json=self.heartbeat_body(metrics))
        self.heartbeats += 1
        return data

    async def drain(self) -> None:
        await self._call("POST", f"/api/workers/{self.config.name}/drain/")

    async def deregister(self) -> None:
        await self._call("DELETE", f"/api/workers/{self.config.name}/", allow=(404,))

    async def wait_idle(self, *, timeout_s: float) -> bool:
        """Poll the engine until nothing runs or waits; False when `timeout_s` ran out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                if (await self.scrape()).in_flight == 0:
                    return True
            except MetricsUnavailable:
                return True  # a dead engine has nothing in flight
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(self.config.drain_poll_s)

    async def shutdown(self) -> None:
        """Drain, wait for in-flight requests (bounded), deregister. Never raises."""
        try:
            await self.drain()
        except (httpx.HTTPError, ControlPlaneError) as exc:
            log.warning("drain of %s failed: %s", self.config.name, exc)
        idle = await self.wait_idle(timeout_s=self.config.drain_timeout_s)
        if not idle:
            log.warning(
                "%s still busy after %.0f s; deregistering anyway",
                self.config.name,
                self.config.drain_timeout_s,
            )
        try:
            await self.deregister()
        except (httpx.HTTPError, ControlPlaneError) as exc:
            log.warning("deregistration of %s failed: %s", self.config.name, exc)

    async def _call(
        self, method: str, path: str, *, json: Any = None, allow: Sequence[int] = ()
    ) -> dict[str, Any]:
        response = await self._cp.request(method, path, json=json)
        if response.status_code in allow:
            return {}
        if response.status_code >= 400:
            raise ControlPlaneError(
                f"{method} {path} -> {response.status_code}: {response.text[:500]}",
                status_code=response.status_code,
            )
        if not response.content:
            return {}
        body = response.json()
        return body if isinstance(body, dict) else {"data": body}


async def run_agent(
    config: AgentConfig,
    *,
    engine: EngineProcess | None = None,
    stop: asyncio.Event | None = None,
    engine_log: str | None = None,
) -> int:
    """Run until `stop` is set (SIGTERM/SIGINT in the CLI), then drain and exit; 0 on success."""
    stop = stop or asyncio.Event()
    agent = Agent(config)
    supervisor: Supervisor | None = None
    engine_up = asyncio.Event()

    async def on_ready(restarts: int) -> None:
        engine_up.set()
        if restarts:
            log.info("engine of %s restarted (%d); re-registering", config.name, restarts)
            # An engine that restarted has an empty cache and a new event stream.
            await agent.register_until_done(stop=stop)

    async def on_exit(returncode: int | None) -> None:
        engine_up.clear()
        log.warning(
            "engine of %s died (exit %s); heartbeats pause until it is back",
            config.name,
            returncode,
        )

    try:
        if engine is not None:
            supervisor = Supervisor(engine, on_ready=on_ready, on_exit=on_exit, log_path=engine_log)
            start = asyncio.create_task(supervisor.start())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not start.done():
                start.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await start
                return 0
            stopped.cancel()
            try:
                start.result()
            except EngineStartError as exc:
                log.error("engine of %s did not start: %s", config.name, exc)
                return 1
        else:
            engine_up.set()
        if not await agent.register_until_done(stop=stop):
            return 0
        while not stop.is_set():
            if engine_up.is_set():
                try:
                    await agent.heartbeat()
                except (httpx.HTTPError, MetricsUnavailable, ControlPlaneError) as exc:
                    log.warning("heartbeat of %s failed: %s", config.name, exc)
                    if isinstance(exc, ControlPlaneError) and exc.status_code == 404:
                        # The control plane forgot us (e.g. an operator deleted the worker
                        # or the database was reset): register again.
                        await agent.register_until_done(stop=stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=config.heartbeat_interval_s)
        await agent.shutdown()
        return 0
    finally:
        if supervisor is not None:
            await supervisor.stop()
        await agent.aclose()


def _parse_labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--label: expected KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.agent",
        description="Register a vLLM (or simulated) worker with kvroute's control plane and heartbeat it.",
    )
    parser.add_argument("--control-plane", required=True, help="control plane base URL")
    parser.add_argument("--token", required=True, help="worker token (sent as a Bearer token)")
    parser.add_argument("--worker-url", help="the engine's base URL (default: from --launch-spec)")
    parser.add_argument("--name", required=True, help="unique worker name")
    parser.add_argument("--model", help="served model id (default: the engine's /v1/models)")
    parser.add_argument("--kv-events", help="ZMQ endpoint the gateway subscribes to for KV events")
    parser.add_argument("--replay", help="ZMQ replay endpoint of the KV-event publisher")
    parser.add_argument("--network-ms", type=float, default=0.0, help="one-way network cost in ms")
    parser.add_argument(
        "--label", action="append", default=[], help="KEY=VALUE worker label (repeatable)"
    )
    parser.add_argument(
        "--heartbeat-s", type=float, default=2.0, help="heartbeat interval in seconds"
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=float,
        default=120.0,
        help="max wait for in-flight requests on SIGTERM",
    )
    parser.add_argument("--engine-log", help="file for the supervised engine's output")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--launch-spec", help="run and supervise a vLLM engine from this LaunchSpec JSON"
    )
    group.add_argument(
        "--supervise",
        action="store_true",
        help="run and supervise the command given after `--` (e.g. python -m workers.sim ...)",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Everything after a bare `--` is the command to supervise."""
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if command and not args.supervise:
        parser.error("a command after -- needs --supervise")
    args.command = command
    return args


def config_from_args(args: argparse.Namespace) -> tuple[AgentConfig, EngineProcess | None]:
    engine: EngineProcess | None = None
    kv_events = args.kv_events
    replay = args.replay
    worker_url = args.worker_url
    if args.launch_spec:
        try:
            spec = LaunchSpec.from_mapping(json.loads(args.launch_spec))
        except (json.JSONDecodeError, InvalidLaunchSpec) as exc:
            raise SystemExit(f"--launch-spec: {exc}") from exc
        engine = spec
        worker_url = worker_url or spec.url
        kv_events = kv_events or spec.kv_events_endpoint
        replay = replay or spec.replay_endpoint
    elif args.supervise:
        command = list(getattr(args, "command", []))
        if not command:
            raise SystemExit("--supervise: give the command to run after --")
        if not worker_url:
            raise SystemExit("--supervise needs --worker-url")
        url = httpx.URL(worker_url)
        engine = CommandSpec(command=tuple(command), port=url.port or 80, host=url.host)
    if not worker_url:
        raise SystemExit("--worker-url is required (or give --launch-spec)")
    config = AgentConfig(
        control_plane=args.control_plane,
        token=args.token,
        worker_url=worker_url,
        name=args.name,
        model=args.model,
        kv_events_endpoint=kv_events,
        replay_endpoint=replay,
        network_ms=args.network_ms,
        labels=_parse_labels(args.label),
        heartbeat_interval_s=args.heartbeat_s,
        drain_timeout_s=args.drain_timeout_s,
    )
    return config, engine


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config, engine = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def _main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await run_agent(config, engine=engine, stop=stop, engine_log=args.engine_log)

    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main())
