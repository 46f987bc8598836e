"""Telemetry job costs on a throwaway SQLite DB (and Redis when reachable).

    .venv/bin/python bench/telemetry_bench.py [--records 20000] [--workers 8] [--arms 2000]

Prints a table and writes bench/results/telemetry_bench.json: draining request records
(in-process sink, and the Redis stream when one answers on 127.0.0.1:6379) into sampled
RequestRecords plus 10 s / minute rollups, the overview snapshot read, retention folding
minutes into hours, and one experiment comparison (bootstrap CIs) per arm size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def record(
    i: int, *, rng: random.Random, workers: int, t0: float, rate_rps: float
) -> dict[str, Any]:
    prompt = rng.randint(500, 4000)
    cached = rng.choice([0, prompt // 2, prompt - 16])
    return {
        "request_id": f"bench-{i}",
        "ts_s": t0 + i / rate_rps,
        "model": "sim-8b",
        "tenant": f"t{i % 16}",
        "session_key": f"s{i % 64}",
        "worker_id": f"sim-{i % workers}",
        "policy": "kv-default",
        "policy_version_id": 1,
        "policy_type": "kv_score",
        "experiment_id": 0,
        "arm": None,
        "shadow": None,
        "prompt_tokens": prompt,
        "predicted_cached_tokens": cached,
        "actual_cached_tokens": cached if rng.random() < 0.9 else max(0, cached - 64),
        "ttft_ms": rng.lognormvariate(5.0, 0.6),
        "e2e_ms": rng.lognormvariate(7.0, 0.4),
        "output_tokens": 64,
        "status": "ok" if rng.random() > 0.01 else "error",
        "http_status": 200,
        "retries": 0,
        "routing_overhead_us": 300.0,
        "stream": True,
        "candidates": [
            {"worker": "sim-0", "score": 0.9, "cached_blocks": 10, "terms": {"cache": 0.9}}
        ],
        "reason": "bench",
        "block_keys": list(range(prompt // 16)),
        "block_size": 16,
    }


def redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rate", type=float, default=100.0, help="req/s the records span")
    parser.add_argument("--arms", type=int, default=2000, help="sampled requests per arm")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="kvroute-telemetry-bench-")
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    sys.path.insert(0, str(ROOT))
    os.makedirs(ROOT / "var" / "static", exist_ok=True)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from controlplane.telemetry import experiments, selectors, services
    from controlplane.telemetry.models import RequestRecord, Rollup
    from controlplane.telemetry.sources import MemorySinkSource, RedisStreamSource
    from routing.gateway.records import MemorySink

    rng = random.Random(0)
    t0 = 1_800_000_000.0
    recs = [
        record(i, rng=rng, workers=args.workers, t0=t0, rate_rps=args.rate)
        for i in range(args.records)
    ]
    rows: list[dict[str, Any]] = []

    def drain(label: str, source: Any, *, sample_rate: float) -> None:
        RequestRecord.objects.all().delete()
        Rollup.objects.all().delete()
        start = time.perf_counter()
        result = services.request_stream_drain(
            source=source, sample_rate=sample_rate, batch_size=1000, max_batches=10**6
        )
        wall_s = time.perf_counter() - start
        rows.append(
            {
                "case": label,
                "records": result.entries,
                "stored": result.records_stored,
                "rollup_rows": Rollup.objects.count(),
                "wall_s": round(wall_s, 3),
                "records_per_s": round(result.entries / wall_s),
            }
        )

    for rate in (1.0, 0.1):
        sink = MemorySink(maxlen=args.records)
        sink.append_many(recs)
        drain(
            f"drain memory sink, sample {rate:g}",
            MemorySinkSource(sink, name=f"m{rate}"),
            sample_rate=rate,
        )
    if redis_up():
        import redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
        client.delete("kvroute:bench-requests")
        pipe = client.pipeline(transaction=False)
        for r in recs:
            pipe.xadd("kvroute:bench-requests", {"r": json.dumps(r)})
        pipe.execute()
        source = RedisStreamSource(url="redis://127.0.0.1:6379/14", key="kvroute:bench-requests")
        drain("drain Redis stream, sample 1", source, sample_rate=1.0)
        client.delete("kvroute:bench-requests")
        source.close()
        client.close()

    start = time.perf_counter()
    snap = selectors.overview_snapshot(window_s=3600, now_s=t0 + args.records / args.rate)
    rows.append(
        {
            "case": "overview snapshot (1 h, 10 s points)",
            "points": len(snap["points"]),
            "wall_s": round(time.perf_counter() - start, 3),
        }
    )
    start = time.perf_counter()
    ret = services.retention_apply(
        now_s=t0 + 10 * 86400,
        records_max_age_s=7 * 86400,
        minute_rollups_max_age_s=86400,
        hour_rollups_max_age_s=90 * 86400,
        fleet_max_age_s=86400,
    )
    rows.append(
        {
            "case": "retention (fold all minutes into hours)",
            "minute_rows": ret.minute_rollups_compacted,
            "wall_s": round(time.perf_counter() - start, 3),
        }
    )

    arm_rng = random.Random(1)
    arm_data = [
        experiments.ArmData(
            name=name,
            ttft_ms=[arm_rng.lognormvariate(5.0, 0.5) * scale for _ in range(args.arms)],
            requests=args.arms,
            errors=0,
            hit_requests=args.arms // 2,
            cached_known_requests=args.arms,
            actual_cached_tokens=0,
            cached_known_prompt_tokens=1,
            output_tokens=0,
            duration_s=60.0,
        )
        for name, scale in (("A", 1.0), ("B", 0.9))
    ]
    start = time.perf_counter()
    out = experiments.compare_arms(arm_data, rng=random.Random(0), resamples=400)
    rows.append(
        {
            "case": f"experiment results (2 x {args.arms} requests, 400 resamples)",
            "verdict": out["verdict"],
            "wall_s": round(time.perf_counter() - start, 3),
        }
    )

    print(f"{'case':<48} {'wall s':>8}  detail")
    for r in rows:
        detail = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("case", "wall_s"))
        print(f"{r['case']:<48} {r['wall_s']:>8.3f}  {detail}")
    out_path = ROOT / "bench" / "results" / "telemetry_bench.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out_path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
