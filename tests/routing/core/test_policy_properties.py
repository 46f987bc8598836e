"""Invariants every policy keeps, over generated fleets, caches and requests."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.errors import InvalidPolicyParams, NoRoutableWorker
from routing.core.registry import POLICIES, ParamSpec, build_policy, validate_params
from routing.core.types import RequestFeatures, WorkerView

MODELS = ("m1", "m2")
FAST = settings(max_examples=20, deadline=None, database=None)


@st.composite
def fleets(draw: st.DrawFn, *, min_size: int = 0) -> list[WorkerView]:
    n = draw(st.integers(min_value=min_size, max_value=6))
    workers = []
    for i in range(n):
        workers.append(
            WorkerView(
                id=f"w{i}",
                url=f"http://127.0.0.1:{8100 + i}",
                model=draw(st.sampled_from(MODELS)),
                healthy=draw(st.booleans()) or draw(st.booleans()),
                draining=draw(st.integers(0, 4)) == 0,
                running=draw(st.integers(0, 20)),
                waiting=draw(st.integers(0, 20)),
                kv_usage_frac=draw(st.floats(0.0, 1.0)),
                inflight_prefill_tokens=draw(st.integers(0, 50_000)),
                inflight_requests=draw(st.integers(0, 10)),
                metrics_age_s=draw(st.sampled_from([0.0, 1.0, 30.0, math.inf])),
                network_ms=draw(st.sampled_from([0.0, 0.5, 20.0])),
                prefill_ms_per_token=draw(st.sampled_from([None, 0.05, 0.4])),
            )
        )
    return workers


@st.composite
def requests(draw: st.DrawFn) -> RequestFeatures:
    blocks = draw(st.integers(0, 12))
    return RequestFeatures(
        model=draw(st.sampled_from(MODELS)),
        block_keys=tuple(draw(st.integers(0, 2**64 - 1)) for _ in range(blocks)),
        prompt_tokens=blocks * 16 + draw(st.integers(0, 15)),
        session_key=draw(st.sampled_from([None, "s1", "s2", "tenant-x/chat-9"])),
    )


def policy_params(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Valid parameter sets: any subset of the keys, values inside their ranges."""

    def value(spec: ParamSpec) -> st.SearchStrategy[Any]:
        if spec.type == "bool":
            return st.booleans()
        if spec.type == "str":
            return st.sampled_from(spec.choices)
        lo = spec.min if spec.min is not None else -1e6
        hi = spec.max if spec.max is not None else 1e6
        if spec.type == "int":
            return st.integers(int(lo), int(hi))
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False)

    specs = POLICIES[name].params
    return st.fixed_dictionaries({}, optional={key: value(spec) for key, spec in specs.items()})


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[str, dict[str, Any], RequestFeatures, list[WorkerView], dict[str, int]]:
    name = draw(st.sampled_from(sorted(POLICIES)))
    params = draw(policy_params(name))
    workers = draw(fleets())
    features = draw(requests())
    cached = {w.id: draw(st.integers(0, 15)) for w in workers if draw(st.booleans())}
    return name, params, features, workers, cached


def routable(features: RequestFeatures, workers: list[WorkerView]) -> set[str]:
    return {w.id for w in workers if w.model == features.model and w.healthy and not w.draining}


@FAST
@given(scenarios(), st.integers(0, 2**32))
def test_decision_is_a_routable_worker_of_the_model_or_no_routable_worker(
    scenario: tuple[str, dict[str, Any], RequestFeatures, list[WorkerView], dict[str, int]],
    seed: int,
) -> None:
    name, params, features, workers, cached = scenario
    policy = build_policy(name, params)
    allowed = routable(features, workers)
    try:
        d = policy.decide(features, workers, cached, now_s=10.0, rng=random.Random(seed))
    except NoRoutableWorker:
        assert not allowed
        return
    assert allowed, "decided although no worker is routable"
    assert d.worker_id in allowed
    assert [c.worker_id for c in d.ranked][0] == d.worker_id
    assert {c.worker_id for c in d.ranked} == allowed
    assert len(d.ranked) == len(allowed)
    bs = features.block_size
    usable = max(0, (features.prompt_tokens - 1) // bs)
    assert 0 <= d.predicted_cached_tokens <= usable * bs
    assert d.predicted_cached_tokens == min(d.ranked[0].cached_blocks, usable) * bs
    assert all(math.isfinite(c.score) for c in d.ranked)
    assert d.reason


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=8, deadline=None, database=None)
@given(data=st.data(), seed=st.integers(0, 2**32))
def test_candidate_order_does_not_change_the_decision(
    name: str, data: st.DataObject, seed: int
) -> None:
    params = data.draw(policy_params(name))
    workers = data.draw(fleets(min_size=2))
    features = data.draw(requests())
    cached = {w.id: data.draw(st.integers(0, 15)) for w in workers if data.draw(st.booleans())}
    shuffled = data.draw(st.permutations(workers))
    # round_robin is stateful: each ordering gets its own policy and the same history.
    first, second = build_policy(name, params), build_policy(name, params)
    for turn in range(3):
        try:
            a = first.decide(features, workers, cached, now_s=10.0, rng=random.Random(seed + turn))
        except NoRoutableWorker:
            a = None
        try:
            b = second.decide(
                features, shuffled, cached, now_s=10.0, rng=random.Random(seed + turn)
            )
        except NoRoutableWorker:
            b = None
        if a is None or b is None:
            assert a is None and b is None
            return
        assert a.worker_id == b.worker_id
        assert [c.worker_id for c in a.ranked] == [c.worker_id for c in b.ranked]
        assert [c.score for c in a.ranked] == [c.score for c in b.ranked]
        assert a.reason == b.reason


@FAST
@given(st.sampled_from(sorted(POLICIES)).flatmap(lambda n: st.tuples(st.just(n), policy_params(n))))
def test_validate_params_round_trips_its_own_output(named: tuple[str, dict[str, Any]]) -> None:
    name, params = named
    clean = validate_params(name, params)
    assert validate_params(name, clean) == clean
    assert set(clean) == set(POLICIES[name].params)
    for key, value in params.items():
        assert clean[key] == value


@FAST
@given(
    st.sampled_from(sorted(POLICIES)),
    st.one_of(
        st.sampled_from(sorted({k for s in POLICIES.values() for k in s.params})),
        st.text(max_size=8),
    ),
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=4)),
)
def test_validate_params_either_cleans_or_names_the_field(
    name: str, key: str, value: object
) -> None:
    try:
        clean = validate_params(name, {key: value})
    except InvalidPolicyParams as exc:
        assert exc.field == key
        assert key in str(exc) or repr(key) in str(exc)
        return
    assert key in POLICIES[name].params
    assert validate_params(name, clean) == clean
    v = clean[key]
    assert not (isinstance(v, float) and not math.isfinite(v))
