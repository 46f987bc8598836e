"""Process and socket helpers for the real-engine tier: child processes in their own
process group (killed with everything they spawned), HTTP readiness waits, and a ZMQ
subscriber that records decoded KV-event batches in arrival order."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import zmq

from routing.core.events import EventBatch, decode_message

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


@dataclass
class Proc:
    """A child process in its own process group, with its output in `log_path`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, name: str, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> Proc:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                list(argv),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ if env is None else env),
                start_new_session=True,
            )
        return cls(name=name, popen=popen, log_path=log_path)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, max_chars: int = 3000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-max_chars:]

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, *, grace_s: float = 30.0) -> None:
        """SIGTERM the process (it may drain), then SIGKILL its whole group."""
        if self.alive:
            self.signal(signal.SIGTERM)
            self.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.wait(5)


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    out: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.exists():
        return out
    for task in task_dir.iterdir():
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return out


def wait_until(
    predicate: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    proc: Proc | None = None,
) -> object:
    """Poll `predicate` until it returns something truthy; fail with `what` (and a log tail)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError):
            value = predicate()
            if value:
                return value
        if proc is not None and not proc.alive:
            raise AssertionError(
                f"{proc.name} exited ({proc.popen.returncode}) while waiting for {what}:\n{proc.tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"\n{proc.name} log tail:\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")
        time.sleep(interval_s)


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


@dataclass
class EventRecorder:
    """A real ZMQ SUB socket on an engine's KV-event endpoint, decoding every batch."""

    endpoint: str
    batches: list[EventBatch] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> EventRecorder:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(5)
        # A SUB socket misses what is published before its subscription propagates.
        time.sleep(0.3)
        return self

    def _run(self, ready: threading.Event) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(100):
                    frames = sock.recv_multipart()
                    try:
                        batch = decode_message(frames)
                    except Exception as exc:  # recorded and asserted on by the tests
                        self.errors.append(repr(exc))
                        continue
                    with self._lock:
                        self.batches.append(batch)
        finally:
            sock.close()

    def snapshot(self) -> list[EventBatch]:
        with self._lock:
            return list(self.batches)

    def clear(self) -> None:
        with self._lock:
            self.batches.clear()

    def wait_quiet(self, *, quiet_s: float = 0.5, timeout_s: float = 10.0) -> list[EventBatch]:
        """Wait until no new batch has arrived for `quiet_s`; returns everything so far."""
        deadline = time.monotonic() + timeout_s
        count = -1
        last_change = time.monotonic()
        while time.monotonic() < deadline:
            now_count = len(self.snapshot())
            if now_count != count:
                count = now_count
                last_change = time.monotonic()
            elif time.monotonic() - last_change >= quiet_s:
                break
            time.sleep(0.05)
        return self.snapshot()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
