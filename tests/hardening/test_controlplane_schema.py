"""Property-based fuzzing of every `/api/` operation from the control plane's own OpenAPI
schema (schemathesis), over a real socket, as an operator.

Positive (schema-valid) and negative (schema-violating) requests for each operation must
never get a 5xx, must be refused when replayed without credentials, and must get a
documented status code and content type with a body that matches the documented response
schema; a refused (4xx) request must leave the database as it was. Generation is derandomized (the same examples every run); KVROUTE_FUZZ_EXAMPLES
raises the count per operation and mode for a deeper run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.hardening.conftest import LiveServer

EXAMPLES = int(os.environ.get("KVROUTE_FUZZ_EXAMPLES", "3"))
CHECKS = [
    not_a_server_error,
    ignored_auth,  # replays each request without credentials: must be refused
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Not checked: positive_data_acceptance (the schema states types, not every bound the
# services enforce, so schema-valid data may rightly get a 400 naming the field), and
# negative_data_rejection (an empty query value such as `?status=` deliberately means "no
# filter"; the hand-written tests check that real bad values are refused).


def test_every_operation_survives_schema_driven_fuzzing(
    cp_server: LiveServer,
    operator_token: str,
    api: httpx.Client,
    settings: Any,
    db_state: Callable[[], dict[str, Any]],
) -> None:
    settings.KVROUTE_OPEN_READS = False  # reads need a token too (ignored_auth checks it)
    auth = {"authorization": f"Bearer {operator_token}"}

    def seed() -> dict[str, Any]:
        """Rows the known path parameters name (re-made after a fuzzed DELETE)."""
        worker = {"name": "w0", "base_url": "http://127.0.0.1:1", "model": "m"}
        assert api.post("/api/workers/", json=worker).status_code in (200, 201)
        if api.get("/api/policies/p0/").status_code == 404:
            policy = {"name": "p0", "model": "m", "type": "round_robin"}
            assert api.post("/api/policies/", json=policy).status_code == 201
        version_id = api.get("/api/policies/p0/").json()["versions"][0]["version_id"]
        if api.get("/api/experiments/e0/").status_code == 404:
            arms = [{"share": 50, "version_id": version_id}] * 2
            experiment = {"name": "e0", "model": "m", "arms": arms}
            assert api.post("/api/experiments/", json=experiment).status_code == 201
        experiment_id = api.get("/api/experiments/e0/").json()["id"]
        return {
            "/api/workers/": {"name": "w0"},
            "/api/policies/": {"name": "p0", "number": 1},
            "/api/experiments/": {"name": "e0"},
            "/api/models/": {"model": "m"},
            "/api/telemetry/workers/": {"worker_id": "w0"},
            "/api/telemetry/requests/": {"request_id": "r0"},
            "/api/telemetry/experiments/": {"experiment_id": experiment_id},
        }

    schema = schemathesis.openapi.from_url(f"{cp_server.url}/api/schema/")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    failures: dict[tuple[str, str, str], str] = {}
    calls = 0

    def fuzzer(operation: Any, mode: GenerationMode, path_parameters: dict[str, Any]) -> Any:
        @hypothesis_settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
        def fuzz(case: Any) -> None:
            nonlocal calls
            calls += 1
            writes = case.method.upper() not in ("GET", "HEAD", "OPTIONS")
            before = db_state() if writes else None
            response = case.call(headers=auth, timeout=10)
            if writes and 400 <= response.status_code < 500 and db_state() != before:
                key = (operation.label, mode.value, "refused_request_wrote")
                failures.setdefault(key, f"{response.status_code} {case.as_curl_command()}")
            for check in CHECKS:
                try:
                    case.validate_response(response, checks=[check], headers=auth)
                except BaseException as exc:  # schemathesis raises an exception group
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    key = (operation.label, mode.value, check.__name__)
                    failures.setdefault(key, str(exc)[:800])

        return fuzz

    for operation in operations:
        known = next((v for k, v in seed().items() if operation.path.startswith(k)), {})
        names = {p.name for p in operation.path_parameters}
        # Generated path parameters (mostly unknown names), then the seeded rows' names so
        # that generated bodies and queries reach the services behind the lookups.
        variants = [{}, {k: v for k, v in known.items() if k in names}] if names else [{}]
        for path_parameters in variants:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzzer(operation, mode, path_parameters)()

    assert calls >= len(operations) * 2
    assert api.get("/api/workers/").status_code == 200, "the server is no longer healthy"
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in sorted(failures.items()))
