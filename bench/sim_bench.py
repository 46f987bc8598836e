"""How many simulated vLLM workers one CPU core sustains at a given request rate.

For each fleet size N, a subprocess pinned to one core runs `python -m workers.sim fleet`
(N workers, real uvicorn + ZMQ publishers, profile h100-8b at time_scale 1) and this
process, pinned to another core, sends streaming `/v1/completions` requests at a Poisson
aggregate rate spread round-robin over the workers, reading every SSE chunk. At the end
each worker's `/sim/stats` reports how far its steps' wall time strayed from the model's
step time. A size "holds" when the fleet-wide mean step error is within 5 % and the
offered rate was delivered (>= 95 % of requests completed in the window).

    .venv/bin/python bench/sim_bench.py --workers 16,32,48,64,96 --rate 50 --duration 20 --nice=-10

The fleet runs in its own session (its own scheduler autogroup); `--nice=-10` (root) gives
that group a core's priority on a machine shared with other work. Also reported: the fleet's
CPU and run-queue wait (schedstat), and the pure engine's CPU cost per step in virtual time.
Prints a table and writes bench/results/sim_bench.json (or `--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "sim_bench.json"
TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Point:
    workers: int
    rate_per_s: float
    sent: int
    completed: int
    errors: int
    achieved_rate_per_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    steps: int
    step_mean_error: float
    step_p50_error: float
    step_p99_error: float
    late_step_frac: float
    fleet_cpu_frac: float
    fleet_cpu_ms_per_request: float
    fleet_runqueue_wait_frac: float
    load_avg_1m: float
    holds: bool


async def _one_request(host: str, port: int, body: bytes, out: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (host.encode(), len(body), body)
        )
        await writer.drain()
        buf = b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if "ttft_s" not in out and b"data: {" in data:
                out["ttft_s"] = time.perf_counter() - t0
            buf += data
            if b"data: [DONE]" in buf[-64:]:
                break
        out["ok"] = buf.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in buf
        out["tokens"] = buf.count(b'"text":')
    finally:
        writer.close()


async def _drive(
    urls: list[str],
    *,
    rate: float,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
    on_window_end: Any = None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    # Half the requests share a long system prefix (per worker-agnostic "tenant"), the rest
    # are unique, so the engines do real prefix-cache work and real prefill.
    shared = [rng.randrange(1000, 30000) for _ in range(prompt_tokens // 2)]
    results: list[dict[str, Any]] = []
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    next_t = 0.0
    i = 0
    while next_t < duration_s:
        delay = start + next_t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        head = (
            shared
            if i % 2 == 0
            else [rng.randrange(1000, 30000) for _ in range(prompt_tokens // 2)]
        )
        prompt = head + [rng.randrange(1000, 30000) for _ in range(prompt_tokens - len(head))]
        body = json.dumps(
            {
                "model": "sim-8b",
                "prompt": prompt,
                "max_tokens": output_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        host, port = urls[i % len(urls)].removeprefix("http://").split(":")
        out: dict[str, Any] = {"sent_s": next_t}
        results.append(out)
        tasks.append(asyncio.create_task(_one_request(host, int(port), body, out)))
        i += 1
        next_t += rng.expovariate(rate)
    window_end = time.perf_counter()
    if on_window_end is not None:
        on_window_end()
    done, pending = await asyncio.wait(tasks, timeout=30)
    for t in pending:
        t.cancel()
    return {
        "results": results,
        "window_s": window_end - start,
        "errors": sum(1 for t in done if t.exception() is not None),
    }


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def measure(
    n: int,
    *,
    rate: float,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    fleet_core: int | None,
    nice: int = 0,
    seed: int,
) -> Point:
    cmd = [
        sys.executable,
        "-m",
        "workers.sim",
        "fleet",
        "--count",
        str(n),
        "--base-port",
        "0",
        "--events-base-port",
        "0",
        "--profile",
        "h100-8b",
        "--num-blocks",
        "4096",
        "--time-scale",
        "1.0",
    ]

    def preexec() -> None:
        # Its own session, hence its own scheduler autogroup: the fleet competes as one
        # group rather than as one process among every other tenant's on a shared machine.
        os.setsid()
        if fleet_core is not None:
            os.sched_setaffinity(0, {fleet_core})
        if nice:
            os.nice(nice)
            with contextlib.suppress(OSError):
                Path("/proc/self/autogroup").write_text(str(nice))

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
    try:
        assert proc.stdout is not None
        urls = [proc.stdout.readline().strip() for _ in range(n)]
        json.loads(proc.stdout.readline())
        cpu0, rq0, wall0 = _cpu_seconds(proc.pid), _runqueue_wait_s(proc.pid), time.perf_counter()
        at_end: list[float] = []

        def window_end() -> None:
            # CPU over the offered-load window only, not the drain of stragglers after it.
            at_end.extend([_cpu_seconds(proc.pid), _runqueue_wait_s(proc.pid), time.perf_counter()])

        run = asyncio.run(
            _drive(
                urls,
                rate=rate,
                duration_s=duration_s,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                seed=seed,
                on_window_end=window_end,
            )
        )
        elapsed = at_end[2] - wall0
        cpu_frac = (at_end[0] - cpu0) / elapsed
        runq_frac = (at_end[1] - rq0) / elapsed
        load1 = os.getloadavg()[0]
        stats = [_get_json(f"{u}/sim/stats")["timing"] for u in urls]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    results = run["results"]
    ok = [r for r in results if r.get("ok")]
    ttfts = sorted(r["ttft_s"] * 1000 for r in ok if "ttft_s" in r)
    steps = sum(s["steps"] for s in stats)
    model_s = sum(s["model_wall_s"] for s in stats)
    actual_s = sum(s["actual_wall_s"] for s in stats)
    mean_err = actual_s / model_s - 1.0 if model_s else 0.0
    completed_frac = len(ok) / len(results) if results else 0.0
    return Point(
        workers=n,
        rate_per_s=rate,
        sent=len(results),
        completed=len(ok),
        errors=len(results) - len(ok),
        achieved_rate_per_s=len(ok) / run["window_s"],
        tokens_per_s=sum(r.get("tokens", 0) for r in ok) / run["window_s"],
        ttft_p50_ms=statistics.median(ttfts) if ttfts else float("nan"),
        ttft_p99_ms=ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan"),
        steps=steps,
        step_mean_error=mean_err,
        step_p50_error=statistics.median(s["p50_rel_error"] for s in stats),
        step_p99_error=max(s["p99_rel_error"] for s in stats),
        late_step_frac=sum(s["late_steps"] for s in stats) / steps if steps else 0.0,
        fleet_cpu_frac=cpu_frac,
        fleet_cpu_ms_per_request=cpu_frac * elapsed * 1000 / max(1, len(results)),
        fleet_runqueue_wait_frac=runq_frac,
        load_avg_1m=load1,
        holds=mean_err <= TOLERANCE and completed_frac >= 0.95,
    )


def engine_cost(
    *, rate: float, duration_s: float, prompt_tokens: int, output_tokens: int, seed: int
) -> dict[str, float]:
    """CPU cost of the pure engine in virtual time (no HTTP, no sleeping): one h100-8b
    engine fed the same workload; independent of other load on the machine."""
    from workers.sim.engine import Engine
    from workers.sim.profiles import PROFILES

    rng = random.Random(seed)
    engine = Engine(profile=PROFILES["h100-8b"], num_blocks=4096, eos_range=None)
    shared = [rng.randrange(1000, 30000) for _ in range(prompt_tokens // 2)]
    arrivals: list[float] = []
    t = 0.0
    while t < duration_s:
        arrivals.append(t)
        t += rng.expovariate(rate)
    cpu0 = time.thread_time()
    now, i, steps, batch = 0.0, 0, 0, 0
    while i < len(arrivals) or engine.has_work():
        while i < len(arrivals) and arrivals[i] <= now:
            head = (
                shared
                if i % 2 == 0
                else [rng.randrange(1000, 30000) for _ in range(prompt_tokens // 2)]
            )
            prompt = head + [rng.randrange(1000, 30000) for _ in range(prompt_tokens - len(head))]
            engine.add_request(
                request_id=f"r{i}",
                prompt_token_ids=prompt,
                max_tokens=output_tokens,
                arrival_s=arrivals[i],
                ignore_eos=True,
            )
            i += 1
        nxt = engine.next_step_time_s(now_s=now)
        if nxt is None:
            now = arrivals[i]
            continue
        batch += engine.stats().running
        result = engine.step(now_s=nxt)
        now = result.end_s if result.duration_s > 0 else max(now, nxt)
        steps += 1
    cpu_s = time.thread_time() - cpu0
    return {
        "requests": len(arrivals),
        "steps": steps,
        "cpu_s": cpu_s,
        "us_per_step": cpu_s / steps * 1e6 if steps else 0.0,
        "mean_running_per_step": batch / steps if steps else 0.0,
        "model_s": now,
        "virtual_speedup": now / cpu_s if cpu_s else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workers", default="16,32,48,64", help="comma-separated fleet sizes")
    ap.add_argument("--rate", type=float, default=50.0, help="aggregate requests per second")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per fleet size")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(RESULTS), help="where to write the JSON results")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness increment for the fleet process (negative needs root)",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the fleet and the load generator to separate cores",
    )
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    fleet_core = None if args.no_pin or len(cores) < 2 else cores[0]
    if fleet_core is not None:
        os.sched_setaffinity(0, set(cores[1:]))
    cost = engine_cost(
        rate=args.rate / 16,
        duration_s=60.0,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
    )
    print(
        f"engine alone (virtual time, one worker's share = {args.rate / 16:.2f} req/s, 60 model s): "
        f"{cost['steps']} steps, {cost['us_per_step']:.0f} us CPU/step, {cost['mean_running_per_step']:.1f} running/step, "
        f"{cost['virtual_speedup']:.0f}x faster than real time",
        flush=True,
    )
    points = []
    for n in (int(x) for x in args.workers.split(",")):
        p = measure(
            n,
            rate=args.rate,
            duration_s=args.duration,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            fleet_core=fleet_core,
            nice=args.nice,
            seed=args.seed,
        )
        points.append(p)
        print(
            f"workers={p.workers:3d} rate={p.rate_per_s:5.1f}/s done={p.completed:5d}/{p.sent:<5d} "
            f"achieved={p.achieved_rate_per_s:5.1f}/s tok/s={p.tokens_per_s:7.0f} ttft p50/p99={p.ttft_p50_ms:6.1f}/{p.ttft_p99_ms:7.1f} ms "
            f"steps={p.steps:6d} step err mean/p50/p99={p.step_mean_error:+.3f}/{p.step_p50_error:+.3f}/{p.step_p99_error:+.3f} "
            f"late>5%={p.late_step_frac:.2f} fleet cpu={p.fleet_cpu_frac:.2f} ({p.fleet_cpu_ms_per_request:.1f} ms/req) runq wait={p.fleet_runqueue_wait_frac:.2f} load={p.load_avg_1m:.1f} "
            f"{'HOLDS' if p.holds else 'MISSED'}",
            flush=True,
        )
    best = max((p.workers for p in points if p.holds), default=0)
    print(
        f"\nmax workers holding {args.rate:.0f} req/s within {TOLERANCE:.0%} step timing on one core: {best}"
    )
    print(
        "\n| workers | offered req/s | delivered req/s | TTFT p50 / p99 ms | step error mean / p99 | fleet CPU (core) | run-queue wait | load | within 5 % |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in points:
        print(
            f"| {p.workers} | {p.rate_per_s:.0f} | {p.achieved_rate_per_s:.1f} | {p.ttft_p50_ms:.0f} / {p.ttft_p99_ms:.0f} | "
            f"{p.step_mean_error:+.1%} / {p.step_p99_error:+.0%} | {p.fleet_cpu_frac:.2f} | {p.fleet_runqueue_wait_frac:.2f} | "
            f"{p.load_avg_1m:.1f} | {'yes' if p.holds else 'no'} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": "python bench/sim_bench.py " + " ".join(sys.argv[1:]),
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "params": vars(args)
                | {
                    "profile": "h100-8b",
                    "time_scale": 1.0,
                    "tolerance": TOLERANCE,
                    "fleet_core": fleet_core,
                },
                "engine_virtual_time": cost,
                "points": [asdict(p) for p in points],
                "max_workers_holding": best,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
