"""`make demo` end to end: the newcomer's first minute must keep working.

Runs `python -m controlplane.demo --exit-after-pass` (simulated fleet, web process with the
embedded job scheduler, agents, seeded policies, a workload through the gateway) on free
ports and a throwaway SQLite database, and checks what it prints and that it cleans up.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _port_block(size: int, rng: random.Random) -> int:
    # Below Linux's ephemeral range (32768+), so no outgoing connection takes one meanwhile.
    for _ in range(200):
        base = rng.randrange(20000, 32000 - size)
        if all(_free(p) for p in range(base, base + size)):
            return base
    pytest.skip("no free block of loopback ports for the demo")


@pytest.mark.slow
def test_demo_runs_the_product_and_stops_everything(tmp_path: Path) -> None:
    rng = random.Random(os.getpid())
    base = _port_block(7, rng)  # one block, so the three ranges cannot overlap
    web, workers, events = base, base + 1, base + 3
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    argv = [
        sys.executable, "-m", "controlplane.demo", "--exit-after-pass", "--workers", "2",
        "--requests", "16", "--rate", "8", "--port", str(web),
        "--worker-base-port", str(workers), "--events-base-port", str(events),
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"completed 16\s+failed 0", out), out
    assert re.search(r"Dashboard:\s+http://127\.0\.0\.1:\d+/\s+\(login: admin / \S+\)", out), out
    assert "embedded job scheduler" in out
    # Every port the demo used is free again: nothing it started outlives it.
    used = [web, *range(workers, workers + 2), *range(events, events + 4)]
    assert all(_free(p) for p in used), out
