"""`python -m workers.sim` as an operator runs it: real processes, real ports."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[3]


def test_fleet_cli_prints_urls_and_a_json_line_and_stops_on_sigterm() -> None:
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.sim",
            "fleet",
            "--count",
            "2",
            "--base-port",
            "0",
            "--events-base-port",
            "0",
            "--profile",
            "h100-8b",
            "--num-blocks",
            "256",
            "--time-scale",
            "0.01",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        _check_fleet(proc)


def _check_fleet(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdout is not None
        urls = [proc.stdout.readline().strip() for _ in range(2)]
        listing = json.loads(proc.stdout.readline())
        assert [w["url"] for w in listing["workers"]] == urls
        assert all(
            w["kv_events_endpoint"].startswith("tcp://127.0.0.1:") for w in listing["workers"]
        )
        assert listing["workers"][0]["capacity_blocks"] == 256
        for url in urls:
            body = {"model": "sim-8b", "prompt": "the cache", "max_tokens": 2}
            assert (
                httpx.post(f"{url}/v1/completions", json=body, timeout=10).json()["usage"][
                    "completion_tokens"
                ]
                == 2
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_cli_rejects_an_unknown_profile() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "workers.sim", "--profile", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_single_worker_cli_with_kv_events_and_replay() -> None:
    argv = [
        sys.executable,
        "-m",
        "workers.sim",
        "--port",
        "0",
        "--model",
        "m1",
        "--profile",
        "dev",
        "--kv-events",
        "tcp://127.0.0.1:0",
        "--replay",
        "tcp://127.0.0.1:0",
        "--event-shape",
        "array",
    ]
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            (worker,) = json.loads(proc.stdout.readline())["workers"]
            assert worker["url"] == url and worker["model"] == "m1"
            assert worker["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
            assert worker["replay_endpoint"].startswith("tcp://127.0.0.1:")
            assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "m1"
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=15) == 0
