"""The simulated vLLM engine's HTTP surface (workers/sim) against a hostile caller, over a
real socket: bad input gets a vLLM-shaped error (`{"error": {message, type, param, code}}`)
with the right status, and the engine keeps serving. Open bugs: pending_test_sim.py.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.hardening.conftest import SIM_MODEL, openai_error

Case = tuple[str, Any, int, str | None]


def run_cases(url: str, cases: list[Case]) -> None:
    failures = []
    for path, body, status, param in cases:
        if isinstance(body, bytes | str):
            resp = httpx.post(
                url + path, content=body, headers={"content-type": "application/json"}, timeout=20
            )
        else:
            resp = httpx.post(url + path, json=body, timeout=20)
        err = openai_error(resp)
        if resp.status_code != status:
            failures.append(
                f"{path} {str(body)[:90]!r}: {resp.status_code} (want {status}) {resp.text[:150]}"
            )
        elif err is None:
            failures.append(f"{path} {str(body)[:90]!r}: not an error body: {resp.text[:150]}")
        elif param is not None and err["param"] != param:
            failures.append(f"{path} {str(body)[:90]!r}: param {err['param']!r} (want {param!r})")
    ok = httpx.post(url + "/v1/completions", json=gen(), timeout=20)
    assert ok.status_code == 200, f"the engine no longer serves: {ok.text[:200]}"
    assert not failures, "\n".join(failures)


def gen(**overrides: Any) -> dict[str, Any]:
    return {"model": SIM_MODEL, "prompt": "hello", "max_tokens": 4, **overrides}


def chat(**overrides: Any) -> dict[str, Any]:
    return {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **overrides,
    }


def test_generation_endpoints_refuse_bad_input(sim_url: str) -> None:
    C, CH = "/v1/completions", "/v1/chat/completions"
    # fmt: off
    cases: list[Case] = [
        (C, "{not json", 400, None),
        (C, "", 400, None),
        (C, "[1]", 400, None),
        (CH, "null", 400, None),
        (C, {k: v for k, v in gen().items() if k != "model"}, 400, "model"),
        (C, gen(model="other"), 404, "model"),
        (C, gen(prompt=None), 400, "prompt"),
        (C, gen(prompt=""), 400, "prompt"),
        (C, gen(prompt=[-1]), 400, "prompt"),
        (C, gen(prompt=[2**64]), 400, "prompt"),
        (C, gen(prompt=[1.5]), 400, "prompt"),
        (C, gen(prompt=[True]), 400, "prompt"),
        (C, gen(prompt=["a", "b"]), 400, "prompt"),
        (C, gen(prompt=[[1], [2]]), 400, "prompt"),
        (C, gen(prompt=list(range(5000))), 400, "prompt"),
        (C, gen(max_tokens=0), 400, "max_tokens"),
        (C, gen(max_tokens=-1), 400, "max_tokens"),
        (C, gen(max_tokens="4"), 400, "max_tokens"),
        (C, gen(max_tokens=4.5), 400, "max_tokens"),
        (C, gen(max_tokens=2**63), 400, "max_tokens"),
        (C, gen(n=2), 400, "n"),
        (C, gen(stream="yes"), 400, "stream"),
        (C, gen(stream=True, stream_options="x"), 400, "stream_options"),
        (CH, chat(messages=[]), 400, "messages"),
        (CH, chat(messages="hi"), 400, "messages"),
        (CH, chat(messages=[{"content": "hi"}]), 400, "messages"),
        (CH, chat(messages=[{"role": "user", "content": 5}]), 400, "messages"),
        (CH, chat(max_completion_tokens=-2), 400, "max_tokens"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": "x"}, 400, "messages"),
        ("/tokenize", {"prompt": "hi", "model": "other"}, 404, "model"),
        ("/detokenize", {}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [1.5]}, 400, "tokens"),
    ]
    # fmt: on
    run_cases(sim_url, cases)


def test_routes_methods_and_body_limit(sim_url: str) -> None:
    for method, path, status in [
        ("POST", "/v1/models", 405),
        ("GET", "/v1/completions", 405),
        ("POST", "/health", 405),
        ("GET", "/reset_prefix_cache", 405),  # was a 404: every route answers 405 alike
        ("POST", "/sim/stats", 405),
        ("GET", "/v1/embeddings", 404),
    ]:
        resp = httpx.request(method, sim_url + path, timeout=10)
        assert resp.status_code == status, (method, path, resp.text[:200])
        assert openai_error(resp) is not None, (method, path, resp.text[:200])
    resp = httpx.post(
        sim_url + "/v1/completions",
        content=b"{}" + b" " * (33 * 1024 * 1024),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 413, resp.text[:200]
    assert openai_error(resp) is not None


def test_hang_ups_mid_stream_free_the_engine(sim_url: str) -> None:
    body = chat(stream=True, max_tokens=1000, ignore_eos=True)
    for _ in range(5):
        with httpx.stream("POST", sim_url + "/v1/chat/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            for _chunk in r.iter_bytes():
                break

    def busy() -> float:
        text = httpx.get(sim_url + "/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )

    deadline = time.monotonic() + 10
    while busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert busy() == 0.0
