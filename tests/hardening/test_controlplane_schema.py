"""Property-based fuzzing of every `/api/` operation from the control plane's own OpenAPI
schema (schemathesis), over a real socket, as an operator.

Positive (schema-valid) and negative (schema-violating) requests for each operation must
never get a 5xx, must be refused when replayed without credentials, and must get a
documented status code and content type with a body that matches the documented response
schema. Generation is derandomized (the same examples every run); KVROUTE_FUZZ_EXAMPLES
raises the count per operation and mode for a deeper run.
"""

from __future__ import annotations

import os
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

EXAMPLES = int(os.environ.get("KVROUTE_FUZZ_EXAMPLES", "4"))
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
    cp_server: LiveServer, operator_token: str, api: httpx.Client, settings: Any
) -> None:
    settings.KVROUTE_OPEN_READS = False  # reads need a token too (ignored_auth checks it)
    auth = {"authorization": f"Bearer {operator_token}"}
    # Something for the path parameters to hit now and then.
    worker = {"name": "w0", "base_url": "http://127.0.0.1:1", "model": "m"}
    assert api.post("/api/workers/", json=worker).status_code == 201
    policy = {"name": "p0", "model": "m", "type": "round_robin"}
    assert api.post("/api/policies/", json=policy).status_code == 201

    schema = schemathesis.openapi.from_url(f"{cp_server.url}/api/schema/")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    failures: dict[tuple[str, str, str], str] = {}
    calls = 0

    def fuzzer(operation: Any, mode: GenerationMode) -> Any:
        @hypothesis_settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case: Any) -> None:
            nonlocal calls
            calls += 1
            response = case.call(headers=auth, timeout=10)
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
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzzer(operation, mode)()

    assert calls >= len(operations) * 2
    assert api.get("/api/workers/w0/").status_code == 200, "the server is no longer healthy"
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in sorted(failures.items()))
