"""In-flight accounting per worker and online estimates of prefill speed and TTFT.

The gateway calls `dispatch` when it sends a request to a worker, `first_token` when the
first byte of the answer arrives (prefill is over), and `complete` or `fail` at the end.
`annotate` then fills the fresh, gateway-side load fields of the `WorkerView`s a policy
sees; scraped metrics (running, waiting, KV usage) can be seconds old, these cannot.

Time is always passed in (`now_s`, seconds on any monotonic clock); nothing here reads a
clock or keeps a thread.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from routing.core.types import WorkerView


@dataclass(slots=True)
class _Inflight:
    worker_id: str
    dispatched_s: float
    uncached_tokens: int
    # Uncached prefill tokens already queued on the worker when this one was sent: the
    # worker must get through them (roughly FIFO) before this request's first token.
    prefill_ahead_tokens: int
    prefill_pending: bool = True


@dataclass(slots=True)
class _WorkerState:
    requests: int = 0
    prefill_tokens: int = 0
    prefill_ms_per_token: float | None = None
    ttft_ms: float | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A snapshot of what the tracker knows about one worker.

    `prefill_ms_per_token` and `ttft_ms` are EWMAs (None until the first observation);
    `samples` counts the first tokens that fed the speed estimate.
    """

    worker_id: str
    inflight_requests: int
    inflight_prefill_tokens: int
    prefill_ms_per_token: float | None
    ttft_ms: float | None
    samples: int


def metrics_age_s(*, scraped_at_s: float | None, now_s: float) -> float:
    """Seconds since the worker's metrics were scraped; inf when never scraped."""
    if scraped_at_s is None or math.isnan(scraped_at_s):
        return math.inf
    return max(0.0, now_s - scraped_at_s)


def is_stale(view: WorkerView, *, stale_after_s: float) -> bool:
    """True when the view's scraped signals (running, waiting, KV usage) are too old to trust."""
    return view.metrics_age_s > stale_after_s


class LoadTracker:
    """Per-worker in-flight requests and prefill tokens, plus learned prefill speed and TTFT.

    `alpha` is the EWMA weight of a new observation (0 < alpha <= 1). A request left
    in flight longer than `max_age_s` (a lost completion callback) is expired on the next
    `annotate` so it cannot make a worker look busy forever. Speed samples come only from
    first tokens that needed at least `min_sample_tokens` of prefill, because a tiny
    prefill's TTFT is all overhead and would say nothing about per-token speed.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        max_age_s: float = 600.0,
        min_sample_tokens: int = 32,
    ) -> None:
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if not (max_age_s > 0.0):
            raise ValueError(f"max_age_s must be positive, got {max_age_s!r}")
        if min_sample_tokens < 1:
            raise ValueError(f"min_sample_tokens must be >= 1, got {min_sample_tokens!r}")
        self.alpha = alpha
        self.max_age_s = max_age_s
        self.min_sample_tokens = min_sample_tokens
        # Insertion order is dispatch order, so expiry only looks at the front.
        self._inflight: OrderedDict[str, _Inflight] = OrderedDict()
        self._workers: dict[str, _WorkerState] = {}

    def _state(self, worker_id: str) -> _WorkerState:
        state = self._workers.get(worker_id)
        if state is None:
            state = self._workers[worker_id] = _WorkerState()
        return state

    def _drop(self, request_id: str) -> _Inflight | None:
        entry = self._inflight.pop(request_id, None)
        if entry is None:
            return None
        state = self._state(entry.worker_id)
        state.requests -= 1
        if entry.prefill_pending:
            state.prefill_tokens -= entry.uncached_tokens
        return entry

    def dispatch(
        self, request_id: str, worker_id: str, *, uncached_tokens: int, now_s: float
    ) -> None:
        """Count a request sent to `worker_id` needing `uncached_tokens` of prefill.

        Dispatching an id that is already in flight (a retry on another worker) moves it.
        """
        self._drop(request_id)
        uncached = max(0, int(uncached_tokens))
        state = self._state(worker_id)
        self._inflight[request_id] = _Inflight(
            worker_id=worker_id,
            dispatched_s=now_s,
            uncached_tokens=uncached,
            prefill_ahead_tokens=state.prefill_tokens,
        )
        state.requests += 1
        state.prefill_tokens += uncached

    def first_token(self, request_id: str, *, now_s: float) -> None:
        """Prefill of `request_id` is done: release its prefill tokens and learn from its TTFT.

        The speed sample is TTFT / (prefill tokens queued ahead + own uncached tokens),
        in ms per token: the worker had to get through that much prefill work first.
        """
        entry = self._inflight.get(request_id)
        if entry is None or not entry.prefill_pending:
            return
        entry.prefill_pending = False
        state = self._state(entry.worker_id)
        state.prefill_tokens -= entry.uncached_tokens
        ttft_ms = max(0.0, (now_s - entry.dispatched_s) * 1000.0)
        state.ttft_ms = self._ewma(state.ttft_ms, ttft_ms)
        work_tokens = entry.prefill_ahead_tokens + entry.uncached_tokens
        if entry.uncached_tokens >= self.min_sample_tokens and work_tokens > 0:
            state.prefill_ms_per_token = self._ewma(
                state.prefill_ms_per_token, ttft_ms / work_tokens
            )
            state.samples += 1

    def complete(self, request_id: str, *, now_s: float) -> None:
        """The request finished; unknown or already finished ids are ignored."""
        self._drop(request_id)

    def fail(self, request_id: str, *, now_s: float) -> None:
        """The request failed; idempotent, unknown ids are ignored."""
        self._drop(request_id)

    def _ewma(self, old: float | None, sample: float) -> float:
        if old is None:
            return sample
        return old + self.alpha * (sample - old)

    def expire(self, *, now_s: float) -> int:
        """Drop requests in flight longer than `max_age_s`; returns how many were dropped."""
        cutoff_s = now_s - self.max_age_s
        expired = 0
        while self._inflight:
            request_id, entry = next(iter(self._inflight.items()))
            if entry.dispatched_s > cutoff_s:
                break
            self._drop(request_id)
            expired += 1
        return expired

    def inflight(self, worker_id: str) -> tuple[int, int]:
        """(requests, uncached prefill tokens not yet past their first token) on `worker_id`."""
        state = self._workers.get(worker_id)
        if state is None:
            return (0, 0)
        return (state.requests, state.prefill_tokens)

    def worker_load(self, worker_id: str) -> WorkerLoad:
        """Everything the tracker knows about `worker_id` (zeros and None when nothing)."""
        state = self._workers.get(worker_id) or _WorkerState()
        return WorkerLoad(
            worker_id=worker_id,
            inflight_requests=state.requests,
            inflight_prefill_tokens=state.prefill_tokens,
            prefill_ms_per_token=state.prefill_ms_per_token,
            ttft_ms=state.ttft_ms,
            samples=state.samples,
        )

    def forget_worker(self, worker_id: str) -> None:
        """Drop a removed worker's in-flight requests and learned speeds."""
        for request_id in [r for r, e in self._inflight.items() if e.worker_id == worker_id]:
            del self._inflight[request_id]
        self._workers.pop(worker_id, None)

    def annotate(self, views: Sequence[WorkerView], *, now_s: float) -> list[WorkerView]:
        """Return `views` with in-flight counts and learned prefill speed filled in.

        Expires stuck requests first. A worker with no learned speed keeps the view's own
        `prefill_ms_per_token`. Views that would not change are returned as they are.
        """
        self.expire(now_s=now_s)
        out: list[WorkerView] = []
        for view in views:
            state = self._workers.get(view.id)
            if state is None:
                requests, prefill_tokens, speed = 0, 0, view.prefill_ms_per_token
            else:
                requests, prefill_tokens = state.requests, state.prefill_tokens
                speed = state.prefill_ms_per_token
                if speed is None:
                    speed = view.prefill_ms_per_token
            if (
                view.inflight_requests == requests
                and view.inflight_prefill_tokens == prefill_tokens
                and view.prefill_ms_per_token == speed
            ):
                out.append(view)
            else:
                out.append(
                    replace(
                        view,
                        inflight_requests=requests,
                        inflight_prefill_tokens=prefill_tokens,
                        prefill_ms_per_token=speed,
                    )
                )
        return out
