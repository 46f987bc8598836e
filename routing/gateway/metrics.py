"""The gateway's Prometheus metrics: names in one place, one registry per gateway state
(never the process-global registry, so tests can build several gateways)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

REQUESTS = "kvroute_gateway_requests"
TTFT = "kvroute_gateway_ttft_seconds"
E2E = "kvroute_gateway_e2e_seconds"
ROUTING_OVERHEAD = "kvroute_gateway_routing_overhead_seconds"
PREDICTED_CACHED = "kvroute_gateway_predicted_cached_tokens"
ACTUAL_CACHED = "kvroute_gateway_actual_cached_tokens"
PREDICTION_ERROR = "kvroute_gateway_cache_prediction_error_tokens"
RETRIES = "kvroute_gateway_retries"
KV_EVENTS = "kvroute_gateway_kv_events"
INDEX_ENTRIES = "kvroute_gateway_index_entries"
INDEX_WORKER_BLOCKS = "kvroute_gateway_index_worker_blocks"
EVENT_LAG = "kvroute_gateway_worker_event_lag_seconds"
EVENTS_STATE = "kvroute_gateway_worker_events_state"
METRICS_AGE = "kvroute_gateway_worker_metrics_age_seconds"
INFLIGHT = "kvroute_gateway_worker_inflight_requests"
BREAKER_OPEN = "kvroute_gateway_worker_breaker_open"
RECORDS_DROPPED = "kvroute_gateway_records_dropped"
SNAPSHOT_AGE = "kvroute_gateway_snapshot_age_seconds"
# Without the gateway prefix: telemetry reads it under this name (dashboard eviction rate).
KV_BLOCKS_REMOVED = "kvroute_kv_blocks_removed"

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_OVERHEAD_BUCKETS_S = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3)
_TOKEN_ERROR_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            REQUESTS,
            "Requests answered, by worker, policy and status.",
            ["worker", "policy", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            TTFT,
            "Time to first byte of a streamed answer, seen by the client.",
            ["worker"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            E2E,
            "End-to-end request latency at the gateway.",
            ["worker"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.routing_overhead = Histogram(
            ROUTING_OVERHEAD,
            "Gateway time from body received to upstream send (tokenize, match, decide).",
            buckets=_OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.predicted_cached = Counter(
            PREDICTED_CACHED, "Cached prompt tokens the router predicted.", ["worker"], registry=r
        )
        self.actual_cached = Counter(
            ACTUAL_CACHED,
            "Cached prompt tokens the worker reported (usage).",
            ["worker"],
            registry=r,
        )
        self.prediction_error = Histogram(
            PREDICTION_ERROR,
            "|actual - predicted| cached tokens per request.",
            ["worker"],
            buckets=_TOKEN_ERROR_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            RETRIES,
            "Attempts that failed before the first byte and were retried elsewhere.",
            ["worker", "reason"],
            registry=r,
        )
        self.kv_events = Counter(
            KV_EVENTS,
            "KV event batches received, by worker and outcome.",
            ["worker", "outcome"],
            registry=r,
        )

    def add_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_FnCollector(collect))


class _FnCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Metric]:
        return self._fn()

    def describe(self) -> Iterable[Metric]:
        return []


def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)
