"""The policy catalogue: validation names the field, defaults fill in, schemas are JSON."""

from __future__ import annotations

import json
import math
import random

import pytest

from routing.core.errors import InvalidPolicyParams, UnknownPolicy
from routing.core.registry import (
    POLICIES,
    build_policy,
    params_schema,
    policy_catalog,
    validate_params,
)
from routing.core.types import RequestFeatures, WorkerView

EXPECTED = {
    "round_robin",
    "random",
    "least_load",
    "session_affinity",
    "prefix_hash",
    "kv_score",
    "predicted_ttft",
}


def test_every_policy_type_is_registered_and_builds_with_defaults() -> None:
    assert set(POLICIES) == EXPECTED
    workers = [WorkerView(id="w0", url="http://127.0.0.1:1", model="m")]
    for name in POLICIES:
        policy = build_policy(name, {})
        assert policy.name == name
        d = policy.decide(RequestFeatures(model="m"), workers, {}, now_s=0.0, rng=random.Random(0))
        assert d.worker_id == "w0"


def test_defaults_are_filled_and_given_values_kept() -> None:
    clean = validate_params("kv_score", {"cache_weight": 2, "max_queue_imbalance": 4.5})
    assert clean["cache_weight"] == 2.0 and isinstance(clean["cache_weight"], float)
    assert clean["max_queue_imbalance"] == 4.5
    assert clean["load_weight"] == POLICIES["kv_score"].params["load_weight"].default
    assert set(clean) == set(POLICIES["kv_score"].params)
    assert validate_params("round_robin", None) == {}


def test_build_policy_passes_the_params_to_the_policy() -> None:
    policy = build_policy("prefix_hash", {"prefix_blocks": 3, "load_epsilon": 0.5})
    assert (policy.prefix_blocks, policy.load_epsilon) == (3, 0.5)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "params", "field", "message"),
    [
        ("kv_score", {"cache_weight": math.nan}, "cache_weight", "finite"),
        ("kv_score", {"cache_weight": math.inf}, "cache_weight", "finite"),
        ("kv_score", {"load_weight": -0.1}, "load_weight", ">= 0"),
        ("kv_score", {"imbalance_cache_discount": 1.5}, "imbalance_cache_discount", "<= 1"),
        ("kv_score", {"cache_weight": True}, "cache_weight", "must be a number"),
        ("kv_score", {"cache_weight": "1.0"}, "cache_weight", "must be a number"),
        ("kv_score", {"cache_wieght": 1.0}, "cache_wieght", "unknown parameter 'cache_wieght'"),
        ("prefix_hash", {"prefix_blocks": 2.5}, "prefix_blocks", "integer"),
        ("prefix_hash", {"prefix_blocks": 0}, "prefix_blocks", ">= 1"),
        ("least_load", {"power_of_two": 1}, "power_of_two", "true or false"),
        ("session_affinity", {"fallback": "nearest"}, "fallback", "one of least_load, rendezvous"),
        ("session_affinity", {"fallback": 3}, "fallback", "must be a string"),
        ("round_robin", {"anything": 1}, "anything", "known: none"),
    ],
)
def test_invalid_params_name_the_field(
    name: str, params: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(InvalidPolicyParams, match=message) as info:
        validate_params(name, params)
    assert info.value.field == field
    assert field in str(info.value)
    with pytest.raises(InvalidPolicyParams):
        build_policy(name, params)


def test_integral_float_is_accepted_for_an_int_param() -> None:
    assert validate_params("prefix_hash", {"prefix_blocks": 4.0})["prefix_blocks"] == 4


def test_params_must_be_an_object() -> None:
    with pytest.raises(InvalidPolicyParams, match="params must be an object") as info:
        validate_params("kv_score", [1, 2])  # type: ignore[arg-type]
    assert info.value.field == "params"


def test_unknown_policy_type() -> None:
    with pytest.raises(
        UnknownPolicy, match="unknown policy type 'fastest'; known: kv_score"
    ) as info:
        validate_params("fastest", {})
    assert info.value.field == "type"
    with pytest.raises(UnknownPolicy):
        params_schema("fastest")


def test_schema_is_json_and_matches_the_param_specs() -> None:
    catalog = policy_catalog()
    assert json.loads(json.dumps(catalog)) == catalog
    schema = params_schema("kv_score")
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    cw = schema["properties"]["cache_weight"]
    assert (
        cw["type"] == "number"
        and cw["minimum"] == 0.0
        and cw["default"] == 1.0
        and cw["description"]
    )
    assert params_schema("least_load")["properties"]["power_of_two"]["type"] == "boolean"
    assert params_schema("prefix_hash")["properties"]["prefix_blocks"]["type"] == "integer"
    assert params_schema("session_affinity")["properties"]["fallback"]["enum"] == [
        "least_load",
        "rendezvous",
    ]
    assert params_schema("round_robin")["properties"] == {}


def test_every_default_is_valid_under_its_own_schema() -> None:
    for name, spec in POLICIES.items():
        defaults = {key: p.default for key, p in spec.params.items()}
        assert validate_params(name, defaults) == defaults
