"""CLI: one simulated vLLM worker, or a fleet of them in one process.

    python -m workers.sim --port 8101 --model sim-8b --profile h100-8b --num-blocks 4096 \
        --kv-events tcp://127.0.0.1:5601 [--replay tcp://127.0.0.1:5602] [--time-scale 1.0]
    python -m workers.sim fleet --count 4 --base-port 8101 [--events-base-port 5601]

`fleet` prints one URL per line, then one JSON line (`{"workers": [...]}`) with every
worker's URL and KV-event/replay endpoints, the shape the control plane registers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from workers.sim.fleet import Fleet, worker_configs
from workers.sim.profiles import PROFILES
from workers.sim.server import WorkerConfig


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="sim-8b", help="served model name")
    p.add_argument("--profile", default="dev", choices=sorted(PROFILES))
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks incl. the null block")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every model duration")
    p.add_argument(
        "--event-shape",
        choices=["map", "array"],
        default="map",
        help="'array': older vLLM tagged arrays",
    )
    p.add_argument("--topic", default="", help="ZMQ topic frame (vLLM's default is empty)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--log-level", default="warning")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "num_blocks": args.num_blocks,
        "block_size": args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len,
        "time_scale": args.time_scale,
        "event_shape": args.event_shape,
        "topic": args.topic,
        "enable_prefix_caching": not args.no_prefix_caching,
    }


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[WorkerConfig], int]:
    if argv and argv[0] == "fleet":
        p = argparse.ArgumentParser(
            prog="python -m workers.sim fleet",
            description="several simulated vLLM workers in one process",
        )
        p.add_argument("--count", type=int, default=4)
        p.add_argument(
            "--base-port", type=int, default=8101, help="worker i listens on base+i (0: free ports)"
        )
        p.add_argument(
            "--events-base-port",
            type=int,
            default=5601,
            help="worker i publishes on base+2i, replay on base+2i+1 (0: free ports)",
        )
        p.add_argument("--no-kv-events", action="store_true")
        _common(p)
        args = p.parse_args(argv[1:])
        if args.count < 1:
            p.error("--count must be at least 1")
        configs = worker_configs(
            args.count,
            model=args.model,
            profile=args.profile,
            host=args.host,
            events_base_port=None if args.no_kv_events else args.events_base_port,
            **_overrides(args),
        )
        return args, configs, args.base_port
    p = argparse.ArgumentParser(
        prog="python -m workers.sim", description="one simulated vLLM worker (see also: fleet)"
    )
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--kv-events", default=None, help="ZMQ PUB endpoint, e.g. tcp://127.0.0.1:5601")
    p.add_argument(
        "--replay", default=None, help="ZMQ ROUTER replay endpoint, e.g. tcp://127.0.0.1:5602"
    )
    _common(p)
    args = p.parse_args(argv)
    config = WorkerConfig(
        model=args.model,
        profile=args.profile,
        kv_events_endpoint=args.kv_events,
        replay_endpoint=args.replay,
        **_overrides(args),
    )
    return args, [config], args.port


async def _serve(configs: list[WorkerConfig], *, host: str, base_port: int) -> None:
    fleet = Fleet(configs, host=host, base_port=base_port)
    workers = await fleet.start()
    for w in workers:
        print(w.url, flush=True)
    print(json.dumps({"workers": [w.to_dict() for w in workers]}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await fleet.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args, configs, base_port = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_serve(configs, host=args.host, base_port=base_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
