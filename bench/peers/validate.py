"""Simulator vs live: the same workload through the offline simulator and through the live stack
(our gateway in its own process in front of simulated workers at a time scale).

    python -m bench.peers.validate --workload tenants --engines 4 --profile h100-8b \\
        --time-scale 1.0 --rate 16 --policy kv_score [--param ...]

The simulator is configured like the live gateway: metrics scraped every
KVROUTE_GATEWAY_METRICS_INTERVAL_S (1 s wall = 1/time_scale model s), approximate index TTL
KVROUTE_GATEWAY_APPROX_TTL_S (30 s wall). Live latencies are converted to model time (divided by
the time scale). Agreement criteria (issue 8): mean TTFT within 10 %, hit rate within 2 points.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from bench import report
from bench.__main__ import add_workload_args, workload_from_args
from bench.clustersim import SimConfig, simulate
from bench.loadgen import Target, run_load
from bench.peers.stack import MODEL, Stack, start_fleet, start_gateway
from bench.workloads import oracle_hit_rate, with_arrivals

GATEWAY_METRICS_INTERVAL_S = 1.0
GATEWAY_APPROX_TTL_S = 30.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.peers.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_args(ap)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--profile", default="h100-8b")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--fleet-processes", type=int, default=2)
    ap.add_argument("--policy", default="kv_score")
    ap.add_argument("--params", help="policy parameters as a JSON object")
    ap.add_argument("--max-model-len", type=int)
    args = ap.parse_args(argv)

    reqs = with_arrivals(workload_from_args(args), rate_rps=args.rate, seed=args.seed)
    params = json.loads(args.params) if args.params else {}
    longest = max(r.prompt_tokens + r.max_tokens for r in reqs)
    max_len = args.max_model_len or max(8192, longest)
    oracle = oracle_hit_rate(reqs).hit_rate

    t0 = time.perf_counter()
    sim = simulate(
        reqs,
        config=SimConfig(
            engines=args.engines,
            policy=args.policy,
            params=params,
            profile=args.profile,
            seed=args.seed,
            max_model_len=max_len,
            scrape_interval_s=GATEWAY_METRICS_INTERVAL_S / args.time_scale,
            approx_ttl_s=GATEWAY_APPROX_TTL_S / args.time_scale,
        ),
    )
    sim_wall = time.perf_counter() - t0
    s_sim = report.summarize(
        sim.results, label="simulator", oracle_hit_rate=oracle, slo_ttft_ms=args.slo_ttft_ms
    )

    with Stack() as stack:
        fleet = start_fleet(
            stack,
            count=args.engines,
            profile=args.profile,
            time_scale=args.time_scale,
            processes=args.fleet_processes,
            max_model_len=max_len,
        )
        url, _ = start_gateway(stack, fleet, policy=args.policy, params=params)
        live, live_wall = asyncio.run(
            run_load(reqs, target=Target(base_url=url, model=MODEL), time_scale=args.time_scale)
        )
    s_live = report.summarize(
        live, label="live", oracle_hit_rate=oracle, slo_ttft_ms=args.slo_ttft_ms
    )

    rows = []
    for label, s, wall in (("simulator", s_sim, sim_wall), ("live", s_live, live_wall)):
        rows.append(
            {
                "run": label,
                "completed": s.completed,
                "failed": s.failed,
                "ttft_mean_ms": s.ttft_ms["mean"],
                "ttft_p50_ms": s.ttft_ms["p50"],
                "ttft_p99_ms": s.ttft_ms["p99"],
                "e2e_mean_ms": s.e2e_ms["mean"],
                "hit_pct": 100 * s.hit_rate,
                "throughput_rps": s.request_throughput_rps,
                "wall_s": wall,
            }
        )
    ttft_err = abs(s_live.ttft_ms["mean"] - s_sim.ttft_ms["mean"]) / s_live.ttft_ms["mean"]
    hit_pts = 100 * abs(s_live.hit_rate - s_sim.hit_rate)
    cols = [
        ("run", "run"),
        ("completed", "ok"),
        ("failed", "failed"),
        ("ttft_mean_ms", "TTFT mean"),
        ("ttft_p50_ms", "TTFT p50"),
        ("ttft_p99_ms", "TTFT p99"),
        ("e2e_mean_ms", "E2E mean"),
        ("hit_pct", "hit %"),
        ("throughput_rps", "req/s"),
        ("wall_s", "wall s"),
    ]
    print(report.comparison_table(rows, cols))
    verdict = (
        f"mean TTFT differs by {100 * ttft_err:.1f} % (target <= 10 %), hit rate by "
        f"{hit_pts:.2f} points (target <= 2)"
    )
    print(verdict)
    out = args.out or str(report.RESULTS_DIR / f"validate-{args.workload}.json")
    report.write_json(
        out,
        {
            "meta": {
                "command": " ".join(["python -m bench.peers.validate", *(argv or sys.argv[1:])]),
                "engines": args.engines,
                "profile": args.profile,
                "time_scale": args.time_scale,
                "policy": args.policy,
                "params": params,
                "requests": len(reqs),
                "oracle": oracle,
            },
            "rows": rows,
            "ttft_mean_rel_err": ttft_err,
            "hit_rate_abs_err_points": hit_pts,
        },
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
