"""Scrape each worker's Prometheus `/metrics` (vLLM names) into `WorkerMetrics`.

Parsing is a small line scanner for the handful of series routing needs, instead of
prometheus_client's full text parser, because the scraper runs every second per worker. Several
engines (data-parallel ranks) behind one URL are summed; KV usage is averaged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
_WANTED = (RUNNING, WAITING, KV_USAGE, KV_USAGE_OLD, CACHE_CONFIG)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    running: int
    waiting: int
    kv_usage_frac: float
    num_gpu_blocks: int | None
    block_size: int | None


def parse_vllm_metrics(text: str, *, model: str | None = None) -> WorkerMetrics:
    """The routing signals in a vLLM `/metrics` page; series of other models are ignored."""
    running = waiting = 0.0
    usage: list[float] = []
    blocks: int | None = None
    block_size: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            close = line.rfind("}")
            labels = dict(_LABEL.findall(line[brace + 1 : close]))
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name, labels, rest = parts[0], {}, parts[1:]
        if name not in _WANTED or not rest:
            continue
        if model is not None and labels.get("model_name", model) != model and name != CACHE_CONFIG:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if name == RUNNING:
            running += value
        elif name == WAITING:
            waiting += value
        elif name in (KV_USAGE, KV_USAGE_OLD):
            usage.append(value)
        elif name == CACHE_CONFIG:
            try:
                if labels.get("num_gpu_blocks") not in (None, "", "None"):
                    blocks = int(labels["num_gpu_blocks"])
                if labels.get("block_size"):
                    block_size = int(labels["block_size"])
            except ValueError:
                pass
    kv = sum(usage) / len(usage) if usage else 0.0
    return WorkerMetrics(int(running), int(waiting), min(1.0, max(0.0, kv)), blocks, block_size)


@dataclass(slots=True)
class ScrapeState:
    metrics: WorkerMetrics | None = None
    scraped_at_s: float | None = None
    consecutive_failures: int = 0
    last_error: str = ""


class MetricsScraper:
    """Polls every worker concurrently each `interval_s`; `states` is read by the router."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        targets: Callable[[], Iterable[tuple[str, str, str]]],
        interval_s: float,
        timeout_s: float = 2.0,
        on_scrape: Callable[[str, WorkerMetrics], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._targets = targets  # -> (worker_id, url, model)
        self.interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_scrape = on_scrape
        self._clock = clock
        self.states: dict[str, ScrapeState] = {}

    async def scrape_one(self, worker_id: str, url: str, model: str) -> None:
        state = self.states.setdefault(worker_id, ScrapeState())
        try:
            resp = await self._client.get(f"{url}/metrics", timeout=self._timeout_s)
            resp.raise_for_status()
            metrics = parse_vllm_metrics(resp.text, model=model)
        except (httpx.HTTPError, ValueError) as exc:
            state.consecutive_failures += 1
            state.last_error = f"{type(exc).__name__}: {exc}"
            return
        state.metrics = metrics
        state.scraped_at_s = self._clock()
        state.consecutive_failures = 0
        state.last_error = ""
        if self._on_scrape is not None:
            self._on_scrape(worker_id, metrics)

    async def scrape_all(self) -> None:
        targets = list(self._targets())
        live = {t[0] for t in targets}
        for gone in set(self.states) - live:
            del self.states[gone]
        await asyncio.gather(*(self.scrape_one(*t) for t in targets))

    async def run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.scrape_all()
            except Exception:  # a scraper must outlive any one bad page
                log.exception("metrics scrape round failed")
            await asyncio.sleep(max(0.05, self.interval_s - (self._clock() - started)))
