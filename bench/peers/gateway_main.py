"""Our gateway alone, in its own process, routing by a fixed snapshot document (for benchmarks).

    python -m bench.peers.gateway_main --snapshot snap.json --port 8300

The snapshot has the shape of ``GET /api/routing-snapshot/`` (docs/contracts.md); every other
knob comes from the KVROUTE_GATEWAY_* environment variables (routing.gateway.config), so the
benchmark runs the gateway exactly as deployed minus the control plane.
"""

from __future__ import annotations

import argparse
import json
import sys

from routing.gateway.config import GatewayConfig
from routing.gateway.consumers import GatewayHandle
from routing.gateway.routing import gateway_app
from routing.gateway.serve import serve_forever
from routing.gateway.snapshot import StaticSnapshotSource
from routing.gateway.state import build_gateway_state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.gateway_main")
    p.add_argument("--snapshot", required=True, help="routing snapshot JSON file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    with open(args.snapshot, encoding="utf-8") as fh:
        source = StaticSnapshotSource(json.load(fh))
    config = GatewayConfig.from_env()
    handle = GatewayHandle(
        lambda: build_gateway_state(config, snapshot=source, seed=0), config=config
    )
    serve_forever(gateway_app(handle), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
