"""Control-plane costs a gateway and an agent fleet actually pay, on a throwaway SQLite DB.

    .venv/bin/python bench/controlplane_bench.py [--workers 256] [--models 8] [--repeat 50]

Prints a table and writes bench/results/controlplane_bench.json: building the routing
snapshot (selectors), serving it over the API (with and without a matching ETag), a
heartbeat round trip through DRF, and a policy activation (write + change notice).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def timed(fn: Callable[[], Any], *, repeat: int) -> dict[str, float]:
    fn()  # warm caches and lazy imports
    samples_ms = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples_ms.append((time.perf_counter() - start) * 1000.0)
    samples_ms.sort()
    return {
        "median_ms": round(statistics.median(samples_ms), 3),
        "p95_ms": round(samples_ms[max(0, int(len(samples_ms) * 0.95) - 1)], 3),
        "max_ms": round(samples_ms[-1], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="kvroute-cp-bench-")
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    sys.path.insert(0, str(ROOT))
    os.makedirs(ROOT / "var" / "static", exist_ok=True)

    import django

    django.setup()
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from controlplane.common.auth import OPERATOR, Actor
    from controlplane.common.services import api_token_create
    from controlplane.policies import services as policies
    from controlplane.registry import services as registry
    from controlplane.snapshot import routing_snapshot

    call_command("migrate", verbosity=0)
    ops = Actor(label="bench", scope=OPERATOR)
    models = [f"model-{m}" for m in range(args.models)]
    for i in range(args.workers):
        registry.worker_register(
            name=f"w-{i}",
            base_url=f"http://10.0.{i // 250}.{i % 250}:8000",
            model=models[i % len(models)],
            kv_events_endpoint=f"tcp://10.0.{i // 250}.{i % 250}:5557",
            capacity_blocks=4096,
            actor=ops,
        )
    for model in models:
        policies.policy_create(
            name=f"{model}.kv", model=model, type="kv_score", params={}, actor=ops
        )
        policies.policy_version_add(
            policy_name=f"{model}.kv", params={"cache_weight": 2.0}, actor=ops
        )
        policies.policy_activate(policy_name=f"{model}.kv", version=1, actor=ops)
    _, secret = api_token_create(name="bench", scope=OPERATOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    etag = client.get("/api/routing-snapshot/")["ETag"]
    flip = iter(range(10**9))

    rows = {
        "snapshot_build (selectors)": timed(routing_snapshot, repeat=args.repeat),
        "GET /api/routing-snapshot/": timed(
            lambda: client.get("/api/routing-snapshot/"), repeat=args.repeat
        ),
        "GET snapshot, ETag match (304)": timed(
            lambda: client.get("/api/routing-snapshot/", HTTP_IF_NONE_MATCH=etag),
            repeat=args.repeat,
        ),
        "POST heartbeat": timed(
            lambda: client.post(
                "/api/workers/w-0/heartbeat/", {"running": 1, "kv_usage_frac": 0.5}, format="json"
            ),
            repeat=args.repeat,
        ),
        "POST activate (alternating v1/v2)": timed(
            lambda: client.post(
                f"/api/policies/{models[0]}.kv/activate/",
                {"version": 1 + next(flip) % 2},
                format="json",
            ),
            repeat=args.repeat,
        ),
    }
    doc_bytes = len(client.get("/api/routing-snapshot/").content)
    print(
        f"control plane, {args.workers} workers / {args.models} models, SQLite, {args.repeat} runs each"
    )
    print(
        f"snapshot document: {doc_bytes} bytes; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'operation':40s} {'median ms':>10s} {'p95 ms':>10s} {'max ms':>10s}")
    for name, r in rows.items():
        print(f"{name:40s} {r['median_ms']:10.3f} {r['p95_ms']:10.3f} {r['max_ms']:10.3f}")
    out = ROOT / "bench" / "results" / "controlplane_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": "bench/controlplane_bench.py " + " ".join(sys.argv[1:]),
                "workers": args.workers,
                "models": args.models,
                "repeat": args.repeat,
                "database": "sqlite",
                "snapshot_bytes": doc_bytes,
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
