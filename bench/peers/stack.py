"""Live stacks on loopback for benchmarks: a simulated fleet, our gateway, peer routers.

Every process is started in its own session (``start_new_session``) and stopped by its pid
(SIGTERM to the process group it leads, SIGKILL after a grace period). Nothing binds outside
127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = ROOT / ".venv-peers"
MODEL = "sim-8b"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, *, grace_s: float = 8.0) -> None:
        """SIGTERM the process group this pid leads, then SIGKILL if it lingers."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Stack:
    """Processes started for one benchmark; ``stop_all`` stops them newest first."""

    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kvbench-")))
    procs: list[Proc] = field(default_factory=list)

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Proc:
        log = self.logdir / f"{name}.log"
        out = log.open("ab")
        popen = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def wait_http(url: str, *, proc: Proc, timeout_s: float = 60.0, path: str = "/v1/models") -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            r = httpx.get(url.rstrip("/") + path, timeout=2.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.2)
    raise RuntimeError(
        f"{proc.name} not ready at {url}{path} after {timeout_s} s ({last}):\n{proc.tail()}"
    )


@dataclass(frozen=True)
class FleetInfo:
    workers: list[dict[str, Any]]
    profile: str
    time_scale: float

    @property
    def urls(self) -> list[str]:
        return [w["url"] for w in self.workers]


def start_fleet(
    stack: Stack,
    *,
    count: int,
    profile: str,
    time_scale: float,
    processes: int = 1,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
) -> FleetInfo:
    """``count`` simulated workers (``python -m workers.sim fleet``) split over ``processes``."""
    workers: list[dict[str, Any]] = []
    per = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    for p, n in enumerate(per):
        if n == 0:
            continue
        argv = [
            sys.executable,
            "-m",
            "workers.sim",
            "fleet",
            "--count",
            str(n),
            "--base-port",
            "0",
            "--events-base-port",
            "0",
            "--profile",
            profile,
            "--time-scale",
            str(time_scale),
            *(["--max-model-len", str(max_model_len)] if max_model_len else []),
            *extra_args,
        ]
        proc = stack.start(f"fleet{p}", argv)
        deadline = time.monotonic() + 60
        doc = None
        while time.monotonic() < deadline and doc is None:
            if not proc.alive():
                raise RuntimeError(f"fleet exited:\n{proc.tail()}")
            for line in proc.log.read_text(errors="replace").splitlines():
                if line.startswith('{"workers"'):
                    doc = json.loads(line)
            time.sleep(0.1)
        if doc is None:
            raise RuntimeError(f"fleet did not report its workers:\n{proc.tail()}")
        for w in doc["workers"]:
            w = dict(w)
            w["id"] = f"sim-{len(workers)}"  # ids unique across fleet processes, as in clustersim
            workers.append(w)
    return FleetInfo(workers=workers, profile=profile, time_scale=time_scale)


def snapshot_doc(
    fleet: FleetInfo,
    *,
    policy: str,
    params: Mapping[str, Any] | None = None,
    kv_events: bool = True,
) -> dict[str, Any]:
    """A routing snapshot (docs/contracts.md) for our gateway in front of ``fleet``."""
    return {
        "revision": f"bench-{policy}",
        "generated_at": "2026-11-29T10:00:00Z",
        "workers": [
            {
                "id": w["id"],
                "url": w["url"],
                "model": w.get("model", MODEL),
                "state": "active",
                "healthy": True,
                "block_size": w.get("block_size", 16),
                "capacity_blocks": w.get("capacity_blocks", 0),
                "network_ms": 0.0,
                "kv_events_endpoint": w.get("kv_events_endpoint") if kv_events else None,
                "replay_endpoint": w.get("replay_endpoint") if kv_events else None,
                "labels": {"tokenizer": "builtin"},
            }
            for w in fleet.workers
        ],
        "models": {
            MODEL: {
                "active": {
                    "policy": f"bench-{policy}",
                    "version_id": 1,
                    "version": 1,
                    "type": policy,
                    "params": dict(params or {}),
                },
                "experiment": None,
            }
        },
    }


def start_gateway(
    stack: Stack,
    fleet: FleetInfo,
    *,
    policy: str,
    params: Mapping[str, Any] | None = None,
    port: int | None = None,
) -> tuple[str, Proc]:
    """Our gateway alone (``bench.peers.gateway_main``) with a static snapshot of ``fleet``.

    Its wall-clock periods (metrics scrape, approximate-index TTL) are the defaults, which in a
    time-scaled fleet cover 1/time_scale times more model time; the simulator is told the same.
    """
    port = port or free_port()
    snap = stack.logdir / f"snapshot-{policy}-{port}.json"
    snap.write_text(json.dumps(snapshot_doc(fleet, policy=policy, params=params)))
    proc = stack.start(
        f"gateway-{policy}",
        [
            sys.executable,
            "-m",
            "bench.peers.gateway_main",
            "--snapshot",
            str(snap),
            "--port",
            str(port),
        ],
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc=proc)
    return url, proc


def _peer_bin(name: str) -> str:
    path = PEERS_VENV / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run bash bench/peers/install.sh")
    return str(path)


def start_vllm_router(
    stack: Stack, fleet: FleetInfo, *, policy: str, port: int | None = None, kv_events: bool = False
) -> tuple[str, Proc]:
    port = port or free_port()
    argv = [
        _peer_bin("vllm-router"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *fleet.urls,
        "--policy",
        policy,
        "--log-level",
        "warning",
        "--disable-retries",
        "--prometheus-port",
        str(free_port()),
        "--prometheus-host",
        "127.0.0.1",
    ]
    if kv_events:
        for w in fleet.workers:
            argv += ["--kv-event-source", f"{w['url']}={w['kv_events_endpoint']}"]
        argv += [
            "--kv-event-block-size",
            str(fleet.workers[0].get("block_size", 16)),
            "--kv-event-model",
            MODEL,
        ]
    proc = stack.start(f"vllm-router-{policy}{'-kv' if kv_events else ''}", argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc=proc, path="/v1/models")
    return url, proc


def start_sglang_router(
    stack: Stack, fleet: FleetInfo, *, policy: str, port: int | None = None
) -> tuple[str, Proc]:
    port = port or free_port()
    argv = [
        _peer_bin("sglang-router"),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *fleet.urls,
        "--policy",
        policy,
        "--log-level",
        "warn",
        "--prometheus-port",
        str(free_port()),
        "--prometheus-host",
        "127.0.0.1",
    ]
    proc = stack.start(f"sglang-router-{policy}", argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc=proc, path="/v1/models")
    return url, proc
