"""Gateway configuration: one frozen value built from environment variables (or Django settings).

Every knob has a default that works on one machine with simulated workers. Environment
variables (all optional):

| variable                               | default | meaning                                              |
|----------------------------------------|---------|------------------------------------------------------|
| KVROUTE_CONTROL_PLANE_URL              | ""      | fetch the routing snapshot over HTTP from this base  |
| KVROUTE_CONTROL_PLANE_TOKEN            | ""      | bearer token for that fetch                          |
| KVROUTE_GATEWAY_SNAPSHOT_POLL_S        | 5       | safety-net poll of the snapshot (change msgs first)  |
| KVROUTE_GATEWAY_KEYS                   | ""      | "tenantA:key1,tenantB:key2"; empty = no auth         |
| KVROUTE_GATEWAY_MAX_BODY_BYTES         | 4 MiB   | larger bodies get 413                                |
| KVROUTE_GATEWAY_MAX_TOKENS             | 131072  | upper bound accepted for max_tokens                  |
| KVROUTE_GATEWAY_MAX_RETRIES            | 2       | retries on the next-ranked worker before first byte  |
| KVROUTE_GATEWAY_BREAKER_FAILURES       | 3       | consecutive failures that open a worker's breaker    |
| KVROUTE_GATEWAY_BREAKER_COOLDOWN_S     | 5       | open breaker -> half-open probe after this long      |
| KVROUTE_GATEWAY_CONNECT_TIMEOUT_S      | 2       | upstream connect timeout                             |
| KVROUTE_GATEWAY_READ_TIMEOUT_S         | 300     | upstream read timeout (first byte included)          |
| KVROUTE_GATEWAY_METRICS_INTERVAL_S     | 1       | worker /metrics scrape period (0 disables)           |
| KVROUTE_GATEWAY_METRICS_STALE_S        | 5       | scraped signals older than this are not trusted      |
| KVROUTE_GATEWAY_APPROX_TTL_S           | 30      | TTL of the approximate (routed-history) index        |
| KVROUTE_GATEWAY_INDEX_MAX_ENTRIES      | 2000000 | global bound of the prefix index                     |
| KVROUTE_GATEWAY_EVENTS_SILENCE_S       | 10      | routed-to but no KV event for this long -> "silent"  |
| KVROUTE_TOKENIZERS                     | ""      | "model=builtin,m2=hf:/dir,m3=remote,m4=text"         |
| KVROUTE_TOKENIZER_DEFAULT              | "text"  | adapter for models not listed (builtin/remote/text)  |
| KVROUTE_GATEWAY_RECORDS_MAXLEN         | 100000  | cap of the Redis stream / memory ring of records     |
| KVROUTE_GATEWAY_UPSTREAM_TRANSPORT     | "lean"  | "lean" (plain-http keep-alive, fast) or "httpx"      |
| REDIS_URL                              | ""      | request records to Redis, config change pub/sub      |

A worker may also carry `labels.tokenizer` in the snapshot (e.g. "builtin"); the env
mapping wins over the label, the label over the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


def _parse_pairs(raw: str, *, sep: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        left, found, right = item.partition(sep)
        if not found or not left.strip() or not right.strip():
            raise ValueError(f"malformed entry {item!r}: expected 'a{sep}b'")
        pairs.append((left.strip(), right.strip()))
    return pairs


def parse_gateway_keys(raw: str) -> dict[str, str]:
    """ "tenantA:key1,tenantB:key2" -> {key: tenant}."""
    return {key: tenant for tenant, key in _parse_pairs(raw, sep=":")}


def parse_tokenizers(raw: str) -> dict[str, str]:
    """ "m1=builtin,m2=hf:/path" -> {model: adapter spec}."""
    return dict(_parse_pairs(raw, sep="="))


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    control_plane_url: str = ""
    control_plane_token: str = ""
    snapshot_poll_s: float = 5.0
    gateway_keys: Mapping[str, str] = field(default_factory=dict)
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_limit: int = 131072
    max_retries: int = 2
    breaker_failures: int = 3
    breaker_cooldown_s: float = 5.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 300.0
    metrics_interval_s: float = 1.0
    metrics_stale_s: float = 5.0
    approx_ttl_s: float = 30.0
    index_max_entries: int = 2_000_000
    events_silence_s: float = 10.0
    tokenizers: Mapping[str, str] = field(default_factory=dict)
    tokenizer_default: str = "text"
    redis_url: str = ""
    records_maxlen: int = 100_000
    records_flush_s: float = 0.2
    upstream_transport: str = "lean"
    # Subscribe to the channel layer's `kvroute.config` group (needs Django settings).
    listen_channel_layer: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GatewayConfig:
        e = os.environ if env is None else env

        def f(name: str, default: float) -> float:
            raw = e.get(name)
            return float(raw) if raw else default

        def i(name: str, default: int) -> int:
            raw = e.get(name)
            return int(raw) if raw else default

        values: dict[str, object] = dict(
            control_plane_url=e.get("KVROUTE_CONTROL_PLANE_URL", "").rstrip("/"),
            control_plane_token=e.get("KVROUTE_CONTROL_PLANE_TOKEN", ""),
            snapshot_poll_s=f("KVROUTE_GATEWAY_SNAPSHOT_POLL_S", 5.0),
            gateway_keys=parse_gateway_keys(e.get("KVROUTE_GATEWAY_KEYS", "")),
            max_body_bytes=i("KVROUTE_GATEWAY_MAX_BODY_BYTES", 4 * 1024 * 1024),
            max_tokens_limit=i("KVROUTE_GATEWAY_MAX_TOKENS", 131072),
            max_retries=i("KVROUTE_GATEWAY_MAX_RETRIES", 2),
            breaker_failures=i("KVROUTE_GATEWAY_BREAKER_FAILURES", 3),
            breaker_cooldown_s=f("KVROUTE_GATEWAY_BREAKER_COOLDOWN_S", 5.0),
            connect_timeout_s=f("KVROUTE_GATEWAY_CONNECT_TIMEOUT_S", 2.0),
            read_timeout_s=f("KVROUTE_GATEWAY_READ_TIMEOUT_S", 300.0),
            metrics_interval_s=f("KVROUTE_GATEWAY_METRICS_INTERVAL_S", 1.0),
            metrics_stale_s=f("KVROUTE_GATEWAY_METRICS_STALE_S", 5.0),
            approx_ttl_s=f("KVROUTE_GATEWAY_APPROX_TTL_S", 30.0),
            index_max_entries=i("KVROUTE_GATEWAY_INDEX_MAX_ENTRIES", 2_000_000),
            events_silence_s=f("KVROUTE_GATEWAY_EVENTS_SILENCE_S", 10.0),
            tokenizers=parse_tokenizers(e.get("KVROUTE_TOKENIZERS", "")),
            tokenizer_default=e.get("KVROUTE_TOKENIZER_DEFAULT", "") or "text",
            redis_url=e.get("REDIS_URL", ""),
            records_maxlen=i("KVROUTE_GATEWAY_RECORDS_MAXLEN", 100_000),
            upstream_transport=e.get("KVROUTE_GATEWAY_UPSTREAM_TRANSPORT", "") or "lean",
        )
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
