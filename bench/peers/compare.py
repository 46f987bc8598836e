"""Peers side by side: our gateway's policies and the routers people use today, each in front of
a fresh simulated fleet, replaying the same workload.

    bash bench/peers/install.sh          # vllm-router + sglang-router into .venv-peers
    python -m bench.peers.compare --workload tenants --engines 4 --profile h100-8b \\
        --time-scale 1.0 --rate 6 [--param tenants=16 ...] [--configs kv_score,vllm:cache_aware]

Configurations (``--configs``, default all that are installed): ours ``kv_score``,
``predicted_ttft``, ``round_robin``; ``vllm:round_robin``, ``vllm:cache_aware``,
``vllm:kv_aware`` (fed by the workers' KV events, ``--kv-event-source``), ``sglang:cache_aware``.
Every configuration gets a new fleet (cold caches) and sends the prompts in the same format:
token-id lists, except sglang-router, which accepts only string prompts and gets the same
tokens as one builtin-tokenizer word each (``--prompt-format text`` for all makes it uniform).

Gateway-added latency: the median TTFT of ``--probe`` sequential one-token requests through the
router minus the same sent straight to a worker, in wall milliseconds, on the idle fleet before
the run. Everything listens on 127.0.0.1; every process is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench import report
from bench.__main__ import _kv, add_workload_args, workload_from_args
from bench.loadgen import Target, run_load, send_one
from bench.peers.stack import (
    MODEL,
    PEERS_VENV,
    FleetInfo,
    Stack,
    start_fleet,
    start_gateway,
    start_sglang_router,
    start_vllm_router,
)
from bench.workloads import BenchRequest, Segment, oracle_hit_rate, with_arrivals

OURS = ("kv_score", "predicted_ttft", "round_robin")
PEERS = ("vllm:round_robin", "vllm:cache_aware", "vllm:kv_aware", "sglang:cache_aware")

COLUMNS = [
    ("config", "router / policy"),
    ("ttft_mean_ms", "TTFT mean"),
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p99_ms", "TTFT p99"),
    ("hit_pct", "hit %"),
    ("hit_vs_oracle_pct", "% of oracle"),
    ("throughput_rps", "req/s"),
    ("output_tps", "out tok/s"),
    ("added_ms", "added ms"),
    ("failed", "failed"),
]


def start_router(stack: Stack, fleet: FleetInfo, config: str, params: dict[str, Any]) -> str:
    if ":" not in config:
        url, _ = start_gateway(stack, fleet, policy=config, params=params.get(config))
        return url
    peer, policy = config.split(":", 1)
    if peer == "vllm":
        url, _ = start_vllm_router(stack, fleet, policy=policy, kv_events=policy == "kv_aware")
        return url
    url, _ = start_sglang_router(stack, fleet, policy=policy)
    return url


async def probe_ms(url: str, *, n: int, prompt_format: str) -> float:
    """Median wall TTFT (ms) of ``n`` sequential 1-token requests with short unique prompts."""
    import httpx

    target = Target(base_url=url, model=MODEL, prompt_format=prompt_format)
    ttfts = []
    async with httpx.AsyncClient(timeout=30) as client:
        for i in range(n):
            req = BenchRequest(
                f"probe{i}-{time.monotonic_ns()}",
                (Segment(f"probe/{url}/{i}", 24),),
                max_tokens=1,
                seed=0,
            )
            r = await send_one(client, req, target=target, t0=time.perf_counter())
            if r.ok:
                ttfts.append(r.ttft_ms)
    return statistics.median(ttfts) if ttfts else float("nan")


def run_config(
    config: str,
    requests: Sequence[BenchRequest],
    *,
    args: argparse.Namespace,
    params: dict[str, Any],
    oracle: float,
) -> dict[str, Any]:
    prompt_format = (
        "text" if (config.startswith("sglang:") or args.prompt_format == "text") else "tokens"
    )
    with Stack() as stack:
        fleet = start_fleet(
            stack,
            count=args.engines,
            profile=args.profile,
            time_scale=args.time_scale,
            processes=args.fleet_processes,
            max_model_len=args.max_model_len,
        )
        url = start_router(stack, fleet, config, params)
        direct = asyncio.run(probe_ms(fleet.urls[0], n=args.probe, prompt_format=prompt_format))
        routed = asyncio.run(probe_ms(url, n=args.probe, prompt_format=prompt_format))
        target = Target(base_url=url, model=MODEL, prompt_format=prompt_format)
        results, wall = asyncio.run(
            run_load(
                requests, target=target, concurrency=args.concurrency, time_scale=args.time_scale
            )
        )
        print(f"  {config}: {wall:.1f} s wall, logs in {stack.logdir}", file=sys.stderr)
    s = report.summarize(
        results, label=config, slo_ttft_ms=args.slo_ttft_ms, oracle_hit_rate=oracle
    )
    errors = [r.error for r in results if not r.ok]
    return {
        "config": config,
        "prompt_format": prompt_format,
        "ttft_mean_ms": s.ttft_ms["mean"],
        "ttft_p50_ms": s.ttft_ms["p50"],
        "ttft_p99_ms": s.ttft_ms["p99"],
        "e2e_mean_ms": s.e2e_ms["mean"],
        "hit_rate": s.hit_rate,
        "hit_pct": 100.0 * s.hit_rate,
        "oracle_hit_rate": oracle,
        "hit_vs_oracle_pct": 100.0 * s.hit_rate / oracle if oracle else float("nan"),
        "throughput_rps": s.request_throughput_rps,
        "output_tps": s.output_token_throughput_tps,
        "added_ms": routed - direct,
        "probe_direct_ms": direct,
        "probe_routed_ms": routed,
        "completed": s.completed,
        "failed": s.failed,
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.peers.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_args(ap)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--profile", default="h100-8b")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--fleet-processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int)
    ap.add_argument("--configs", help="comma-separated; default: ours + every installed peer")
    ap.add_argument(
        "--policy-params",
        action="append",
        metavar="POLICY:NAME=VALUE",
        help="parameter of one of our policies, e.g. kv_score:load_weight=1",
    )
    ap.add_argument("--prompt-format", choices=["tokens", "text"], default="tokens")
    ap.add_argument("--probe", type=int, default=20, help="requests of the added-latency probe")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    args = ap.parse_args(argv)

    reqs = workload_from_args(args)
    if not args.concurrency:
        reqs = with_arrivals(reqs, rate_rps=args.rate, seed=args.seed)
    if args.max_model_len is None:
        longest = max(r.prompt_tokens + r.max_tokens for r in reqs)
        args.max_model_len = max(8192, longest)
    configs = (
        args.configs.split(",")
        if args.configs
        else list(OURS) + (list(PEERS) if (PEERS_VENV / "bin").exists() else [])
    )
    params: dict[str, Any] = {}
    for item in args.policy_params or []:
        pol, _, kv = item.partition(":")
        for k, v in _kv([kv], flag="--policy-params").items():
            params.setdefault(pol, {})[k] = float(v)
    oracle = oracle_hit_rate(reqs).hit_rate
    print(
        f"{len(reqs)} requests, {sum(r.prompt_tokens for r in reqs):,} prompt tokens, oracle hit rate "
        f"{100 * oracle:.1f} %; fleet {args.engines} x {args.profile} at time scale {args.time_scale}",
        file=sys.stderr,
    )
    rows = []
    for config in configs:
        try:
            rows.append(run_config(config, reqs, args=args, params=params, oracle=oracle))
        except (RuntimeError, FileNotFoundError) as exc:
            print(f"  {config}: could not run: {exc}", file=sys.stderr)
            rows.append({"config": config, "failed": len(reqs), "first_error": str(exc)[:300]})
    print(report.comparison_table(rows, COLUMNS))
    out = args.out or str(report.RESULTS_DIR / f"peers-{args.workload}.json")
    meta = {
        "command": " ".join(["python -m bench.peers.compare", *(argv or sys.argv[1:])]),
        "workload": args.workload,
        "engines": args.engines,
        "profile": args.profile,
        "time_scale": args.time_scale,
        "requests": len(reqs),
        "oracle_hit_rate": oracle,
    }
    report.write_json(out, {"meta": meta, "rows": rows})
    print(f"wrote {out}", file=sys.stderr)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(report.markdown_table(rows, COLUMNS) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
