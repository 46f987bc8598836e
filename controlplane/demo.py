"""`make demo` / `python -m controlplane.demo`: the whole product on embedded defaults.

Starts, on loopback: a fleet of simulated vLLM workers (one process), the ASGI server
(control plane + gateway + dashboard; with the embedded job scheduler when REDIS_URL is
unset, or Celery worker+beat on Redis when it is set), one registration agent per worker.
Then it seeds the demo policies, drives a shared-prefix workload through the gateway,
prints what happened and the dashboard URL with a local login, and keeps a gentle
background load flowing so the dashboards stay live. Ctrl-C stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = "sim-8b"
DEMO_USER = "admin"


@dataclass
class Children:
    """Every process the demo started, stopped in reverse order by process group."""

    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(
        self, name: str, argv: Sequence[str], *, env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        out = log.open("ab")
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {proc.returncode} (see var/demo-logs/)"
                )

    def stop_all(self) -> None:
        # A second Ctrl-C must not abandon the cleanup halfway and orphan children.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in time; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controlplane.demo", description=__doc__)
    p.add_argument("--port", type=int, default=int(os.environ.get("KVROUTE_DEMO_PORT", "8000")))
    p.add_argument("--workers", type=int, default=4, help="simulated workers in the fleet")
    p.add_argument("--worker-base-port", type=int, default=8101)
    p.add_argument("--events-base-port", type=int, default=5601)
    p.add_argument("--profile", default="h100-8b", help="simulated engine profile")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every model duration")
    p.add_argument("--requests", type=int, default=120, help="requests in the first demo pass")
    p.add_argument("--rate", type=float, default=4.0, help="req/s of the demo workload")
    p.add_argument(
        "--background-rate", type=float, default=1.0, help="req/s after the first pass (0: none)"
    )
    p.add_argument(
        "--exit-after-pass", action="store_true", help="stop after the first pass (smoke runs)"
    )
    return p.parse_args(argv)


def demo_worker_names(count: int) -> list[str]:
    return [f"sim-{i}" for i in range(count)]


def busy_ports(args: argparse.Namespace) -> list[int]:
    """Ports the demo needs that something else already listens on."""
    wanted = [args.port]
    wanted += [args.worker_base_port + i for i in range(args.workers)]
    wanted += [args.events_base_port + i for i in range(2 * args.workers)]
    busy = []
    for port in wanted:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


def setup_django(*, workers: int) -> dict[str, str]:
    """Migrate, seed the demo policies, and make the local login and tokens."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    (ROOT / "var").mkdir(exist_ok=True)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db.models import Q

    from controlplane.common.auth import OPERATOR, Actor
    from controlplane.common.models import ApiToken
    from controlplane.common.services import api_token_create
    from controlplane.policies.management.commands.seed_demo import seed_demo
    from controlplane.registry.models import Worker
    from controlplane.registry.services import worker_deregister

    call_command("migrate", interactive=False, verbosity=0)
    password = secrets.token_urlsafe(9)
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=DEMO_USER)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    # A new demo fleet replaces the last one: its workers belonged to the old demo token.
    demo_actor = Actor(label="demo", scope=OPERATOR)
    stale = Worker.objects.filter(
        Q(owner_token__name="demo-worker") | Q(name__in=demo_worker_names(workers))
    )
    for name in stale.values_list("name", flat=True):
        worker_deregister(name=name, actor=demo_actor)
    ApiToken.objects.filter(name__in=["demo-worker", "demo-operator"]).delete()
    _, worker_token = api_token_create(name="demo-worker", scope="worker", created_by=user)
    _, operator_token = api_token_create(name="demo-operator", scope="operator", created_by=user)
    for line in seed_demo(model=DEMO_MODEL):
        print(f"  seed: {line}")
    return {"password": password, "worker_token": worker_token, "operator_token": operator_token}


def wait_for(url: str, *, timeout_s: float, children: Children, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children.check()
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up at {url} within {timeout_s:.0f} s")


def start_fleet(
    args: argparse.Namespace, children: Children, env: dict[str, str], logs: Path
) -> list[dict[str, Any]]:
    argv = [
        sys.executable,
        "-m",
        "workers.sim",
        "fleet",
        "--count",
        str(args.workers),
        "--base-port",
        str(args.worker_base_port),
        "--events-base-port",
        str(args.events_base_port),
        "--model",
        DEMO_MODEL,
        "--profile",
        args.profile,
        "--time-scale",
        str(args.time_scale),
    ]
    fleet_out = logs / "fleet.out"
    fleet_out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(logs / "fleet.log").open("ab"),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    children.procs.append(("simulated fleet", proc))
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            children.check()
            time.sleep(0.1)
            continue
        if line.startswith("{"):
            return list(json.loads(line)["workers"])
    raise RuntimeError("the simulated fleet did not report its workers")


def start_jobs(children: Children, env: dict[str, str], logs: Path) -> str:
    if env.get("REDIS_URL"):
        children.start(
            "celery worker+beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "-B",
                "-l",
                "info",
                "--concurrency",
                "1",
                "-s",
                str(ROOT / "var" / "celerybeat-schedule"),
            ],
            env=env,
            log=logs / "celery.log",
        )
        return "Celery worker + beat on Redis (REDIS_URL)"
    return "embedded job scheduler in the web process (controlplane.jobs.EmbeddedScheduler; set REDIS_URL for Celery)"


async def drive(
    base_url: str, *, requests: int, rate: float, seed: int, quiet: bool
) -> dict[str, Any]:
    from bench.loadgen import Target, run_load
    from bench.report import summarize, summary_table
    from bench.workloads import build_workload, oracle_hit_rate, with_arrivals

    tenants, users = 6, 4
    reqs = build_workload(
        "tenants",
        {
            "tenants": tenants,
            "users": users,
            # Enough questions that `requests` are really sent (2 per user capped it at 48).
            "questions_per_user": max(1, -(-requests // (tenants * users))),
            "prefix_tokens": 1500,
            "question_tokens": 120,
            "output_tokens": 24,
        },
        seed=seed,
        limit=requests,
    )
    reqs = with_arrivals(reqs, rate_rps=rate, seed=seed)
    results, wall_s = await run_load(
        reqs, target=Target(base_url=base_url, model=DEMO_MODEL, timeout_s=60)
    )
    oracle = oracle_hit_rate(reqs, block_size=16)
    summary = summarize(results, label="demo", oracle_hit_rate=oracle.hit_rate)
    if not quiet:
        print(summary_table(summary))
    by_worker: dict[str, int] = {}
    for r in results:
        if r.worker:
            by_worker[r.worker] = by_worker.get(r.worker, 0) + 1
    return {"summary": summary, "by_worker": by_worker}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logs = ROOT / "var" / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    base_url = f"http://127.0.0.1:{args.port}"
    busy = busy_ports(args)
    if busy:
        print(
            f"demo: port(s) {', '.join(map(str, busy))} already in use (another demo running?); "
            "choose others with --port, --worker-base-port and --events-base-port",
            file=sys.stderr,
        )
        return 2
    print("kvroute demo: preparing the database, login and demo policies")
    creds = setup_django(workers=args.workers)
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env["KVROUTE_EMBEDDED_JOBS"] = "0" if env.get("REDIS_URL") else "1"
    # The simulated workers tokenize with the builtin tokenizer: the gateway must too, or it
    # falls back to text blocks and its cache predictions never match the engine's.
    env.setdefault("KVROUTE_TOKENIZERS", f"{DEMO_MODEL}=builtin")
    env.setdefault("KVROUTE_CSRF_TRUSTED_ORIGINS", f"{base_url},http://localhost:{args.port}")
    children = Children()
    interrupted = False

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"starting {args.workers} simulated workers (profile {args.profile})")
        workers = start_fleet(args, children, env, logs)
        for w in workers:
            print(f"  {w['id']}: {w['url']}  events {w['kv_events_endpoint']}")
        print(f"starting control plane + gateway + dashboard on {base_url}")
        children.start(
            "web (uvicorn)",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(args.port),
                "--log-level",
                "warning",
                "--lifespan",
                "on",
            ],
            env=env,
            log=logs / "web.log",
        )
        wait_for(
            f"{base_url}/gateway/health", timeout_s=60, children=children, what="the web process"
        )
        print(f"jobs: {start_jobs(children, env, logs)}")
        for name, w in zip(demo_worker_names(len(workers)), workers, strict=True):
            agent = [
                sys.executable,
                "-m",
                "workers.agent",
                "--control-plane",
                base_url,
                "--token",
                creds["worker_token"],
                "--worker-url",
                w["url"],
                "--name",
                name,
                "--model",
                DEMO_MODEL,
            ]
            if w.get("kv_events_endpoint"):
                agent += ["--kv-events", w["kv_events_endpoint"]]
            if w.get("replay_endpoint"):
                agent += ["--replay", w["replay_endpoint"]]
            children.start(f"agent {name}", agent, env=env, log=logs / f"agent-{name}.log")
        wait_models(base_url, children=children, expected=len(workers))
        print(
            f"driving {args.requests} shared-prefix requests at {args.rate:g} req/s through the gateway"
        )
        result = asyncio.run(
            drive(base_url, requests=args.requests, rate=args.rate, seed=1, quiet=False)
        )
        print(
            "requests per worker: "
            + ", ".join(f"{k}={v}" for k, v in sorted(result["by_worker"].items()))
        )
        print()
        print(f"Dashboard:      {base_url}/   (login: {DEMO_USER} / {creds['password']})")
        print(f"Gateway:        {base_url}/v1  (OpenAI-compatible; model {DEMO_MODEL!r})")
        print(f"API docs:       {base_url}/api/docs/   operator token: {creds['operator_token']}")
        print(f"Logs:           {logs}")
        if args.exit_after_pass:
            return 0 if result["summary"].completed > 0 else 1
        print("Background traffic keeps the dashboards live. Ctrl-C stops everything.")
        seed = 2
        while True:
            children.check()
            if args.background_rate > 0:
                asyncio.run(
                    drive(base_url, requests=60, rate=args.background_rate, seed=seed, quiet=True)
                )
                seed += 1
            else:
                time.sleep(1)
    except KeyboardInterrupt:
        interrupted = True
        print("\nstopping everything the demo started")
        return 0
    except RuntimeError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        children.stop_all()
        if interrupted:
            print("stopped")


def wait_models(base_url: str, *, children: Children, expected: int, timeout_s: float = 45) -> None:
    """Wait until the gateway sees every registered, heartbeating worker as routable."""
    deadline = time.monotonic() + timeout_s
    routable = 0
    while time.monotonic() < deadline:
        children.check()
        try:
            doc = httpx.get(f"{base_url}/gateway/health", timeout=2).json()
            routable = sum(1 for w in doc.get("workers", {}).values() if w.get("routable"))
            if routable >= expected:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"only {routable} of {expected} workers became routable (see var/demo-logs/agent-*.log)"
    )


if __name__ == "__main__":
    sys.exit(main())
