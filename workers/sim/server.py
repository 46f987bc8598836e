"""The simulated engine behind vLLM's HTTP surface, as a plain ASGI app (served by uvicorn).

`SimWorker` owns one `Engine`, drives it in scaled real time (`time_scale` multiplies every
model duration: 0.01 runs a hundred times faster), publishes its KV events on ZMQ, and
serves `POST /v1/completions`, `POST /v1/chat/completions` (SSE streaming with
`stream_options.include_usage`), `GET /v1/models`, `GET /health`, `POST /tokenize`,
`POST /detokenize` and `GET /metrics` (vLLM's metric names, `model_name`/`engine` labels).

Times reported by the engine (metrics, histograms) are model seconds, i.e. what a real
vLLM would report at `time_scale=1`, whatever the scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any

import zmq.asyncio
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from routing.core.events import AllBlocksCleared
from routing.core.tokenizer import EOS_ID, builtin_decode, builtin_encode, render_chat
from workers.sim.engine import Engine, FinishedRequest, RequestRejected, StepResult, TokenOutput
from workers.sim.kv_publisher import EventShape, KVEventPublisher
from workers.sim.profiles import PROFILES

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
# vLLM's bucket boundaries (seconds) for the latency histograms.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_LATENCY_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

METRIC_RUNNING = "vllm:num_requests_running"
METRIC_WAITING = "vllm:num_requests_waiting"
METRIC_KV_USAGE = "vllm:kv_cache_usage_perc"
METRIC_PREFIX_QUERIES = "vllm:prefix_cache_queries"
METRIC_PREFIX_HITS = "vllm:prefix_cache_hits"
METRIC_PROMPT_TOKENS = "vllm:prompt_tokens"
METRIC_GENERATION_TOKENS = "vllm:generation_tokens"
METRIC_PREEMPTIONS = "vllm:num_preemptions"
METRIC_REQUEST_SUCCESS = "vllm:request_success"
METRIC_CACHE_CONFIG = "vllm:cache_config_info"
METRIC_TTFT = "vllm:time_to_first_token_seconds"
METRIC_E2E = "vllm:e2e_request_latency_seconds"
METRIC_QUEUE = "vllm:request_queue_time_seconds"
# The HTTP surface: path -> its one method (another method is a 405, another path a 404).
ROUTE_METHODS = {
    "/health": "GET",
    "/metrics": "GET",
    "/reset_prefix_cache": "POST",
    "/sim/stats": "GET",
    "/v1/models": "GET",
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
    "/tokenize": "POST",
    "/detokenize": "POST",
}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything one simulated worker needs; None means "the profile's value"."""

    model: str = "sim-8b"
    profile: str = "dev"
    num_blocks: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    time_scale: float = 1.0
    kv_events_endpoint: str | None = None
    replay_endpoint: str | None = None
    event_shape: EventShape = "map"
    topic: str = ""
    enable_prefix_caching: bool = True
    eos_range: tuple[int, int] | None = (64, 512)
    vocab_size: int = 128_256
    catch_up_wall_s: float = 0.010
    engine_label: str = "0"


_TIMING_WINDOW = 100_000


@dataclass(slots=True)
class StepTiming:
    """How faithfully wall time follows the model (for the benchmark), in wall seconds."""

    steps: int = 0
    model_wall_s: float = 0.0
    actual_wall_s: float = 0.0
    late_steps: int = 0
    rel_errors: array[float] = field(default_factory=lambda: array("d"))

    def record(self, *, model_s: float, actual_s: float) -> None:
        self.steps += 1
        self.model_wall_s += model_s
        self.actual_wall_s += actual_s
        err = actual_s / model_s - 1.0 if model_s > 0 else 0.0
        if err > 0.05:
            self.late_steps += 1
        self.rel_errors.append(err)
        if len(self.rel_errors) > 2 * _TIMING_WINDOW:
            # Percentiles over the recent window; a long-running worker must not grow forever.
            del self.rel_errors[:_TIMING_WINDOW]

    def summary(self) -> dict[str, float | int]:
        """Totals plus percentiles of per-step relative error (actual / model - 1)."""
        errs = sorted(self.rel_errors)

        def pct(q: float) -> float:
            return errs[min(len(errs) - 1, int(q * len(errs)))] if errs else 0.0

        return {
            "steps": self.steps,
            "model_wall_s": self.model_wall_s,
            "actual_wall_s": self.actual_wall_s,
            "mean_rel_error": self.actual_wall_s / self.model_wall_s - 1.0
            if self.model_wall_s
            else 0.0,
            "late_steps": self.late_steps,
            "p50_rel_error": pct(0.5),
            "p99_rel_error": pct(0.99),
        }


class BadRequest(Exception):
    """A client error, rendered as vLLM's JSON error body."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _error_body(message: str, *, status: int, param: str | None) -> dict[str, Any]:
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        405: "MethodNotAllowedError",
        413: "BadRequestError",
    }.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class _Stream:
    __slots__ = ("items", "finished")

    def __init__(self) -> None:
        self.items: asyncio.Queue[TokenOutput | FinishedRequest | None] = asyncio.Queue()
        self.finished = False


class _EngineCollector(Collector):
    """Gauges and counters read from the engine at scrape time (no per-request cost)."""

    def __init__(self, worker: SimWorker) -> None:
        self._worker = worker

    def collect(self) -> Iterable[Metric]:
        w = self._worker
        s = w.engine.stats()
        names = ["model_name", "engine"]
        values = [w.config.model, w.config.engine_label]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        yield gauge(METRIC_RUNNING, "Number of requests in model execution batches.", s.running)
        yield gauge(METRIC_WAITING, "Number of requests waiting to be processed.", s.waiting)
        yield gauge(METRIC_KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", s.kv_usage_frac)
        yield counter(
            METRIC_PREFIX_QUERIES,
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries_tokens,
        )
        yield counter(
            METRIC_PREFIX_HITS,
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits_tokens,
        )
        yield counter(METRIC_PROMPT_TOKENS, "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter(
            METRIC_GENERATION_TOKENS, "Number of generation tokens processed.", s.generation_tokens
        )
        yield counter(
            METRIC_PREEMPTIONS, "Cumulative number of preemption from the engine.", s.preemptions
        )
        success = CounterMetricFamily(
            METRIC_REQUEST_SUCCESS,
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for reason, count in sorted(w.finished_by_reason.items()):
            success.add_metric([*values, reason], count)
        yield success
        info = GaugeMetricFamily(
            METRIC_CACHE_CONFIG,
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"],
        )
        p = w.engine.profile
        info.add_metric(
            [
                str(p.block_size),
                str(p.num_blocks),
                str(w.engine.enable_prefix_caching),
                w.config.engine_label,
            ],
            1.0,
        )
        yield info


class SimWorker:
    """One simulated vLLM server: engine + step loop + KV publisher + ASGI app."""

    def __init__(self, config: WorkerConfig, *, zmq_ctx: zmq.asyncio.Context | None = None) -> None:
        if config.profile not in PROFILES:
            raise ValueError(f"unknown profile {config.profile!r}; known: {sorted(PROFILES)}")
        if config.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.config = config
        self.engine = Engine(
            profile=PROFILES[config.profile],
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            eos_range=config.eos_range,
        )
        self.timing = StepTiming()
        self.finished_by_reason: dict[str, int] = {}
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._lag_s = 0.0
        self._created = int(time.time())
        self._zmq_ctx = zmq_ctx
        self._own_ctx = False
        self.publisher: KVEventPublisher | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(self))
        labels = ["model_name", "engine"]
        self._ttft = Histogram(
            METRIC_TTFT,
            "Histogram of time to first token in seconds.",
            labels,
            registry=self.registry,
            buckets=TTFT_BUCKETS_S,
        ).labels(config.model, config.engine_label)
        self._e2e = Histogram(
            METRIC_E2E,
            "Histogram of e2e request latency in seconds.",
            labels,
            registry=self.registry,
            buckets=REQUEST_LATENCY_BUCKETS_S,
        ).labels(config.model, config.engine_label)
        self._queue = Histogram(
            METRIC_QUEUE,
            "Histogram of time spent in WAITING phase for request.",
            labels,
            registry=self.registry,
            buckets=REQUEST_LATENCY_BUCKETS_S,
        ).labels(config.model, config.engine_label)

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    @property
    def replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint if self.publisher else None

    async def start(self) -> None:
        """Bind the KV-event sockets (if configured) and start the step loop."""
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        if self.config.kv_events_endpoint:
            if self._zmq_ctx is None:
                self._zmq_ctx = zmq.asyncio.Context()
                self._own_ctx = True
            self.publisher = KVEventPublisher(
                ctx=self._zmq_ctx,
                endpoint=self.config.kv_events_endpoint,
                replay_endpoint=self.config.replay_endpoint,
                topic=self.config.topic.encode(),
                shape=self.config.event_shape,
            )
            self.publisher.start()
        self._task = loop.create_task(self._run(), name=f"sim-engine-{self.config.model}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for stream in self._streams.values():
            stream.items.put_nowait(None)
        if self.publisher is not None:
            await self.publisher.close()
        if self._own_ctx and self._zmq_ctx is not None:
            self._zmq_ctx.term()

    def model_now_s(self) -> float:
        """The engine's clock: scaled wall time minus the lag it is allowed to carry."""
        return (asyncio.get_running_loop().time() - self._t0) / self.config.time_scale - self._lag_s

    # -- the step loop ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        # Back-to-back steps keep the model's clock exact: a step delivered a little late
        # (timer granularity, a busy loop) is absorbed by starting the next one at the
        # model's end time, up to `catch_up_wall_s`. Later than that is overload: the
        # clock slips and the slower steps show up in the timing stats.
        slack_s = self.config.catch_up_wall_s / scale
        chaining = False
        prev_delivery_wall = 0.0
        while True:
            if not self.engine.has_work():
                chaining = False
                self._lag_s = 0.0
                self._wake.clear()
                await self._wake.wait()
                continue
            now_wall = loop.time()
            raw_s = (now_wall - self._t0) / scale
            self._lag_s = (
                min(max(raw_s - self.engine.busy_until_s, 0.0), slack_s) if chaining else 0.0
            )
            start_s = raw_s - self._lag_s
            next_s = self.engine.next_step_time_s(now_s=start_s)
            if next_s is not None and next_s > start_s:
                # The queue head arrives in the model's future: wait for it, not spin.
                await asyncio.sleep((next_s - start_s) * scale)
                continue
            result = self.engine.step(now_s=start_s)
            if result.duration_s <= 0:
                # Nothing could be scheduled (cannot happen for requests add_request accepted);
                # back off rather than spin.
                chaining = False
                await asyncio.sleep(0.001)
                continue
            delay = self._t0 + result.end_s * scale - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            delivered_wall = loop.time()
            # Observed step time: the gap between deliveries (what a client sees as ITL),
            # or from the start of the step after an idle period.
            anchor = prev_delivery_wall if chaining else now_wall
            self.timing.record(model_s=result.duration_s * scale, actual_s=delivered_wall - anchor)
            prev_delivery_wall = delivered_wall
            chaining = True
            await self._deliver(result)

    async def _deliver(self, result: StepResult) -> None:
        if result.events and self.publisher is not None:
            await self.publisher.publish(result.events, ts=time.time())
        streams = self._streams
        for tok in result.tokens:
            stream = streams.get(tok.request_id)
            if stream is not None:
                stream.items.put_nowait(tok)
        for done in result.finished:
            self._account(done)
            stream = streams.get(done.request_id)
            if stream is not None:
                stream.finished = True
                stream.items.put_nowait(done)

    def _account(self, done: FinishedRequest) -> None:
        self.finished_by_reason[done.finish_reason] = (
            self.finished_by_reason.get(done.finish_reason, 0) + 1
        )
        if done.finish_reason == "abort":
            return
        if done.ttft_s is not None:
            self._ttft.observe(done.ttft_s)
        self._e2e.observe(done.e2e_s)
        self._queue.observe(done.queue_s)

    def _submit(
        self, request_id: str, tokens: list[int], *, max_tokens: int, ignore_eos: bool
    ) -> _Stream:
        try:
            self.engine.add_request(
                request_id=request_id,
                prompt_token_ids=tokens,
                max_tokens=max_tokens,
                arrival_s=self.model_now_s(),
                ignore_eos=ignore_eos,
            )
        except RequestRejected as exc:
            raise BadRequest(str(exc), param=exc.field) from None
        stream = _Stream()
        self._streams[request_id] = stream
        self._wake.set()
        return stream

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and not stream.finished:
            done = self.engine.finish_aborted(request_id, now_s=self.model_now_s())
            if done is not None:
                self._account(done)

    # -- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        sent = [False]

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent[0] = True
            await send(message)

        try:
            allowed = ROUTE_METHODS.get(path)
            if allowed is None:
                raise BadRequest(f"no route for {path}", status=404)
            if method != allowed:
                raise BadRequest(f"method {method} not allowed on {path}", status=405)
            if path == "/health":
                await _send_bytes(tracked_send, 200, b"", "text/plain")
            elif path == "/metrics":
                await _send_bytes(
                    tracked_send,
                    200,
                    generate_latest(self.registry),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            elif path == "/reset_prefix_cache":
                # vLLM (dev mode) empties the prefix cache and tells subscribers so.
                if not self.engine.reset_prefix_cache():
                    raise BadRequest("cannot reset the prefix cache while requests are running")
                if self.publisher is not None:
                    await self.publisher.publish([AllBlocksCleared()], ts=time.time())
                await _send_bytes(tracked_send, 200, b"", "text/plain")
            elif path == "/sim/stats":
                # Not part of vLLM: the simulator's own fidelity numbers (bench/sim_bench.py).
                await _send_json(
                    tracked_send,
                    200,
                    {"timing": self.timing.summary(), "engine": asdict(self.engine.stats())},
                )
            elif path == "/v1/models":
                await _send_json(tracked_send, 200, self._models())
            elif path in ("/v1/completions", "/v1/chat/completions"):
                body = await _read_json(receive)
                await self._generate(
                    body, chat=path.endswith("chat/completions"), receive=receive, send=tracked_send
                )
            elif path == "/tokenize":
                await _send_json(tracked_send, 200, self._tokenize(await _read_json(receive)))
            else:  # "/detokenize"
                await _send_json(tracked_send, 200, self._detokenize(await _read_json(receive)))
        except BadRequest as exc:
            if not sent[0]:
                await _send_json(
                    tracked_send,
                    exc.status,
                    _error_body(str(exc), status=exc.status, param=exc.param),
                )
        except UnicodeEncodeError:
            # JSON may carry lone surrogates ("\ud800") that no tokenizer can encode.
            if not sent[0]:
                message = "request text contains invalid Unicode (a lone surrogate)"
                await _send_json(tracked_send, 400, _error_body(message, status=400, param=None))
        except Exception:
            log.exception("simulated worker failed on %s %s", method, path)
            if not sent[0]:
                await _send_json(
                    tracked_send,
                    500,
                    _error_body("internal error in the simulated engine", status=500, param=None),
                )

    def _models(self) -> dict[str, Any]:
        m = self.config.model
        return {
            "object": "list",
            "data": [
                {
                    "id": m,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "vllm",
                    "root": m,
                    "parent": None,
                    "max_model_len": self.engine.profile.max_model_len,
                }
            ],
        }

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is None:
            raise BadRequest("'model' is required", param="model")
        if model != self.config.model:
            # vLLM answers an unknown model with 404 NotFoundError.
            raise BadRequest(f"The model `{model}` does not exist.", param="model", status=404)

    def _token_ids(self, value: Any, param: str) -> list[int]:
        ids: list[int] = []
        for t in value:
            if isinstance(t, bool) or not isinstance(t, int):
                raise BadRequest(f"'{param}' token ids must be integers", param=param)
            if not 0 <= t < self.config.vocab_size:
                raise BadRequest(f"Token id {t} is out of vocabulary", param=param)
            ids.append(t)
        return ids

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return builtin_encode(prompt)
        if isinstance(prompt, list) and all(not isinstance(t, str | list) for t in prompt):
            return self._token_ids(prompt, "prompt")
        if prompt is None:
            raise BadRequest("'prompt' is required", param="prompt")
        raise BadRequest(
            "'prompt' must be a string, a list of token ids, or a batch of one of them",
            param="prompt",
        )

    def _chat_ids(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(
                    f"messages[{i}] must be an object with a string 'role'", param="messages"
                )
            content = m.get("content")
            if content is not None and not isinstance(content, str | list):
                raise BadRequest(
                    f"messages[{i}].content must be a string or a list of parts", param="messages"
                )
            for j, part in enumerate(content if isinstance(content, list) else ()):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequest(
                        f"messages[{i}].content[{j}] must be an object with a string 'type'",
                        param="messages",
                    )
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise BadRequest(
                        f"messages[{i}].content[{j}].text must be a string", param="messages"
                    )
        return builtin_encode(render_chat(messages))

    def _max_tokens(self, body: dict[str, Any], *, chat: bool, prompt_len: int) -> int:
        raw = body.get("max_completion_tokens") if chat else None
        if raw is None:
            raw = body.get("max_tokens")
        if raw is None:
            if not chat:
                return 16  # the OpenAI/vLLM default for completions
            p = self.engine.profile
            room = min(p.max_model_len, self.engine.usable_blocks * p.block_size) - prompt_len
            return max(1, room)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise BadRequest(f"max_tokens must be an integer >= 1, got {raw!r}", param="max_tokens")
        return raw

    async def _generate(
        self, body: dict[str, Any], *, chat: bool, receive: Receive, send: Send
    ) -> None:
        self._check_model(body)
        tokens = self._chat_ids(body) if chat else self._prompt_ids(body)
        max_tokens = self._max_tokens(body, chat=chat, prompt_len=len(tokens))
        stream_flag = body.get("stream", False)
        if not isinstance(stream_flag, bool):
            raise BadRequest("'stream' must be a boolean", param="stream")
        n = body.get("n", 1)
        if n != 1:
            raise BadRequest("the simulated engine supports n=1 only", param="n")
        ignore_eos = bool(body.get("ignore_eos", False))
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        include_usage = bool(opts.get("include_usage", False))
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        stream = self._submit(request_id, tokens, max_tokens=max_tokens, ignore_eos=ignore_eos)
        watcher = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
        watcher.add_done_callback(lambda _t: stream.items.put_nowait(None))
        try:
            if stream_flag:
                await self._stream_response(
                    request_id, stream, chat=chat, include_usage=include_usage, send=send
                )
            else:
                await self._full_response(request_id, stream, chat=chat, send=send)
        except OSError:
            pass  # the client went away mid-response; the finally clause aborts it
        finally:
            watcher.cancel()
            self._abort(request_id)

    def _usage(self, done: FinishedRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": done.prompt_tokens,
            "total_tokens": done.prompt_tokens + done.output_tokens,
            "completion_tokens": done.output_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }

    async def _full_response(
        self, request_id: str, stream: _Stream, *, chat: bool, send: Send
    ) -> None:
        ids: list[int] = []
        while True:
            item = await stream.items.get()
            if item is None:
                # Client gone (uvicorn drops the write) or engine stopping (tell the client).
                await _send_json(
                    send, 503, _error_body("the engine stopped", status=503, param=None)
                )
                return
            if isinstance(item, TokenOutput):
                ids.append(item.token_id)
                continue
            text = builtin_decode([t for t in ids if t != EOS_ID])
            reason = item.finish_reason
            choice: dict[str, Any]
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                }
            await _send_json(
                send,
                200,
                {
                    "id": request_id,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": self.config.model,
                    "choices": [choice],
                    "usage": self._usage(item),
                },
            )
            return

    async def _stream_response(
        self, request_id: str, stream: _Stream, *, chat: bool, include_usage: bool, send: Send
    ) -> None:
        created = int(time.time())
        model = json.dumps(self.config.model)
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'data: {{"id":"{request_id}","object":"{obj}","created":{created},"model":{model},"choices":[{{"index":0,'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        first = True
        while True:
            item = await stream.items.get()
            if item is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            chunks: list[str] = []
            done: FinishedRequest | None = None
            # Drain whatever is queued so a slow consumer gets one write, not many.
            while item is not None:
                if isinstance(item, TokenOutput):
                    text = "" if item.token_id == EOS_ID else builtin_decode([item.token_id])
                    reason = "null" if item.finish_reason is None else f'"{item.finish_reason}"'
                    if chat:
                        if first:
                            chunks.append(
                                head
                                + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
                            )
                        chunks.append(
                            head
                            + f'"delta":{{"content":{json.dumps(text)}}},"logprobs":null,"finish_reason":{reason}}}]}}\n\n'
                        )
                    else:
                        chunks.append(
                            head
                            + f'"text":{json.dumps(text)},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]}}\n\n'
                        )
                    first = False
                else:
                    done = item
                    break
                if stream.items.empty():
                    break
                item = stream.items.get_nowait()
                if item is None:
                    # The disconnect sentinel: leave it for the outer loop, which ends the stream.
                    stream.items.put_nowait(None)
                    break
            if done is not None:
                if include_usage:
                    usage = {
                        "id": request_id,
                        "object": obj,
                        "created": created,
                        "model": self.config.model,
                        "choices": [],
                        "usage": self._usage(done),
                    }
                    chunks.append(f"data: {json.dumps(usage)}\n\n")
                chunks.append("data: [DONE]\n\n")
                await send(
                    {
                        "type": "http.response.body",
                        "body": "".join(chunks).encode(),
                        "more_body": False,
                    }
                )
                return
            if chunks:
                await send(
                    {
                        "type": "http.response.body",
                        "body": "".join(chunks).encode(),
                        "more_body": True,
                    }
                )

    def _tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") is not None:
            self._check_model(body)
        if "messages" in body:
            tokens = self._chat_ids(body)
        elif isinstance(body.get("prompt"), str):
            tokens = builtin_encode(body["prompt"])
        else:
            raise BadRequest("'prompt' (a string) or 'messages' is required", param="prompt")
        return {
            "count": len(tokens),
            "max_model_len": self.engine.profile.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }

    def _detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BadRequest("'tokens' must be a list of token ids", param="tokens")
        return {"prompt": builtin_decode(self._token_ids(tokens, "tokens"))}


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_json(receive: Receive) -> dict[str, Any]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client disconnected before sending the body")
        body = message.get("body", b"")
        size += len(body)
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(body)
        if not message.get("more_body", False):
            break
    try:
        parsed = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(parsed, dict):
        raise BadRequest("request body must be a JSON object")
    return parsed


async def _send_bytes(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, obj: Any) -> None:
    await _send_bytes(send, status, json.dumps(obj).encode(), "application/json")
