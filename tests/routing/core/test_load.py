"""LoadTracker: in-flight accounting, learned prefill speed and TTFT, expiry, annotate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.load import LoadTracker, is_stale, metrics_age_s
from routing.core.types import WorkerView


def view(worker_id: str = "w0", **overrides: object) -> WorkerView:
    fields: dict[str, object] = {
        "id": worker_id,
        "url": f"http://127.0.0.1/{worker_id}",
        "model": "m",
    }
    fields.update(overrides)
    return WorkerView(**fields)  # type: ignore[arg-type]


def test_dispatch_first_token_complete_track_requests_and_prefill_tokens() -> None:
    t = LoadTracker()
    t.dispatch("r1", "w0", uncached_tokens=100, now_s=0.0)
    t.dispatch("r2", "w0", uncached_tokens=50, now_s=0.0)
    t.dispatch("r3", "w1", uncached_tokens=7, now_s=0.0)
    assert t.inflight("w0") == (2, 150)
    assert t.inflight("w1") == (1, 7)
    t.first_token("r1", now_s=0.1)
    assert t.inflight("w0") == (2, 50)
    t.complete("r1", now_s=0.2)
    assert t.inflight("w0") == (1, 50)
    # Completing before the first token also releases the prefill tokens.
    t.complete("r2", now_s=0.3)
    assert t.inflight("w0") == (0, 0)
    assert t.inflight("nobody") == (0, 0)


def test_fail_is_idempotent_and_unknown_ids_are_ignored() -> None:
    t = LoadTracker()
    t.dispatch("r1", "w0", uncached_tokens=10, now_s=0.0)
    t.fail("r1", now_s=1.0)
    t.fail("r1", now_s=1.0)
    t.complete("r1", now_s=1.0)
    t.fail("never-seen", now_s=1.0)
    t.first_token("never-seen", now_s=1.0)
    assert t.inflight("w0") == (0, 0)


def test_redispatch_moves_a_retried_request_to_the_new_worker() -> None:
    t = LoadTracker()
    t.dispatch("r1", "w0", uncached_tokens=10, now_s=0.0)
    t.dispatch("r1", "w1", uncached_tokens=12, now_s=0.1)
    assert t.inflight("w0") == (0, 0)
    assert t.inflight("w1") == (1, 12)


def test_first_token_learns_ms_per_token_including_prefill_queued_ahead() -> None:
    t = LoadTracker(alpha=0.5, min_sample_tokens=10)
    t.dispatch("a", "w0", uncached_tokens=1000, now_s=0.0)
    t.dispatch("b", "w0", uncached_tokens=1000, now_s=0.0)
    t.first_token("a", now_s=0.1)  # 100 ms for 1000 tokens
    load = t.worker_load("w0")
    assert load.prefill_ms_per_token == pytest.approx(0.1)
    assert load.ttft_ms == pytest.approx(100.0)
    # b waited behind a's 1000 tokens: 2000 tokens of work in 300 ms = 0.15 ms/token.
    t.first_token("b", now_s=0.3)
    load = t.worker_load("w0")
    assert load.prefill_ms_per_token == pytest.approx(0.5 * 0.1 + 0.5 * 0.15)
    assert load.ttft_ms == pytest.approx(0.5 * 100.0 + 0.5 * 300.0)
    assert load.samples == 2
    # A second first_token for the same request changes nothing.
    t.first_token("b", now_s=5.0)
    assert t.worker_load("w0").samples == 2


def test_tiny_prefills_do_not_feed_the_speed_estimate() -> None:
    t = LoadTracker(min_sample_tokens=32)
    t.dispatch("a", "w0", uncached_tokens=3, now_s=0.0)
    t.first_token("a", now_s=0.05)
    load = t.worker_load("w0")
    assert load.prefill_ms_per_token is None
    assert load.ttft_ms == pytest.approx(50.0)


def test_annotate_fills_inflight_and_learned_speed_and_keeps_untouched_views() -> None:
    t = LoadTracker(min_sample_tokens=1)
    t.dispatch("a", "w0", uncached_tokens=400, now_s=0.0)
    t.dispatch("b", "w0", uncached_tokens=100, now_s=0.0)
    t.first_token("a", now_s=0.2)
    idle = view("w1", prefill_ms_per_token=0.3)
    out = t.annotate([view("w0"), idle], now_s=0.3)
    assert (out[0].inflight_requests, out[0].inflight_prefill_tokens) == (2, 100)
    assert out[0].prefill_ms_per_token == pytest.approx(0.5)
    assert out[1] is idle  # nothing known: same object, its own speed kept


def test_annotate_resets_stale_inflight_fields_on_incoming_views() -> None:
    t = LoadTracker()
    out = t.annotate([view("w0", inflight_requests=5, inflight_prefill_tokens=99)], now_s=0.0)
    assert (out[0].inflight_requests, out[0].inflight_prefill_tokens) == (0, 0)


def test_stuck_requests_expire_on_annotate() -> None:
    t = LoadTracker(max_age_s=60.0)
    t.dispatch("old", "w0", uncached_tokens=10, now_s=0.0)
    t.dispatch("new", "w0", uncached_tokens=20, now_s=50.0)
    assert t.annotate([view("w0")], now_s=59.0)[0].inflight_requests == 2
    out = t.annotate([view("w0")], now_s=61.0)
    assert (out[0].inflight_requests, out[0].inflight_prefill_tokens) == (1, 20)
    # The expired request completing late must not drive counts negative.
    t.complete("old", now_s=62.0)
    assert t.inflight("w0") == (1, 20)


def test_forget_worker_drops_its_requests_and_speeds() -> None:
    t = LoadTracker(min_sample_tokens=1)
    t.dispatch("a", "w0", uncached_tokens=10, now_s=0.0)
    t.dispatch("b", "w1", uncached_tokens=10, now_s=0.0)
    t.forget_worker("w0")
    assert t.inflight("w0") == (0, 0)
    assert t.inflight("w1") == (1, 10)
    t.complete("a", now_s=1.0)
    assert t.inflight("w0") == (0, 0)


@pytest.mark.parametrize(
    "kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"max_age_s": 0.0}, {"min_sample_tokens": 0}]
)
def test_constructor_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LoadTracker(**kwargs)  # type: ignore[arg-type]


def test_staleness_helpers() -> None:
    assert metrics_age_s(scraped_at_s=None, now_s=10.0) == math.inf
    assert metrics_age_s(scraped_at_s=7.5, now_s=10.0) == pytest.approx(2.5)
    assert metrics_age_s(scraped_at_s=12.0, now_s=10.0) == 0.0
    assert is_stale(view(metrics_age_s=6.0), stale_after_s=5.0)
    assert not is_stale(view(metrics_age_s=5.0), stale_after_s=5.0)
    assert is_stale(view(metrics_age_s=math.inf), stale_after_s=5.0)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "first_token", "complete", "fail", "annotate"]),
        st.sampled_from(["r0", "r1", "r2", "r3", "r4"]),
        st.sampled_from(["w0", "w1", "w2"]),
        st.integers(0, 5000),
    ),
    max_size=40,
)


@settings(max_examples=25, deadline=None, database=None)
@given(OPS)
def test_counts_always_match_the_requests_still_in_flight(
    ops: list[tuple[str, str, str, int]],
) -> None:
    t = LoadTracker(max_age_s=1e9)
    model: dict[str, tuple[str, int, bool]] = {}  # request -> (worker, tokens, prefill pending)
    for step, (op, request_id, worker_id, tokens) in enumerate(ops):
        now_s = float(step)
        if op == "dispatch":
            t.dispatch(request_id, worker_id, uncached_tokens=tokens, now_s=now_s)
            model[request_id] = (worker_id, tokens, True)
        elif op == "first_token":
            t.first_token(request_id, now_s=now_s)
            if request_id in model:
                model[request_id] = (*model[request_id][:2], False)
        elif op in ("complete", "fail"):
            getattr(t, op)(request_id, now_s=now_s)
            model.pop(request_id, None)
        else:
            t.annotate([view("w0")], now_s=now_s)
        for w in ("w0", "w1", "w2"):
            mine = [v for v in model.values() if v[0] == w]
            assert t.inflight(w) == (len(mine), sum(v[1] for v in mine if v[2]))
