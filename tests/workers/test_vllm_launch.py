"""Launch spec -> the exact vLLM command line and environment, and the supervisor's
process lifecycle on a real child process (no vLLM needed here)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from workers.vllm import CommandSpec, EngineStartError, InvalidLaunchSpec, LaunchSpec, Supervisor


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_cpu_argv_matches_the_cpu_build_invocation() -> None:
    spec = LaunchSpec(
        model="/models/tiny",
        port=8301,
        events_port=5601,
        replay_port=5701,
        block_size=32,
        max_model_len=1024,
        num_gpu_blocks_override=64,
        dtype="bfloat16",
        device="cpu",
        python="/venv/bin/python",
        kv_cache_gb=2,
    )
    argv = spec.argv()
    assert argv[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
    ]
    assert _after(argv, "--host") == "127.0.0.1"
    assert _after(argv, "--port") == "8301"
    assert _after(argv, "--block-size") == "32"
    assert _after(argv, "--max-model-len") == "1024"
    assert _after(argv, "--num-gpu-blocks-override") == "64"
    assert _after(argv, "--dtype") == "bfloat16"
    assert "--enable-prefix-caching" in argv
    assert "--enable-prompt-tokens-details" in argv
    # GPU-only knobs never reach the CPU build.
    assert "--gpu-memory-utilization" not in argv
    assert "--kv-cache-memory-bytes" not in argv
    events = json.loads(_after(argv, "--kv-events-config"))
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds only a wildcard endpoint (it connects to any concrete host).
        "endpoint": "tcp://*:5601",
        "replay_endpoint": "tcp://127.0.0.1:5701",
        "topic": "kv-events",
    }
    env = spec.env({"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    assert spec.kv_events_endpoint == "tcp://127.0.0.1:5601"
    assert spec.replay_endpoint == "tcp://127.0.0.1:5701"
    assert spec.url == "http://127.0.0.1:8301"


def test_gpu_argv_uses_vllm_serve_with_memory_knobs() -> None:
    spec = LaunchSpec(
        model="meta-llama/Llama-3.1-8B-Instruct",
        host="0.0.0.0",
        port=8000,
        events_port=5557,
        gpu_memory_utilization=0.85,
        tensor_parallel_size=2,
        kv_cache_gb=10,
        extra_args=("--max-num-seqs", "128"),
    )
    argv = spec.argv()
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert _after(argv, "--gpu-memory-utilization") == "0.85"
    assert _after(argv, "--tensor-parallel-size") == "2"
    assert _after(argv, "--kv-cache-memory-bytes") == str(10 * 2**30)
    assert argv[-2:] == ["--max-num-seqs", "128"]
    events = json.loads(_after(argv, "--kv-events-config"))
    assert events["endpoint"] == "tcp://*:5557"
    assert "replay_endpoint" not in events
    assert spec.kv_events_endpoint == "tcp://127.0.0.1:5557"
    assert spec.effective_block_size == 16
    env = spec.env({})
    assert "HF_HUB_OFFLINE" not in env  # a hub name may need downloading
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_events_off_still_passes_a_valid_config() -> None:
    argv = LaunchSpec(model="/m", device="cpu").argv()
    events = json.loads(_after(argv, "--kv-events-config"))
    assert events["enable_kv_cache_events"] is False
    assert "endpoint" not in events


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": "/m", "port": 0}, "port"),
        ({"model": "/m", "events_port": 70000}, "events_port"),
        ({"model": "/m", "port": 5000, "events_port": 5000}, "port"),
        ({"model": "/m", "replay_port": 5701}, "replay_port"),
        ({"model": "/m", "device": "cpu", "block_size": 16}, "block_size"),
        ({"model": "/m", "block_size": 0}, "block_size"),
        ({"model": "/m", "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"model": "/m", "gpu_memory_utilization": float("nan")}, "gpu_memory_utilization"),
        ({"model": "/m", "tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"model": "/m", "kv_cache_gb": -1}, "kv_cache_gb"),
        ({"model": "/m", "num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),
        ({"model": "/m", "device": "tpu"}, "device"),
        # vLLM refuses to start when one max-length request cannot fit in 63 usable blocks.
        (
            {"model": "/m", "device": "cpu", "num_gpu_blocks_override": 64, "max_model_len": 2048},
            "max_model_len",
        ),
    ],
)
def test_bad_specs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidLaunchSpec) as exc_info:
        LaunchSpec(**kwargs)  # type: ignore[arg-type]
    assert exc_info.value.field == field
    assert field in str(exc_info.value)


def test_spec_round_trips_through_json() -> None:
    spec = LaunchSpec(
        model="/m",
        device="cpu",
        block_size=64,
        events_port=5601,
        extra_args=("--seed", "1"),
        extra_env=(("OMP_NUM_THREADS", "1"),),
    )
    again = LaunchSpec.from_mapping(json.loads(spec.to_json()))
    assert again == spec
    assert again.argv() == spec.argv()
    with pytest.raises(InvalidLaunchSpec) as exc_info:
        LaunchSpec.from_mapping({"model": "/m", "gpu_util": 0.9})
    assert exc_info.value.field == "gpu_util"
    with pytest.raises(InvalidLaunchSpec) as exc_info:
        LaunchSpec.from_mapping({"port": 1})
    assert exc_info.value.field == "model"


# A real child process standing in for an engine's HTTP surface: it serves /health and
# exits with code 3 when asked to (a crash), so restart and backoff are observable.
_ENGINE_SCRIPT = textwrap.dedent(
    """
    import http.server, os, sys, threading
    port = int(sys.argv[1])
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/crash":
                os._exit(3)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _get(url: str) -> int:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return (await client.get(url)).status_code
    except httpx.HTTPError:
        return -1


async def test_supervisor_restarts_a_dead_engine_and_fires_hooks(tmp_path: Path) -> None:
    script = tmp_path / "engine.py"
    script.write_text(_ENGINE_SCRIPT)
    pids = tmp_path / "pids"
    port = _free_port()
    spec = CommandSpec(command=(sys.executable, str(script), str(port), str(pids)), port=port)
    ready: list[int] = []
    exits: list[int | None] = []

    async def on_ready(restarts: int) -> None:
        ready.append(restarts)

    async def on_exit(code: int | None) -> None:
        exits.append(code)

    sup = Supervisor(
        spec,
        on_ready=on_ready,
        on_exit=on_exit,
        backoff_initial_s=0.2,
        health_interval_s=0.05,
        log_path=tmp_path / "engine.log",
    )
    await sup.start()
    try:
        first_pid = sup.pid
        assert ready == [0] and await _get(f"{spec.url}/health") == 200
        await _get(f"{spec.url}/crash")
        for _ in range(200):
            if ready == [0, 1]:
                break
            await asyncio.sleep(0.05)
        assert exits == [3]
        assert ready == [0, 1] and sup.restarts == 1
        assert sup.pid is not None and sup.pid != first_pid
        assert await _get(f"{spec.url}/health") == 200
    finally:
        await sup.stop()
    assert sup.pid is None
    assert await _get(f"{spec.url}/health") == -1
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_supervisor_reports_an_engine_that_never_starts(tmp_path: Path) -> None:
    spec = CommandSpec(
        command=(sys.executable, "-c", "import sys; print('bad model dir'); sys.exit(2)"),
        port=_free_port(),
    )
    sup = Supervisor(spec, log_path=tmp_path / "e.log", health_interval_s=0.05)
    with pytest.raises(EngineStartError, match="bad model dir"):
        await sup.start()
    assert sup.pid is None


async def test_supervisor_kills_an_engine_ignoring_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + _ENGINE_SCRIPT
    )
    port = _free_port()
    spec = CommandSpec(
        command=(sys.executable, str(script), str(port), str(tmp_path / "p")), port=port
    )
    sup = Supervisor(spec, stop_grace_s=0.5, health_interval_s=0.05)
    await sup.start()
    code = await sup.stop()
    assert code == -9


def test_cli_dry_run_prints_the_command_and_rejects_bad_specs() -> None:
    import subprocess

    spec = '{"model": "/models/tiny", "device": "cpu", "port": 8301, "events_port": 5601, "block_size": 32}'
    done = subprocess.run(
        [sys.executable, "-m", "workers.vllm", spec, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in lines and "HF_HUB_OFFLINE=1" in lines
    assert lines[-1].startswith(
        "python3 -m vllm.entrypoints.openai.api_server --model /models/tiny"
    )
    assert '\'{"enable_kv_cache_events":true' in lines[-1]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.vllm",
            '{"model": "/m", "device": "cpu", "block_size": 48}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "block_size" in bad.stderr
