"""Gateway overhead: what routing through the gateway adds to calling a worker directly.

    .venv/bin/python bench/gateway_bench.py            # full run (~2 minutes)
    .venv/bin/python bench/gateway_bench.py --quick    # shorter phases

Three processes on this machine: simulated workers (workers.sim, `h100-8b` profile with
time_scale 1e-6, i.e. zero model time), the gateway (uvicorn + channels, kv_score, KV events
on, builtin tokenizer, metrics scraper on), and this process as the load generator (raw
asyncio HTTP/1.1 keep-alive client, much cheaper per request than httpx so it disturbs the
measurement less). All three share the machine's CPU cores.

Measured:
1. streaming chat requests (shared system prompts, ~300 prompt tokens, 8 output tokens),
   open-loop Poisson arrivals at 50 and 200 req/s: TTFT (first SSE event) p50/p99, sent
   directly to the workers (round robin) and through the gateway; "added" is the gateway's
   minus the direct percentile;
2. max sustained req/s: closed loop, 32 concurrent clients, direct and through the gateway;
3. routing overhead in-process (no network): `GatewayState.plan` for an 8192-token
   token-id prompt against 8 workers and an index of ~200k entries (block keys + index match
   + worker views + kv_score decision), and the same with the builtin tokenizer on a text
   prompt of about 8k tokens.

CPU per request: the gateway process's user + system CPU seconds (Linux /proc) over each
phase divided by the requests it completed; the open-loop figure (fixed rate) is the one to
compare across runs.

Prints a table and writes bench/results/gateway_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODEL = "sim-8b"
RESULTS = ROOT / "bench" / "results" / "gateway_bench.json"
SYSTEMS = [
    " ".join(
        f"tenant {t} policy {i}: answer briefly, cite sources, keep the cache warm."
        for i in range(30)
    )
    for t in range(8)
]


ERRORS: collections.Counter[str] = collections.Counter()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# -- roles run in subprocesses ----------------------------------------------------------------


def role_fleet(args: argparse.Namespace) -> None:
    from workers.sim.fleet import start_fleet

    fleet = start_fleet(args.count, model=MODEL, profile="h100-8b", time_scale=1e-6, eos_range=None)
    infos = [w.to_dict() for w in fleet.workers]
    Path(args.out).write_text(json.dumps(infos))
    sys.stdin.read()  # until the parent closes our stdin
    fleet.stop()


def role_gateway(args: argparse.Namespace) -> None:
    import socket

    import uvicorn

    from routing.gateway.config import GatewayConfig
    from routing.gateway.consumers import GatewayHandle
    from routing.gateway.routing import gateway_app
    from routing.gateway.state import build_gateway_state

    doc = json.loads(Path(args.snapshot).read_text())
    config = GatewayConfig(metrics_interval_s=1.0, snapshot_poll_s=60.0)
    handle = GatewayHandle(lambda: build_gateway_state(config, snapshot=doc), config=config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    Path(args.out).write_text(str(sock.getsockname()[1]))
    server = uvicorn.Server(
        uvicorn.Config(
            gateway_app(handle),
            log_level="warning",
            access_log=False,
            http="httptools",
            loop="asyncio",
            lifespan="on",
        )
    )
    profile_to = os.environ.get("KVROUTE_BENCH_PROFILE")
    if profile_to:
        import cProfile

        cProfile.runctx(
            "server.run(sockets=[sock])", globals(), {"server": server, "sock": sock}, profile_to
        )
    else:
        server.run(sockets=[sock])


# -- load generator ----------------------------------------------------------------------------


class Pool:
    """Keep-alive HTTP/1.1 connections to one host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = conn = self.idle.pop()
            # A connection idle past the server's keep-alive timeout (uvicorn: 5 s) was closed
            # by the server: using it would count as a failed request.
            if not reader.at_eof() and not writer.is_closing():
                return conn
            writer.close()
        return await asyncio.open_connection(self.host, self.port)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


def build_request(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n"
    ).encode() + raw


async def one_request(pool: Pool, request: bytes) -> tuple[float, float] | None:
    """(ttft_s, e2e_s) of one streamed request, or None on failure."""
    t0 = time.perf_counter()
    try:
        conn = await pool.get()
    except OSError as exc:
        ERRORS[f"connect {type(exc).__name__}: {str(exc)[:60]}"] += 1
        return None
    reader, writer = conn
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head[:60])
        ttft = None
        if b"transfer-encoding: chunked" in head.lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                await reader.readexactly(size + 2)
                if ttft is None:
                    ttft = time.perf_counter() - t0
        else:
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            ttft = time.perf_counter() - t0
        e2e = time.perf_counter() - t0
        pool.put(conn)
        return (ttft or e2e), e2e
    except Exception as exc:
        ERRORS[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
        writer.close()
        return None


def request_body(i: int, rng: random.Random) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": SYSTEMS[rng.randrange(len(SYSTEMS))]},
            {"role": "user", "content": f"question {i}: how does prefix caching help here?"},
        ],
        "max_tokens": 8,
        "stream": True,
        "ignore_eos": True,
    }


async def open_loop(
    targets: list[tuple[str, int]], *, rate: float, duration_s: float, seed: int
) -> dict[str, Any]:
    pools = [Pool(h, p) for h, p in targets]
    rng = random.Random(seed)
    n = int(rate * duration_s)
    requests = [build_request("/v1/chat/completions", request_body(i, rng)) for i in range(n)]
    tasks = []
    start = time.perf_counter()
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one_request(pools[i % len(pools)], requests[i])))
    results = await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for p in pools:
        p.close()
    ok = [r for r in results if r is not None]
    ttft_ms = [r[0] * 1000 for r in ok]
    return {
        "rate": rate,
        "requests": n,
        "failed": n - len(ok),
        "achieved_rps": len(ok) / elapsed,
        "ttft_p50_ms": pct(ttft_ms, 50),
        "ttft_p99_ms": pct(ttft_ms, 99),
        "e2e_p50_ms": pct([r[1] * 1000 for r in ok], 50),
    }


async def closed_loop(
    targets: list[tuple[str, int]], *, concurrency: int, duration_s: float
) -> dict[str, Any]:
    pools = [Pool(h, p) for h, p in targets]
    rng = random.Random(1)
    requests = [build_request("/v1/chat/completions", request_body(i, rng)) for i in range(512)]
    done = 0
    failed = 0
    stop_at = time.perf_counter() + duration_s

    async def client(c: int) -> None:
        nonlocal done, failed
        i = c
        while time.perf_counter() < stop_at:
            r = await one_request(pools[i % len(pools)], requests[i % len(requests)])
            i += concurrency
            if r is None:
                failed += 1
            else:
                done += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    elapsed = time.perf_counter() - start
    for p in pools:
        p.close()
    return {
        "concurrency": concurrency,
        "rps": done / elapsed,
        "failed": failed,
        "elapsed_s": elapsed,
    }


# -- in-process routing overhead -----------------------------------------------------------------


def routing_overhead(*, samples: int) -> dict[str, Any]:
    from routing.core.blocks import token_block_keys
    from routing.core.tokenizer import builtin_encode
    from routing.gateway.config import GatewayConfig
    from routing.gateway.snapshot import parse_snapshot
    from routing.gateway.state import build_gateway_state
    from routing.gateway.tokenization import Encoded

    workers = [
        {
            "id": f"w{i}",
            "url": f"http://127.0.0.1:{9000 + i}",
            "model": MODEL,
            "state": "active",
            "healthy": True,
            "block_size": 16,
            "capacity_blocks": 0,
            "network_ms": 0.0,
            "labels": {"tokenizer": "builtin"},
        }
        for i in range(8)
    ]
    doc = {
        "revision": "bench",
        "workers": workers,
        "models": {
            MODEL: {
                "active": {
                    "policy": "kv",
                    "version": 1,
                    "version_id": 1,
                    "type": "kv_score",
                    "params": {},
                },
                "experiment": None,
            }
        },
    }
    state = build_gateway_state(GatewayConfig(metrics_interval_s=0), snapshot=doc)
    state.apply_snapshot(parse_snapshot(doc))
    rng = random.Random(3)
    now = state.clock()
    # ~200k index entries: 400 distinct 8k-token prompts spread over the workers.
    for p in range(400):
        toks = [rng.randrange(32000) for _ in range(8192)]
        state.index.record_routed(f"w{p % 8}", token_block_keys(toks, 16), now_s=now)
    shared = [rng.randrange(32000) for _ in range(6000)]
    state.index.record_routed("w3", token_block_keys(shared, 16), now_s=now)
    prompts = [
        shared + [rng.randrange(32000) for _ in range(8192 - len(shared))] for _ in range(samples)
    ]
    specs = state.model_workers(MODEL)
    plan_us = []
    for i, toks in enumerate(prompts):
        t0 = time.perf_counter()
        state.plan(
            model=MODEL,
            workers=specs,
            encoded=Encoded(toks, None, len(toks)),
            session_key=None,
            tenant=None,
            request_id=str(i),
            now_s=state.clock(),
        )
        plan_us.append((time.perf_counter() - t0) * 1e6)
    # Text prompt of about 8k builtin tokens.
    words = ["the", "cache", "block", "route", "prefix", "worker", "engine", "model", "token"]
    text = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(4096))
    ntok = len(builtin_encode(text))
    tok_us = []
    adapter = state.adapter_for(MODEL)
    loop = asyncio.new_event_loop()
    try:
        for i in range(max(20, samples // 5)):
            t0 = time.perf_counter()
            enc = loop.run_until_complete(adapter.encode_text(text, worker_url=""))
            state.plan(
                model=MODEL,
                workers=specs,
                encoded=enc,
                session_key=None,
                tenant=None,
                request_id=f"t{i}",
                now_s=state.clock(),
            )
            tok_us.append((time.perf_counter() - t0) * 1e6)
    finally:
        loop.run_until_complete(state.client.aclose())
        loop.close()
    return {
        "index_entries": len(state.index),
        "workers": 8,
        "plan_8k_token_ids_p50_us": pct(plan_us, 50),
        "plan_8k_token_ids_p99_us": pct(plan_us, 99),
        "text_prompt_tokens": ntok,
        "tokenize_and_plan_8k_text_p50_us": pct(tok_us, 50),
    }


# -- orchestration -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--role", choices=["main", "fleet", "gateway"], default="main")
    ap.add_argument("--out", default="")
    ap.add_argument("--snapshot", default="")
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="short phases (for a smoke run)")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run every process in its own session with this niceness (negative needs root)",
    )
    args = ap.parse_args()
    if args.role == "fleet":
        return role_fleet(args)
    if args.role == "gateway":
        return role_gateway(args)

    phase_s = 4.0 if args.quick else 12.0
    if args.nice:
        # The load generator too: it times both paths, so it must not be starved either.
        with contextlib.suppress(OSError):
            os.setsid()
        os.nice(args.nice)
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(args.nice))
    print("routing overhead (in-process) ...", flush=True)
    overhead = routing_overhead(samples=50 if args.quick else 300)

    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    me = [sys.executable, str(Path(__file__).resolve())]

    def isolate() -> None:
        # Its own session (scheduler autogroup) and a raised priority: the machine is shared
        # with other people's processes, and both paths (direct and gateway) get the same.
        os.setsid()
        if args.nice:
            os.nice(args.nice)
            with contextlib.suppress(OSError):
                Path("/proc/self/autogroup").write_text(str(args.nice))

    fleet = subprocess.Popen(
        [*me, "--role", "fleet", "--count", str(args.count), "--out", str(tmp / "fleet.json")],
        stdin=subprocess.PIPE,
        env=env,
        preexec_fn=isolate,
    )
    gateway = None
    try:
        while not (tmp / "fleet.json").exists():
            time.sleep(0.05)
            if fleet.poll() is not None:
                raise SystemExit("fleet failed to start")
        time.sleep(0.1)
        infos = json.loads((tmp / "fleet.json").read_text())
        doc = {
            "revision": "bench",
            "workers": [
                {
                    "id": w["id"],
                    "url": w["url"],
                    "model": MODEL,
                    "state": "active",
                    "healthy": True,
                    "block_size": w["block_size"],
                    "capacity_blocks": w["capacity_blocks"],
                    "network_ms": 0.0,
                    "kv_events_endpoint": w["kv_events_endpoint"],
                    "replay_endpoint": w["replay_endpoint"],
                    "labels": {"tokenizer": "builtin"},
                }
                for w in infos
            ],
            "models": {
                MODEL: {
                    "active": {
                        "policy": "kv-default",
                        "version": 1,
                        "version_id": 1,
                        "type": "kv_score",
                        "params": {},
                    },
                    "experiment": None,
                }
            },
        }
        (tmp / "snapshot.json").write_text(json.dumps(doc))
        gateway = subprocess.Popen(
            [
                *me,
                "--role",
                "gateway",
                "--snapshot",
                str(tmp / "snapshot.json"),
                "--out",
                str(tmp / "port"),
            ],
            env=env,
            preexec_fn=isolate,
        )
        while not (tmp / "port").exists() or not (tmp / "port").read_text():
            time.sleep(0.05)
            if gateway.poll() is not None:
                raise SystemExit("gateway failed to start")
        gw_port = int((tmp / "port").read_text())
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                if (
                    httpx.get(f"http://127.0.0.1:{gw_port}/gateway/health", timeout=2).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or gateway.poll() is not None:
                raise SystemExit("gateway did not become healthy")
            time.sleep(0.1)
        direct = [("127.0.0.1", int(w["url"].rsplit(":", 1)[1])) for w in infos]
        via_gw = [("127.0.0.1", gw_port)]
        time.sleep(1.0)

        async def run_all() -> dict[str, Any]:
            # Warm both paths (connections, caches, the gateway's lazy start).
            await open_loop(via_gw, rate=50, duration_s=2, seed=99)
            await open_loop(direct, rate=50, duration_s=2, seed=99)
            out: dict[str, Any] = {"open_loop": [], "closed_loop": {}}
            for rate in (50, 200):
                for name, targets in (("direct", direct), ("gateway", via_gw)):
                    print(f"open loop {rate} req/s {name} ...", flush=True)
                    cpu0 = {"fleet": cpu_s(fleet.pid), "gateway": cpu_s(gateway.pid)}
                    res = await open_loop(targets, rate=rate, duration_s=phase_s, seed=rate)
                    # At a fixed rate, so comparable across runs (the closed loop's figure
                    # depends on how busy the machine is, since batching changes with load).
                    done = max(1, res["requests"] - res["failed"])
                    res["cpu_ms_per_request"] = {
                        proc: (cpu_s(p.pid) - cpu0[proc]) * 1000 / done
                        for proc, p in (("fleet", fleet), ("gateway", gateway))
                    }
                    out["open_loop"].append({"path": name, **res})
            for name, targets in (("direct", direct), ("gateway", via_gw)):
                print(f"closed loop {name} ...", flush=True)
                cpu0 = {"fleet": cpu_s(fleet.pid), "gateway": cpu_s(gateway.pid)}
                res = await closed_loop(targets, concurrency=32, duration_s=phase_s / 2)
                done = res["rps"] * res["elapsed_s"]
                res["cpu_ms_per_request"] = {
                    proc: (cpu_s(p.pid) - cpu0[proc]) * 1000 / max(1.0, done)
                    for proc, p in (("fleet", fleet), ("gateway", gateway))
                }
                out["closed_loop"][name] = res
            return out

        results = asyncio.run(run_all())
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(10)
        if fleet.stdin:
            fleet.stdin.close()
        try:
            fleet.wait(10)
        except subprocess.TimeoutExpired:
            fleet.kill()

    rows = []
    for rate in (50, 200):
        d = next(r for r in results["open_loop"] if r["path"] == "direct" and r["rate"] == rate)
        g = next(r for r in results["open_loop"] if r["path"] == "gateway" and r["rate"] == rate)
        rows.append(
            {
                "rate": rate,
                "direct_p50_ms": d["ttft_p50_ms"],
                "direct_p99_ms": d["ttft_p99_ms"],
                "gateway_p50_ms": g["ttft_p50_ms"],
                "gateway_p99_ms": g["ttft_p99_ms"],
                "added_p50_ms": g["ttft_p50_ms"] - d["ttft_p50_ms"],
                "added_p99_ms": g["ttft_p99_ms"] - d["ttft_p99_ms"],
                "failed": d["failed"] + g["failed"],
                "gateway_achieved_rps": g["achieved_rps"],
                "gateway_cpu_ms_per_request": g["cpu_ms_per_request"]["gateway"],
            }
        )
    at200 = rows[-1]
    targets = {
        "added_p50_ms_at_200": (at200["added_p50_ms"], 2.0),
        "added_p99_ms_at_200": (at200["added_p99_ms"], 10.0),
        "routing_overhead_8k_p50_us": (overhead["plan_8k_token_ids_p50_us"], 1000.0),
    }
    print()
    load = os.getloadavg()
    print(
        f"cores: {os.cpu_count()} (shared by the workers, the gateway and this load generator); "
        f"load average during the run: {load[0]:.1f} / {load[1]:.1f} (1 / 5 min)"
    )
    print(
        "| rate req/s | direct TTFT p50 / p99 ms | gateway TTFT p50 / p99 ms | added p50 / p99 ms "
        "| gateway CPU ms/req | failed |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['rate']} | {r['direct_p50_ms']:.2f} / {r['direct_p99_ms']:.2f} | {r['gateway_p50_ms']:.2f} / {r['gateway_p99_ms']:.2f} "
            f"| {r['added_p50_ms']:.2f} / {r['added_p99_ms']:.2f} | {r['gateway_cpu_ms_per_request']:.2f} | {r['failed']} |"
        )
    cl = results["closed_loop"]
    print(
        f"\nmax sustained (closed loop, 32 clients): direct {cl['direct']['rps']:.0f} req/s, gateway {cl['gateway']['rps']:.0f} req/s"
    )
    cpu = {name: cl[name]["cpu_ms_per_request"] for name in ("direct", "gateway")}
    print(
        f"CPU per request (closed loop): gateway process {cpu['gateway']['gateway']:.2f} ms; "
        f"worker process {cpu['direct']['fleet']:.2f} ms direct, {cpu['gateway']['fleet']:.2f} ms via gateway"
    )
    print(
        f"routing overhead, 8192-token token-id prompt, 8 workers, {overhead['index_entries']} index entries: "
        f"p50 {overhead['plan_8k_token_ids_p50_us']:.0f} us, p99 {overhead['plan_8k_token_ids_p99_us']:.0f} us"
    )
    print(
        f"builtin tokenize + plan, {overhead['text_prompt_tokens']}-token text prompt: p50 {overhead['tokenize_and_plan_8k_text_p50_us']:.0f} us"
    )
    if ERRORS:
        print("client-side failures:", dict(ERRORS.most_common(5)))
    print()
    for name, (value, limit) in targets.items():
        print(f"target {name}: {value:.2f} <= {limit}: {'met' if value <= limit else 'MISSED'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "command": "python bench/gateway_bench.py"
                + (" --quick" if args.quick else "")
                + (f" --nice={args.nice}" if args.nice else ""),
                "cpu_count": os.cpu_count(),
                "loadavg_1m_5m": list(os.getloadavg()[:2]),
                "phase_s": phase_s,
                "ttft": rows,
                "open_loop": results["open_loop"],
                "closed_loop": cl,
                "routing_overhead": overhead,
                "client_errors": dict(ERRORS),
                "targets": {
                    k: {"value": v, "limit": lim, "met": v <= lim}
                    for k, (v, lim) in targets.items()
                },
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
