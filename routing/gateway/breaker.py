"""Per-worker circuit breaker: closed -> open after K consecutive failures -> half-open
after a cooldown, where exactly one real request probes the worker; its outcome closes or
re-opens the breaker. Time is passed in (`now_s`, monotonic seconds)."""

from __future__ import annotations

from dataclasses import dataclass

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(slots=True)
class _Breaker:
    failures: int = 0
    state: str = CLOSED
    opened_at_s: float = 0.0
    probe_in_flight: bool = False


class CircuitBreakers:
    def __init__(self, *, failures_to_open: int, cooldown_s: float) -> None:
        self.failures_to_open = max(1, failures_to_open)
        self.cooldown_s = cooldown_s
        self._workers: dict[str, _Breaker] = {}

    def state(self, worker_id: str, *, now_s: float) -> str:
        b = self._workers.get(worker_id)
        if b is None:
            return CLOSED
        if b.state == OPEN and now_s - b.opened_at_s >= self.cooldown_s:
            b.state = HALF_OPEN
            b.probe_in_flight = False
        return b.state

    def allows(self, worker_id: str, *, now_s: float) -> bool:
        """May a new request go to this worker now? (A half-open worker takes one probe.)"""
        state = self.state(worker_id, now_s=now_s)
        if state == CLOSED:
            return True
        if state == HALF_OPEN:
            return not self._workers[worker_id].probe_in_flight
        return False

    def on_attempt(self, worker_id: str, *, now_s: float) -> None:
        if self.state(worker_id, now_s=now_s) == HALF_OPEN:
            self._workers[worker_id].probe_in_flight = True

    def release_probe(self, worker_id: str) -> None:
        """The probe request ended without a verdict (cancelled): allow another probe."""
        b = self._workers.get(worker_id)
        if b is not None:
            b.probe_in_flight = False

    def on_success(self, worker_id: str) -> None:
        b = self._workers.get(worker_id)
        if b is not None:
            b.failures = 0
            b.state = CLOSED
            b.probe_in_flight = False

    def on_failure(self, worker_id: str, *, now_s: float) -> None:
        b = self._workers.setdefault(worker_id, _Breaker())
        b.failures += 1
        if b.state == HALF_OPEN or b.failures >= self.failures_to_open:
            b.state = OPEN
            b.opened_at_s = now_s
            b.probe_in_flight = False

    def retry_after_s(self, worker_ids: list[str], *, now_s: float) -> float:
        """Seconds until the first of these open breakers turns half-open (>= 1)."""
        waits = [
            self.cooldown_s - (now_s - b.opened_at_s)
            for w in worker_ids
            if (b := self._workers.get(w)) is not None and b.state == OPEN
        ]
        return max(1.0, min(waits)) if waits else 1.0

    def forget(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)
