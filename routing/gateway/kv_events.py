"""KV-event subscriber: one ZMQ SUB per worker feeding the precise layer of the prefix index.

Per worker it tracks the sequence number. A gap (or a first batch after seq 0: events the
gateway missed before it subscribed) asks the worker's replay endpoint (vLLM protocol: a
DEALER sends `[b"", start_seq(8 bytes)]`, the ROUTER answers `[b"", seq, payload]` per
buffered batch and ends with seq -1 and an empty payload). If the replay cannot close the
gap, the worker's precise entries are dropped and its state is "stale" for a while: routing
falls back to the approximate (routed-history) layer for it. A stream that dies is "broken"
(reconnects every second); one that says nothing although we routed prompts with new full
blocks to it is "silent". Both also fall back, visibly: `/gateway/metrics`
(`kvroute_gateway_worker_events_state`) and the decision reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from routing.core.errors import MalformedEvent
from routing.core.events import BlockRemoved, EventBatch, decode_message, is_replay_end
from routing.core.index import PrefixIndex

log = logging.getLogger(__name__)

LIVE = "live"
WAITING = "waiting"  # subscribed, nothing received yet (an idle worker publishes nothing)
SILENT = "silent"
STALE = "stale"
BROKEN = "broken"
FALLBACK_STATES = frozenset({SILENT, STALE, BROKEN})
# Batches taken per wakeup beyond the awaited one: bounded so a flood cannot starve the loop.
_DRAIN_MAX = 64


@dataclass(slots=True)
class StreamStatus:
    state: str = WAITING
    last_seq: int | None = None
    last_event_s: float | None = None  # our monotonic clock at receipt
    last_event_lag_s: float = 0.0  # receipt wall time - engine timestamp
    last_dispatch_s: float | None = None  # last routed prompt that should produce BlockStored
    stale_until_s: float = 0.0
    batches: int = 0
    gaps: int = 0
    replayed: int = 0
    malformed: int = 0
    blocks_removed: int = 0  # BlockRemoved hashes applied: the worker's eviction count
    error: str = ""


class KvEventSubscriber:
    def __init__(
        self,
        *,
        worker_id: str,
        endpoint: str,
        replay_endpoint: str | None,
        index: PrefixIndex,
        ctx: zmq.asyncio.Context,
        silence_s: float = 10.0,
        stale_hold_s: float = 10.0,
        replay_timeout_s: float = 1.0,
        on_outcome: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = index
        self.ctx = ctx
        self.silence_s = silence_s
        self.stale_hold_s = stale_hold_s
        self.replay_timeout_s = replay_timeout_s
        self._on_outcome = on_outcome
        self._clock = clock
        self.status = StreamStatus()

    # -- state seen by the router -------------------------------------------------------------

    def note_dispatch(self, *, now_s: float) -> None:
        self.status.last_dispatch_s = now_s

    def current_state(self, *, now_s: float) -> str:
        st = self.status
        if st.state == BROKEN:
            return BROKEN
        if now_s < st.stale_until_s:
            return STALE
        heard_s = st.last_event_s if st.last_event_s is not None else -1e18
        if (
            st.last_dispatch_s is not None
            and st.last_dispatch_s > heard_s
            and now_s - st.last_dispatch_s > self.silence_s
        ):
            if st.state != SILENT:
                # Unconfirmed precise state is worse than none: use the routed history only.
                self.index.clear_worker(self.worker_id)
                st.state = SILENT
            return SILENT
        return LIVE if st.batches else WAITING

    # -- the stream ---------------------------------------------------------------------------

    def _outcome(self, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(self.worker_id, outcome)

    def _apply(self, batch: EventBatch, *, now_s: float) -> None:
        self.index.apply(self.worker_id, batch.ops, now_s=now_s)
        self.status.blocks_removed += sum(
            len(op.engine_hashes) for op in batch.ops if isinstance(op, BlockRemoved)
        )
        self.status.last_seq = batch.seq
        self.status.batches += 1
        self.status.last_event_s = now_s
        self.status.last_event_lag_s = max(0.0, time.time() - batch.ts)
        if self.status.state in (SILENT, WAITING):
            self.status.state = LIVE

    async def _replay(self, start_seq: int, *, now_s: float) -> bool:
        """Fetch batches from `start_seq` on; True when the gap is closed."""
        if not self.replay_endpoint:
            return False
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        closed = False
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", start_seq.to_bytes(8, "big", signed=True)])
            expected = start_seq
            while True:
                if not await sock.poll(int(self.replay_timeout_s * 1000)):
                    break
                frames = await sock.recv_multipart()
                if is_replay_end(frames):
                    break
                batch = decode_message(frames[-2:])
                if batch.seq < expected:
                    continue
                if batch.seq > expected:
                    break  # the worker's buffer no longer holds what we missed
                self._apply(batch, now_s=now_s)
                self.status.replayed += 1
                expected += 1
            closed = self.status.last_seq is not None and self.status.last_seq >= start_seq
        except (zmq.ZMQError, MalformedEvent) as exc:
            log.warning("replay from %s failed: %s", self.replay_endpoint, exc)
        finally:
            sock.close(0)
        return closed

    async def _handle(self, frames: list[bytes]) -> None:
        now_s = self._clock()
        try:
            batch = decode_message(frames)
        except MalformedEvent as exc:
            self.status.malformed += 1
            self.status.error = str(exc)
            self._outcome("malformed")
            return
        st = self.status
        expected = 0 if st.last_seq is None else st.last_seq + 1
        if batch.seq < expected and st.last_seq is not None:
            if batch.seq == 0:
                # seq restarted: the engine restarted and its cache with it
                self.index.clear_worker(self.worker_id)
                st.last_seq = None
                self._outcome("restart")
            else:
                self._outcome("duplicate")
                return
        elif batch.seq > expected:
            st.gaps += 1
            self._outcome("gap")
            # Replay up to and including this batch, then carry on from there.
            if (
                await self._replay(expected, now_s=now_s)
                and st.last_seq is not None
                and st.last_seq >= batch.seq
            ):
                self._outcome("replayed")
                return
            if st.last_seq is None or st.last_seq < batch.seq - 1:
                # Unrecoverable: what the missing batches removed may still be in our index,
                # and children of what they stored cannot be keyed.
                self.index.clear_worker(self.worker_id)
                st.stale_until_s = now_s + self.stale_hold_s
                self._outcome("stale")
        self._apply(batch, now_s=now_s)
        self._outcome("ok")

    async def run(self) -> None:
        while True:
            sock = self.ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(self.endpoint)
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                if self.status.state == BROKEN:
                    self.status.state = WAITING if not self.status.batches else LIVE
                # A plain (shadow) socket on the same zmq socket, to take the batches already
                # queued behind the awaited one without a future and a loop turn for each.
                raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
                while True:
                    frames = await sock.recv_multipart()
                    await self._handle(frames)
                    for _ in range(_DRAIN_MAX):
                        try:
                            frames = raw.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        await self._handle(frames)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.status.state = BROKEN
                self.status.error = f"{type(exc).__name__}: {exc}"
                self.index.clear_worker(self.worker_id)
                self._outcome("broken")
                log.warning("KV event stream of %s broke: %s", self.worker_id, exc)
                await asyncio.sleep(1.0)
            finally:
                sock.close(0)
