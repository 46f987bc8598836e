"""Each routing policy's behaviour on small, hand-built fleets."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from routing.core.errors import NoRoutableWorker
from routing.core.policies import (
    KvScore,
    LeastLoad,
    PredictedTtft,
    PrefixHash,
    RandomPolicy,
    RoundRobin,
    SessionAffinity,
)
from routing.core.policies.base import Policy, hrw_weight, predicted_cached_tokens
from routing.core.types import Decision, RequestFeatures, WorkerView

MODEL = "sim-8b"


def worker(worker_id: str, **overrides: object) -> WorkerView:
    fields: dict[str, object] = {
        "id": worker_id,
        "url": f"http://127.0.0.1/{worker_id}",
        "model": MODEL,
    }
    fields.update(overrides)
    return WorkerView(**fields)  # type: ignore[arg-type]


def fleet(n: int, **overrides: object) -> list[WorkerView]:
    return [worker(f"sim-{i}", **overrides) for i in range(n)]


def request(
    blocks: int = 40, *, prompt_tokens: int | None = None, **overrides: object
) -> RequestFeatures:
    fields: dict[str, object] = {
        "model": MODEL,
        "block_keys": tuple(range(1000, 1000 + blocks)),
        "prompt_tokens": blocks * 16 + 5 if prompt_tokens is None else prompt_tokens,
    }
    fields.update(overrides)
    return RequestFeatures(**fields)  # type: ignore[arg-type]


def decide(
    policy: Policy,
    workers: Sequence[WorkerView],
    cached: Mapping[str, int] | None = None,
    features: RequestFeatures | None = None,
    seed: int = 0,
) -> Decision:
    return policy.decide(
        features or request(), workers, cached or {}, now_s=100.0, rng=random.Random(seed)
    )


ALL = [RoundRobin, RandomPolicy, LeastLoad, SessionAffinity, PrefixHash, KvScore, PredictedTtft]


# -- shared behaviour ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_no_worker_for_the_model_names_the_model(cls: type[Policy]) -> None:
    with pytest.raises(NoRoutableWorker, match="no worker for model 'sim-8b'"):
        decide(cls(), [worker("other", model="llama")])


@pytest.mark.parametrize("cls", ALL)
def test_all_unhealthy_or_draining_says_how_many(cls: type[Policy]) -> None:
    workers = [worker("a", healthy=False), worker("b", draining=True), worker("c", model="llama")]
    with pytest.raises(
        NoRoutableWorker, match="all 2 workers for model 'sim-8b' are unhealthy or draining"
    ):
        decide(cls(), workers)


@pytest.mark.parametrize("cls", ALL)
def test_decision_is_complete_and_explains_itself(cls: type[Policy]) -> None:
    workers = [*fleet(3), worker("sick", healthy=False), worker("leaving", draining=True)]
    d = decide(cls(), workers, {"sim-1": 30}, request(session_key="s"))
    assert {c.worker_id for c in d.ranked} == {"sim-0", "sim-1", "sim-2"}
    assert d.ranked[0].worker_id == d.worker_id
    assert d.policy == cls.name
    assert d.reason.startswith(d.worker_id + ":") or d.worker_id in d.reason
    chosen = d.ranked[0]
    assert d.predicted_cached_tokens == chosen.predicted_cached_tokens
    assert d.predicted_cached_tokens == (480 if d.worker_id == "sim-1" else 0)


def test_predicted_cached_tokens_always_recomputes_the_last_prompt_token() -> None:
    # 64 tokens = exactly 4 blocks: only 3 can be hits because token 64 is recomputed.
    assert predicted_cached_tokens(request(4, prompt_tokens=64), 4) == 48
    assert predicted_cached_tokens(request(4, prompt_tokens=65), 4) == 64
    assert predicted_cached_tokens(request(4, prompt_tokens=65), 2) == 32
    assert predicted_cached_tokens(request(0, prompt_tokens=0), 3) == 0


def test_cached_blocks_beyond_the_request_are_clamped() -> None:
    d = decide(KvScore(), fleet(2), {"sim-0": 999})
    assert d.ranked[0].cached_blocks == 40


# -- round_robin, random --------------------------------------------------------------------


def test_round_robin_cycles_in_id_order_per_model() -> None:
    policy = RoundRobin()
    workers = [worker("c"), worker("a"), worker("b")]
    picks = [decide(policy, workers).worker_id for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]
    assert [c.worker_id for c in decide(policy, workers).ranked] == ["b", "c", "a"]
    other = [worker("x", model="other")]
    assert decide(policy, other, features=request(model="other")).worker_id == "x"
    assert decide(policy, list(reversed(workers))).worker_id == "c"


def test_random_is_fixed_by_the_seed_and_spreads() -> None:
    workers = fleet(4)
    assert (
        decide(RandomPolicy(), workers, seed=7).worker_id
        == decide(RandomPolicy(), workers, seed=7).worker_id
    )
    picks = {decide(RandomPolicy(), workers, seed=s).worker_id for s in range(40)}
    assert picks == {w.id for w in workers}


# -- least_load -----------------------------------------------------------------------------


def test_least_load_takes_the_larger_of_inflight_and_scraped_queues() -> None:
    # b: 1 of ours in flight, already visible in its scraped queue -> load 1, not 2.
    workers = [
        worker("a", running=3),
        worker("b", waiting=1, inflight_requests=1),
        worker("c", inflight_requests=4),
    ]
    d = decide(LeastLoad(), workers)
    assert d.worker_id == "b"
    assert [c.worker_id for c in d.ranked] == ["b", "a", "c"]
    assert d.ranked[0].terms["load"] == 1.0
    assert d.ranked[2].terms["load"] == 4.0


def test_least_load_breaks_ties_with_the_rng_not_by_position() -> None:
    picks = {decide(LeastLoad(), fleet(4), seed=s).worker_id for s in range(40)}
    assert len(picks) == 4


def test_power_of_two_compares_two_sampled_workers() -> None:
    workers = [
        worker("a", running=9),
        worker("b", running=5),
        worker("c", running=1),
        worker("d", running=0),
    ]
    seen = set()
    for seed in range(60):
        d = decide(LeastLoad(power_of_two=True), workers, seed=seed)
        sampled = [c for c in d.ranked if c.note != "not sampled"]
        assert len(sampled) == 2
        assert d.ranked[:2] == tuple(sampled)
        assert d.worker_id == min(sampled, key=lambda c: c.terms["load"]).worker_id
        seen.add(d.worker_id)
    # "a" is never the lower of two; "d" is not always picked.
    assert seen == {"b", "c", "d"}


def test_least_load_treats_stale_metrics_pessimistically() -> None:
    workers = [worker("fresh", running=4), worker("stale", running=0, metrics_age_s=30.0)]
    d = decide(LeastLoad(stale_after_s=5.0), workers, seed=1)
    stale = next(c for c in d.ranked if c.worker_id == "stale")
    assert stale.terms["stale"] == 1.0
    assert stale.terms["load"] == 4.0
    assert "stale metrics on stale (30s)" in d.reason


# -- session_affinity -----------------------------------------------------------------------


def test_session_affinity_is_sticky_and_spreads_sessions() -> None:
    workers = fleet(4, running=0)
    homes = {}
    for i in range(40):
        key = f"session-{i}"
        d1 = decide(SessionAffinity(), workers, features=request(session_key=key), seed=1)
        d2 = decide(
            SessionAffinity(),
            [*workers[1:], workers[0]],
            features=request(session_key=key),
            seed=99,
        )
        assert d1.worker_id == d2.worker_id
        expected = max(workers, key=lambda w: hrw_weight(key, w.id)).id
        assert d1.worker_id == expected
        assert "session home" in d1.reason
        homes[key] = d1.worker_id
    assert len(set(homes.values())) == 4


def test_session_affinity_falls_back_to_least_load_without_a_key_or_home() -> None:
    workers = [worker("a", running=5), worker("b", running=0), worker("c", running=2)]
    d = decide(SessionAffinity(), workers, features=request(session_key=None))
    assert (d.worker_id, d.policy) == ("b", "session_affinity")
    assert d.reason.startswith("no session key, least_load: b:")
    key = next(
        k
        for k in (f"k{i}" for i in range(100))
        if max(workers, key=lambda w: hrw_weight(k, w.id)).id == "a"
    )
    down = [worker("a", healthy=False), *workers[1:]]
    d = decide(SessionAffinity(), down, features=request(session_key=key))
    assert d.worker_id == "b"
    assert "session home a is unhealthy or draining" in d.reason


def test_session_affinity_rendezvous_fallback_keeps_the_stand_in_stable() -> None:
    workers = fleet(5)
    key = "chat-42"
    home = max(workers, key=lambda w: hrw_weight(key, w.id)).id
    down = [worker(w.id, draining=(w.id == home)) for w in workers]
    policy = SessionAffinity(fallback="rendezvous")
    d = decide(policy, down, features=request(session_key=key))
    assert d.worker_id != home
    second = sorted((w for w in workers if w.id != home), key=lambda w: -hrw_weight(key, w.id))[
        0
    ].id
    assert d.worker_id == second
    assert f"stand-in while session home {home}" in d.reason


# -- prefix_hash ----------------------------------------------------------------------------


def test_prefix_hash_sends_a_shared_prefix_to_one_worker() -> None:
    workers = fleet(6)
    base = tuple(range(500, 508))
    picks = set()
    for tail in range(20):
        # Same first 8 blocks, different continuations.
        f = request(blocks=0, block_keys=(*base, 9000 + tail, 9100 + tail), prompt_tokens=170)
        picks.add(decide(PrefixHash(prefix_blocks=8), workers, features=f, seed=tail).worker_id)
    assert len(picks) == 1
    others = {
        decide(
            PrefixHash(prefix_blocks=8),
            workers,
            features=request(blocks=0, block_keys=(k,), prompt_tokens=20),
        ).worker_id
        for k in range(40)
    }
    assert len(others) > 3


def test_prefix_hash_bounded_load_skips_an_overloaded_home() -> None:
    workers = fleet(4)
    f = request(8)
    home = decide(PrefixHash(), workers, features=f).worker_id
    busy = [worker(w.id, running=20 if w.id == home else 1) for w in workers]
    d = decide(PrefixHash(load_epsilon=0.25), busy, features=f)
    assert d.worker_id != home
    assert f"skipped {home} over load bound" in d.reason
    assert d.ranked[-1].worker_id == home
    assert d.ranked[-1].terms["over_bound"] == 1.0


def test_prefix_hash_with_no_full_block_uses_least_load() -> None:
    workers = [worker("a", running=2), worker("b")]
    d = decide(PrefixHash(), workers, features=request(0, prompt_tokens=5))
    assert d.worker_id == "b"
    assert d.reason.startswith("prompt under one block, least_load")


# -- kv_score ---------------------------------------------------------------------------------


def test_kv_score_picks_the_worker_holding_the_prefix() -> None:
    workers = [worker("a", running=1), worker("b", running=1), worker("c", running=0)]
    d = decide(KvScore(), workers, {"b": 37, "a": 3})
    assert d.worker_id == "b"
    assert d.ranked[0].cached_blocks == 37
    assert d.predicted_cached_tokens == 37 * 16
    assert d.reason.startswith("b: 37/40 blocks cached, load 1; best of 3 by ")
    terms = d.ranked[0].terms
    assert set(terms) == {"cache", "queue", "prefill", "kv_pressure", "network"}
    assert terms["cache"] == pytest.approx(37 / 40)
    assert d.ranked[0].score == pytest.approx(sum(terms.values()))


def test_kv_score_terms_are_normalised() -> None:
    workers = [
        worker(
            "a", running=500, inflight_prefill_tokens=10**6, kv_usage_frac=1.0, network_ms=400.0
        ),
        worker("b"),
    ]
    d = decide(KvScore(max_queue_imbalance=1e6), workers, {"a": 40})
    for c in d.ranked:
        for name, value in c.terms.items():
            assert -1.0 <= value <= 1.0, (c.worker_id, name, value)
    a = next(c for c in d.ranked if c.worker_id == "a")
    assert a.terms == {
        "cache": 1.0,
        "queue": -0.5,
        "prefill": -0.25,
        "kv_pressure": -0.1,
        "network": -0.1,
    }


def test_kv_score_moves_to_an_idle_worker_when_the_holder_queue_exceeds_the_guard() -> None:
    idle = worker("idle")
    holder_ok = worker("holder", waiting=4)
    assert (
        decide(KvScore(max_queue_imbalance=8), [holder_ok, idle], {"holder": 40}).worker_id
        == "holder"
    )
    holder_hot = worker("holder", waiting=9)
    d = decide(KvScore(max_queue_imbalance=8), [holder_hot, idle], {"holder": 40})
    assert d.worker_id == "idle"
    assert "imbalance guard: cache on holder ignored (load 9 vs min 0, limit 8)" in d.reason
    hot = next(c for c in d.ranked if c.worker_id == "holder")
    assert hot.terms["cache"] == 0.0
    assert "load 9 vs min 0" in hot.note
    # A partial discount keeps some of the cache benefit.
    d = decide(
        KvScore(max_queue_imbalance=8, imbalance_cache_discount=0.5),
        [holder_hot, idle],
        {"holder": 40},
    )
    assert "discounted x0.5" in d.reason
    assert next(c for c in d.ranked if c.worker_id == "holder").terms["cache"] == pytest.approx(0.5)


def test_kv_score_prefers_less_loaded_when_cache_is_equal() -> None:
    workers = [
        worker("a", running=3),
        worker("b", running=1, kv_usage_frac=0.2),
        worker("c", running=1),
    ]
    d = decide(KvScore(), workers, {"a": 10, "b": 10, "c": 10})
    assert d.worker_id == "c"
    assert [c.worker_id for c in d.ranked] == ["c", "b", "a"]


def test_kv_score_weights_change_the_trade_off() -> None:
    workers = [worker("holder", running=6), worker("idle")]
    cached = {"holder": 20}  # half the prompt: +0.5 against a queue term of -6/8 x 0.5
    assert decide(KvScore(), workers, cached).worker_id == "holder"
    assert decide(KvScore(load_weight=2.0), workers, cached).worker_id == "idle"
    assert decide(KvScore(cache_weight=0.0), workers, cached).worker_id == "idle"


def test_kv_score_stale_worker_is_not_believed_idle() -> None:
    workers = [worker("fresh", running=6), worker("stale", running=0, metrics_age_s=60.0)]
    d = decide(KvScore(), workers, {"fresh": 5, "stale": 5}, seed=3)
    # Equal cache; the stale one's load is imputed as 6, so the tie is broken by the RNG,
    # not won by a scrape from a minute ago.
    stale = next(c for c in d.ranked if c.worker_id == "stale")
    fresh = next(c for c in d.ranked if c.worker_id == "fresh")
    assert stale.terms["queue"] == fresh.terms["queue"]
    assert stale.note == "stale metrics"
    assert "stale metrics on stale (60s)" in d.reason


# -- predicted_ttft ---------------------------------------------------------------------------


def test_predicted_ttft_estimate_parts() -> None:
    w = worker(
        "a",
        inflight_prefill_tokens=1000,
        waiting=1,
        running=4,
        network_ms=2.0,
        prefill_ms_per_token=0.2,
    )
    f = request(40, prompt_tokens=645)
    d = decide(PredictedTtft(waiting_request_ms=50.0, running_seq_ms=0.5), [w], {"a": 20}, f)
    terms = d.ranked[0].terms
    assert terms["queue_ms"] == pytest.approx(max(1000 * 0.2, 50.0) + 4 * 0.5)
    assert terms["prefill_ms"] == pytest.approx((645 - 320) * 0.2)
    assert terms["network_ms"] == pytest.approx(4.0)
    assert terms["est_ttft_ms"] == pytest.approx(202.0 + 65.0 + 4.0)
    assert d.ranked[0].score == pytest.approx(-terms["est_ttft_ms"])
    assert "est TTFT 271.0 ms (queue 202.0 + prefill 65.0 + network 4.0)" in d.reason
    assert PredictedTtft().estimate(f, w, 20) == pytest.approx(terms)


def test_predicted_ttft_prefers_the_cached_worker_until_its_queue_outweighs_the_saving() -> None:
    f = request(100, prompt_tokens=1605)  # 100 blocks
    cached = {"holder": 90}  # saves 1440 tokens of prefill
    policy = PredictedTtft(prefill_ms_per_token=0.1)
    picks = []
    for queued in (0, 1000, 1400, 1500, 3000):
        workers = [worker("holder", inflight_prefill_tokens=queued), worker("idle")]
        picks.append(decide(policy, workers, cached, f).worker_id)
    assert picks == ["holder", "holder", "holder", "idle", "idle"]


def test_predicted_ttft_uses_the_learned_speed_over_the_default() -> None:
    f = request(10, prompt_tokens=165)
    slow = worker("slow", prefill_ms_per_token=5.0)
    fast = worker("fast")
    d = decide(PredictedTtft(prefill_ms_per_token=0.1), [slow, fast], {}, f)
    assert d.worker_id == "fast"
    assert next(c for c in d.ranked if c.worker_id == "slow").terms["ms_per_token"] == 5.0


def test_predicted_ttft_temperature_samples_near_equal_workers() -> None:
    workers = [worker("a"), worker("b", running=2), worker("far", waiting=50)]
    greedy = {decide(PredictedTtft(), workers, seed=s).worker_id for s in range(30)}
    assert greedy == {"a"}
    sampled = [decide(PredictedTtft(temperature_ms=5.0), workers, seed=s) for s in range(60)]
    picks = {d.worker_id for d in sampled}
    assert picks == {"a", "b"}  # 1 ms apart; "far" is 2500 ms behind
    for d in sampled:
        assert d.ranked[0].worker_id == d.worker_id
        assert len(d.ranked) == 3
    assert any("sampled at temperature 5 ms" in d.reason for d in sampled)


def test_predicted_ttft_judges_an_unused_worker_by_its_peers_learned_speed() -> None:
    # Served workers learned 0.06 ms/token; a new one must not look slower (default 0.1)
    # than them, or it would never get the traffic that teaches its speed.
    f = request(10, prompt_tokens=165)
    workers = [
        worker("busy-a", prefill_ms_per_token=0.06, running=10),
        worker("busy-b", prefill_ms_per_token=0.05, running=10),
        worker("busy-c", prefill_ms_per_token=0.07, running=10),
        worker("new"),
    ]
    d = decide(PredictedTtft(prefill_ms_per_token=0.1), workers, {}, f)
    assert d.worker_id == "new"
    assert d.ranked[0].terms["ms_per_token"] == pytest.approx(0.06)
    alone = decide(PredictedTtft(prefill_ms_per_token=0.1), [worker("new")], {}, f)
    assert alone.ranked[0].terms["ms_per_token"] == 0.1


def test_decision_dict_keeps_every_candidate_or_only_the_top_ones() -> None:
    d = decide(LeastLoad(), [worker("a", running=3), worker("b", running=1), worker("c")])
    everyone = d.to_dict()["candidates"]
    top_two = d.to_dict(top=2)["candidates"]
    assert [c["worker"] for c in everyone] == ["c", "b", "a"]
    assert top_two == everyone[:2]
