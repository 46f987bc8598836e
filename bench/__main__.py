"""``python -m bench``: live load generation, offline cluster simulation, policy sweeps.

    python -m bench run   --target http://127.0.0.1:8000 --workload tenants --rate 4 --scale 0.05
    python -m bench sim   --workload trace --engines 8 --policy kv_score --profile h100-8b
    python -m bench sweep --workload tenants --policy kv_score --grid cache_weight=0,0.5,1,2 \\
                          --grid load_weight=0,0.5,1

Workload parameters: ``--param name=value`` (repeatable); ``python -m bench workloads`` lists
them with their defaults. Results: a table on stdout and JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.workloads import (
    WORKLOAD_PARAMS,
    BenchRequest,
    build_workload,
    oracle_hit_rate,
    requests_from_records,
    with_arrivals,
)


def _kv(items: list[str] | None, *, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"{flag} expects name=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, choices=[*sorted(WORKLOAD_PARAMS), "records"])
    p.add_argument("--records", help="workload records: JSON list or JSONL of recorded requests")
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="workload parameter")
    p.add_argument(
        "--trace", help="trace JSONL path (workload trace; default: bench/traces/ Mooncake)"
    )
    p.add_argument("--speed", type=float, help="trace time compression factor")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every token length")
    p.add_argument("--limit", type=int, help="keep the first N requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many req/s")
    p.add_argument("--block-size", type=int, default=16, help="block size of the oracle hit rate")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="goodput TTFT SLO")
    p.add_argument("--out", help="JSON output path (default bench/results/<cmd>-<workload>.json)")


def workload_from_args(args: argparse.Namespace) -> list[BenchRequest]:
    if args.workload == "records":
        if not args.records:
            raise SystemExit("--workload records needs --records PATH")
        try:
            text = Path(args.records).read_text(encoding="utf-8")
            stripped = text.lstrip()
            recs = (
                json.loads(text)
                if stripped.startswith("[")
                else [json.loads(line) for line in text.splitlines() if line.strip()]
            )
            reqs = requests_from_records(recs, block_size=args.block_size, seed=args.seed)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--records: {exc}") from None
        return reqs[: args.limit] if args.limit else reqs
    params: dict[str, Any] = _kv(args.param, flag="--param")
    if args.workload == "trace":
        if args.trace:
            params["path"] = args.trace
        if args.speed:
            params["speed"] = args.speed
    try:
        return build_workload(
            args.workload, params, seed=args.seed, scale=args.scale, limit=args.limit
        )
    except (ValueError, OSError) as exc:
        raise SystemExit(f"workload: {exc}") from None


def _out_path(args: argparse.Namespace, cmd: str, suffix: str = "") -> Path:
    if args.out:
        out = Path(args.out)
        return out.with_name(out.stem + suffix + out.suffix) if suffix else out
    return report.RESULTS_DIR / f"{cmd}-{args.workload}{suffix}.json"


def cmd_run(args: argparse.Namespace) -> int:
    from bench.loadgen import Target, discover_model, run_load

    reqs = workload_from_args(args)
    if not args.concurrency:
        try:
            reqs = with_arrivals(reqs, rate_rps=args.rate, seed=args.seed)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    model = args.model or asyncio.run(discover_model(args.target, api_key=args.api_key))
    target = Target(
        base_url=args.target,
        model=model,
        api_key=args.api_key,
        timeout_s=args.timeout_s,
        prompt_format=args.prompt_format,
    )
    oracle = oracle_hit_rate(reqs, block_size=args.block_size)
    print(
        f"sending {len(reqs)} requests ({sum(r.prompt_tokens for r in reqs):,} prompt tokens) to "
        f"{args.target} model={model} "
        + (f"closed loop x{args.concurrency}" if args.concurrency else "open loop"),
        file=sys.stderr,
    )
    results, wall_s = asyncio.run(
        run_load(
            reqs,
            target=target,
            concurrency=args.concurrency,
            max_inflight=args.max_inflight,
            time_scale=args.time_scale,
        )
    )
    label = args.label or f"{args.workload} @ {args.target}"
    summ = report.summarize(
        results,
        label=label,
        slo_ttft_ms=args.slo_ttft_ms,
        oracle_hit_rate=oracle.hit_rate,
        extra={
            "wall_s": wall_s,
            "target": args.target,
            "model": model,
            "workload": args.workload,
            "concurrency": args.concurrency,
            "time_scale": args.time_scale,
            "rate": args.rate,
            "scale": args.scale,
        },
    )
    print(report.summary_table(summ))
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"first error: {errors[0]}", file=sys.stderr)
    path = report.write_json(_out_path(args, "run"), report.results_payload(summ, results))
    print(f"wrote {path}", file=sys.stderr)
    if args.html:
        print(
            f"wrote {report.html_report({label: results}, args.html, title=label)}", file=sys.stderr
        )
    return 0 if summ.completed else 1


def _policy_params(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--params must be a JSON object: {exc}") from None
    if not isinstance(params, dict):
        raise SystemExit("--params must be a JSON object")
    return params


def _sim_requests(args: argparse.Namespace) -> list[BenchRequest]:
    reqs = workload_from_args(args)
    if not reqs:
        raise SystemExit("workload has no requests")
    if args.concurrency:
        return reqs
    try:
        return with_arrivals(reqs, rate_rps=args.rate, seed=args.seed)
    except ValueError as exc:
        raise SystemExit(f"{exc} (or --concurrency for closed loop)") from None


def cmd_sim(args: argparse.Namespace) -> int:
    from bench.clustersim import SimConfig, simulate

    reqs = _sim_requests(args)
    summaries = []
    runs = {}
    for policy in args.policy:
        cfg = SimConfig(
            engines=args.engines,
            policy=policy,
            params=_policy_params(args.params),
            profile=args.profile,
            seed=args.seed,
            concurrency=args.concurrency,
            max_model_len=args.max_model_len,
            scrape_interval_s=args.scrape_interval_s,
            num_blocks=args.num_blocks,
            approx_ttl_s=args.approx_ttl_s,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        out = simulate(reqs, config=cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        label = args.label or f"sim {args.workload} {policy} x{args.engines} {args.profile}"
        if len(args.policy) > 1:
            label = f"sim {args.workload} {policy} x{args.engines} {args.profile}"
        summ = report.summarize(
            out.results,
            label=label,
            slo_ttft_ms=args.slo_ttft_ms,
            oracle_hit_rate=oracle_hit_rate(reqs, block_size=out.block_size).hit_rate,
            extra={
                "wall_s": wall,
                "cpu_s": cpu,
                "virtual_s": out.virtual_s,
                "engines": args.engines,
                "policy": policy,
                "params": cfg.params,
                "profile": args.profile,
                "per_engine_requests": out.per_engine_requests,
                "events": out.events,
                "predicted_cached_tokens": out.predicted_cached_tokens,
                "rejected": out.rejected,
            },
        )
        print(report.summary_table(summ))
        print(
            f"simulated {out.virtual_s:,.1f} s of virtual time in {wall:.1f} s wall, {cpu:.1f} s CPU "
            f"({out.virtual_s / max(wall, 1e-9):,.0f}x real time); requests per engine "
            f"{out.per_engine_requests}"
        )
        summaries.append(summ)
        runs[label] = out.results
        suffix = f"-{policy}" if len(args.policy) > 1 else ""
        report.write_json(_out_path(args, "sim", suffix), report.results_payload(summ, out.results))
    if args.html:
        print(
            f"wrote {report.html_report(runs, args.html, title=f'sim {args.workload}')}",
            file=sys.stderr,
        )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from bench.sweep import DEFAULT_GRIDS, parse_grid, run_sweep, sweep_heatmap_html, sweep_table

    reqs = _sim_requests(args)
    try:
        grid = parse_grid(args.grid) if args.grid else dict(DEFAULT_GRIDS.get(args.policy, {}))
    except ValueError as exc:
        raise SystemExit(f"--grid: {exc}") from None
    t0 = time.perf_counter()
    rows = run_sweep(
        reqs,
        policy=args.policy,
        grid=grid,
        engines=args.engines,
        profile=args.profile,
        base_params=_policy_params(args.params),
        seed=args.seed,
        concurrency=args.concurrency,
        slo_ttft_ms=args.slo_ttft_ms,
        max_model_len=args.max_model_len,
    )
    print(sweep_table(rows))
    print(f"{len(rows)} points in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    report.write_json(_out_path(args, "sweep", f"-{args.policy}"), {"grid": grid, "rows": rows})
    if args.html:
        print(
            f"wrote {sweep_heatmap_html(rows, args.html, grid=grid, title=f'sweep {args.policy} on {args.workload}')}",
            file=sys.stderr,
        )
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    for name, docs in WORKLOAD_PARAMS.items():
        print(name)
        for k, d in docs.items():
            print(f"  {k:<20} {str(d.default):<12} {d.help}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="live load against an OpenAI-compatible endpoint")
    add_workload_args(run)
    run.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", help="model name (default: first of /v1/models)")
    run.add_argument("--api-key")
    run.add_argument("--concurrency", type=int, help="closed loop with this many clients")
    run.add_argument("--max-inflight", type=int, default=512, help="open loop connection cap")
    run.add_argument("--timeout-s", type=float, default=600.0)
    run.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the fleet's --time-scale: arrivals compressed, latencies reported in model ms",
    )
    run.add_argument(
        "--prompt-format",
        choices=["tokens", "text"],
        default="tokens",
        help="token-id lists, or one builtin-tokenizer word per token (string-only routers)",
    )
    run.add_argument("--label")
    run.add_argument("--html", help="write a self-contained Plotly report here")
    run.set_defaults(fn=cmd_run)

    for name, fn, hlp in (
        ("sim", cmd_sim, "offline virtual-time cluster simulation"),
        ("sweep", cmd_sweep, "grid over policy parameters in the simulator"),
    ):
        p = sub.add_parser(name, help=hlp)
        add_workload_args(p)
        p.add_argument("--engines", type=int, default=8)
        p.add_argument("--profile", default="h100-8b")
        p.add_argument("--max-model-len", type=int, help="override the profile's max_model_len")
        p.add_argument("--num-blocks", type=int, help="override the profile's KV blocks per engine")
        p.add_argument(
            "--approx-ttl-s",
            type=float,
            default=120.0,
            help="model seconds an approximate (routed, unconfirmed) index entry lives",
        )
        p.add_argument("--params", help="policy parameters as a JSON object")
        p.add_argument(
            "--scrape-interval-s",
            type=float,
            default=1.0,
            help="model seconds between the gateway's worker-metrics scrapes (0: always fresh)",
        )
        p.add_argument("--concurrency", type=int, help="closed loop with this many clients")
        p.add_argument("--html", help="write a self-contained Plotly report here")
        p.add_argument("--label")
        if name == "sim":
            p.add_argument(
                "--policy",
                action="append",
                required=True,
                help="routing policy (repeat to compare several)",
            )
        else:
            p.add_argument("--policy", default="kv_score")
            p.add_argument(
                "--grid",
                action="append",
                metavar="NAME=V1,V2,...",
                help="a parameter axis (repeat for 2-D)",
            )
        p.set_defaults(fn=fn)

    wl = sub.add_parser("workloads", help="list workloads and their parameters")
    wl.set_defaults(fn=cmd_workloads)

    args = ap.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
