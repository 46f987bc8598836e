"""The catalogue of routing policies: name -> factory, parameter schema and description.

`validate_params` is the single gate every parameter set passes (control-plane API,
policy versions, experiments, the offline simulator): it fills defaults and rejects
anything a factory should not see, naming the field. `params_schema` renders the same
schema as JSON Schema for the UI form and OpenAPI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from routing.core.errors import InvalidPolicyParams, UnknownPolicy
from routing.core.policies.base import Policy
from routing.core.policies.kv_score import KvScore
from routing.core.policies.least_load import LeastLoad
from routing.core.policies.predicted_ttft import PredictedTtft
from routing.core.policies.prefix_hash import PrefixHash
from routing.core.policies.random_policy import RandomPolicy
from routing.core.policies.round_robin import RoundRobin
from routing.core.policies.session_affinity import FALLBACKS, SessionAffinity

ParamType = Literal["float", "int", "bool", "str"]
ParamValue = float | int | bool | str

_JSON_TYPES: dict[str, str] = {
    "float": "number",
    "int": "integer",
    "bool": "boolean",
    "str": "string",
}


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One policy parameter: its type, default, inclusive range or choices, and help text."""

    type: ParamType
    default: ParamValue
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy type: `factory(**validated_params)` builds it."""

    factory: Callable[..., Policy]
    description: str
    params: dict[str, ParamSpec] = field(default_factory=dict)


def _weight(default: float, help: str) -> ParamSpec:
    return ParamSpec("float", default, help, min=0.0, max=100.0)


_STALE = ParamSpec(
    "float",
    5.0,
    "Seconds after which a worker's scraped metrics are treated as stale (pessimistically).",
    min=0.0,
    max=3600.0,
)

POLICIES: dict[str, PolicySpec] = {
    "round_robin": PolicySpec(
        factory=RoundRobin,
        description="Each routable worker in turn (id order), one rotation per model.",
    ),
    "random": PolicySpec(
        factory=RandomPolicy,
        description="A uniformly random routable worker; a baseline for experiments.",
    ),
    "least_load": PolicySpec(
        factory=LeastLoad,
        description="Fewest outstanding requests (in flight + running + waiting).",
        params={
            "power_of_two": ParamSpec(
                "bool", False, "Compare only two workers sampled at random (power of two choices)."
            ),
            "stale_after_s": _STALE,
        },
    ),
    "session_affinity": PolicySpec(
        factory=SessionAffinity,
        description="Rendezvous hash of the session key: a conversation stays on one worker.",
        params={
            "fallback": ParamSpec(
                "str",
                "least_load",
                "When the session's worker is unhealthy or draining: route by load, or take "
                "the next worker in the session's hash order (requests without a session key "
                "are always routed by load).",
                choices=FALLBACKS,
            ),
            "stale_after_s": _STALE,
        },
    ),
    "prefix_hash": PolicySpec(
        factory=PrefixHash,
        description="Consistent hash of the prompt's first blocks, with bounded load.",
        params={
            "prefix_blocks": ParamSpec(
                "int", 8, "How many leading blocks identify a prefix.", min=1, max=65536
            ),
            "load_epsilon": ParamSpec(
                "float",
                0.25,
                "Bounded load: skip a worker above (1 + epsilon) x the mean load.",
                min=0.0,
                max=100.0,
            ),
            "stale_after_s": _STALE,
        },
    ),
    "kv_score": PolicySpec(
        factory=KvScore,
        description=(
            "cache x cache_weight - queue x load_weight - prefill x prefill_weight "
            "- kv_usage x kv_pressure_weight - network x network_weight, terms in [0, 1], "
            "with an imbalance guard."
        ),
        params={
            "cache_weight": _weight(1.0, "Weight of the cached fraction of the prompt's blocks."),
            "load_weight": _weight(0.5, "Weight of outstanding requests (normalised)."),
            "prefill_weight": _weight(
                0.25, "Weight of in-flight uncached prefill tokens (normalised)."
            ),
            "kv_pressure_weight": _weight(0.1, "Weight of the worker's KV-cache usage fraction."),
            "network_weight": _weight(
                0.1, "Weight of the network cost to the worker (normalised)."
            ),
            "load_scale": ParamSpec(
                "float",
                8.0,
                "Outstanding requests that count as a full queue term on an otherwise idle fleet.",
                min=1.0,
                max=1e6,
            ),
            "prefill_scale_tokens": ParamSpec(
                "float",
                8192.0,
                "In-flight prefill tokens that count as a full prefill term.",
                min=1.0,
                max=1e9,
            ),
            "network_scale_ms": ParamSpec(
                "float",
                10.0,
                "Network cost (ms) that counts as a full network term.",
                min=0.001,
                max=1e6,
            ),
            "max_queue_imbalance": ParamSpec(
                "float",
                16.0,
                "Imbalance guard: when a worker's load exceeds the least-loaded one's by more, "
                "its cache term is discounted.",
                min=0.0,
                max=1e6,
            ),
            "imbalance_cache_discount": ParamSpec(
                "float",
                0.0,
                "Multiplier on a guarded worker's cache term (0 ignores it).",
                min=0.0,
                max=1.0,
            ),
            "stale_after_s": _STALE,
        },
    ),
    "predicted_ttft": PolicySpec(
        factory=PredictedTtft,
        description=(
            "Estimated TTFT in ms = queued prefill wait + uncached tokens x learned speed "
            "+ network; picks the minimum (or samples with a softmax temperature)."
        ),
        params={
            "prefill_ms_per_token": ParamSpec(
                "float",
                0.1,
                "Prefill speed (ms per uncached token) until a worker's own speed is learned.",
                min=0.0,
                max=1000.0,
            ),
            "waiting_request_ms": ParamSpec(
                "float",
                50.0,
                "Assumed prefill cost (ms) of each request waiting on the worker.",
                min=0.0,
                max=1e6,
            ),
            "running_seq_ms": ParamSpec(
                "float",
                0.5,
                "Delay (ms) each running sequence adds before our first token.",
                min=0.0,
                max=1e6,
            ),
            "temperature_ms": ParamSpec(
                "float",
                0.0,
                "Softmax temperature in ms over the estimates; 0 always picks the minimum.",
                min=0.0,
                max=1e6,
            ),
            "stale_after_s": _STALE,
        },
    ),
}


def _spec(name: str) -> PolicySpec:
    spec = POLICIES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise UnknownPolicy(
            f"unknown policy type {name!r}; known: {', '.join(sorted(POLICIES))}", field="type"
        )
    return spec


def _clean(key: str, spec: ParamSpec, value: object) -> ParamValue:
    if spec.type == "bool":
        if not isinstance(value, bool):
            raise InvalidPolicyParams(f"{key} must be true or false, got {value!r}", field=key)
        return value
    if spec.type == "str":
        if not isinstance(value, str):
            raise InvalidPolicyParams(f"{key} must be a string, got {value!r}", field=key)
        if spec.choices and value not in spec.choices:
            raise InvalidPolicyParams(
                f"{key} must be one of {', '.join(spec.choices)}, got {value!r}", field=key
            )
        return value
    # bool is an int subclass in Python, but `true` is not a number in a policy form.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPolicyParams(f"{key} must be a number, got {value!r}", field=key)
    if not math.isfinite(value):
        raise InvalidPolicyParams(f"{key} must be a finite number, got {value!r}", field=key)
    number: int | float
    if spec.type == "int":
        if isinstance(value, float) and not value.is_integer():
            raise InvalidPolicyParams(f"{key} must be an integer, got {value!r}", field=key)
        number = int(value)
    else:
        number = float(value)
    if spec.min is not None and number < spec.min:
        raise InvalidPolicyParams(f"{key} must be >= {spec.min:g}, got {number!r}", field=key)
    if spec.max is not None and number > spec.max:
        raise InvalidPolicyParams(f"{key} must be <= {spec.max:g}, got {number!r}", field=key)
    return number


def validate_params(name: str, params: Mapping[str, object] | None) -> dict[str, ParamValue]:
    """Clean parameters for policy type `name`, every default filled in.

    Raises `UnknownPolicy` for an unknown type and `InvalidPolicyParams` (with `field`
    set) for unknown keys, wrong types (a bool is not a number), NaN or infinities, and
    values outside the parameter's range (weights cannot be negative). Idempotent:
    validating the output again returns it unchanged.
    """
    spec = _spec(name)
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise InvalidPolicyParams(
            f"params must be an object, got {type(params).__name__}", field="params"
        )
    for key in params:
        if key not in spec.params:
            known = ", ".join(sorted(spec.params)) or "none"
            raise InvalidPolicyParams(
                f"unknown parameter {key!r} for policy {name!r} (known: {known})", field=str(key)
            )
    return {
        key: _clean(key, pspec, params[key]) if key in params else pspec.default
        for key, pspec in spec.params.items()
    }


def build_policy(name: str, params: Mapping[str, object] | None = None) -> Policy:
    """Validate `params` for policy type `name` and construct the policy."""
    clean = validate_params(name, params)
    return _spec(name).factory(**clean)


def params_schema(name: str) -> dict[str, Any]:
    """JSON Schema (draft 2020-12 subset) of policy type `name`'s parameters."""
    spec = _spec(name)
    properties: dict[str, Any] = {}
    for key, pspec in spec.params.items():
        prop: dict[str, Any] = {
            "type": _JSON_TYPES[pspec.type],
            "default": pspec.default,
            "description": pspec.help,
        }
        bound = int if pspec.type == "int" else float
        if pspec.min is not None:
            prop["minimum"] = bound(pspec.min)
        if pspec.max is not None:
            prop["maximum"] = bound(pspec.max)
        if pspec.choices:
            prop["enum"] = list(pspec.choices)
        properties[key] = prop
    return {
        "title": name,
        "description": spec.description,
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def policy_catalog() -> dict[str, dict[str, Any]]:
    """Every policy type's schema, by name (for the UI's type picker)."""
    return {name: params_schema(name) for name in POLICIES}
