"""Routing policies: each turns a request's features and the candidate workers into a
`Decision`. `routing.core.registry.POLICIES` is the catalogue by name."""

from __future__ import annotations

from routing.core.policies.base import Policy
from routing.core.policies.kv_score import KvScore
from routing.core.policies.least_load import LeastLoad
from routing.core.policies.predicted_ttft import PredictedTtft
from routing.core.policies.prefix_hash import PrefixHash
from routing.core.policies.random_policy import RandomPolicy
from routing.core.policies.round_robin import RoundRobin
from routing.core.policies.session_affinity import SessionAffinity

__all__ = [
    "KvScore",
    "LeastLoad",
    "Policy",
    "PredictedTtft",
    "PrefixHash",
    "RandomPolicy",
    "RoundRobin",
    "SessionAffinity",
]
