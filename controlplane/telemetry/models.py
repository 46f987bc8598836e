"""Telemetry tables: sampled request records, mergeable rollups, fleet samples.

Ids of workers, policy versions and experiments are stored as plain values, not
foreign keys: telemetry must outlive a deleted worker or policy and must never block
those deletes.
"""

from __future__ import annotations

from django.db import models


class RequestRecord(models.Model):
    """One routed request as the gateway reported it (kept for a sample of requests)."""

    request_id = models.CharField(max_length=100, unique=True)
    ts = models.DateTimeField(db_index=True)
    model = models.CharField(max_length=200)
    tenant = models.CharField(max_length=200, blank=True, default="")
    session_key = models.CharField(max_length=200, blank=True, default="")
    worker_id = models.CharField(max_length=200, blank=True, default="")
    policy = models.CharField(max_length=200, blank=True, default="")
    policy_version_id = models.BigIntegerField(default=0)
    policy_type = models.CharField(max_length=100, blank=True, default="")
    experiment_id = models.BigIntegerField(default=0)
    arm = models.CharField(max_length=100, blank=True, default="")
    prompt_tokens = models.IntegerField(default=0)
    predicted_cached_tokens = models.IntegerField(default=0)
    actual_cached_tokens = models.IntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField(null=True, blank=True)
    output_tokens = models.IntegerField(default=0)
    status = models.CharField(max_length=32, default="ok")
    http_status = models.IntegerField(default=200)
    retries = models.IntegerField(default=0)
    routing_overhead_us = models.FloatField(default=0.0)
    stream = models.BooleanField(default=False)
    candidates = models.JSONField(default=list, blank=True)
    shadow = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    # Chained prompt block keys (routing.core.blocks): lets the what-if panel replay the
    # request's prefix sharing in the offline simulator. None when the gateway sent none.
    block_keys = models.JSONField(null=True, blank=True)
    block_size = models.IntegerField(default=16)

    class Meta:
        indexes = [
            models.Index(fields=["experiment_id", "arm", "ts"], name="telemetry_req_exp_arm_ts"),
            models.Index(fields=["worker_id", "ts"], name="telemetry_req_worker_ts"),
        ]
        ordering = ["-ts"]


class Rollup(models.Model):
    """Additive aggregate of the requests of one time bucket and one (model, worker, arm).

    Every field sums across buckets (histograms are sparse {bucket index: count} maps),
    so minute rows merge exactly into hours; rates and percentiles are derived on read.
    `cached_known_*` count only requests whose worker reported `cached_tokens`, so the
    hit rate and the prediction error compare like with like.
    """

    # 10 s rows feed the live overview and are dropped after a couple of hours; minute
    # rows are the record (folded into hour rows as they age).
    TEN_S = "10s"
    MINUTE = "minute"
    HOUR = "hour"
    GRANULARITIES = [(TEN_S, "10 seconds"), (MINUTE, "minute"), (HOUR, "hour")]

    granularity = models.CharField(max_length=8, choices=GRANULARITIES, default=MINUTE)
    bucket_start = models.DateTimeField(db_index=True)
    model = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    policy_version_id = models.BigIntegerField(default=0)
    experiment_id = models.BigIntegerField(default=0)
    arm = models.CharField(max_length=100, blank=True, default="")

    requests = models.IntegerField(default=0)
    errors = models.IntegerField(default=0)
    retries = models.IntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_known_requests = models.IntegerField(default=0)
    cached_known_prompt_tokens = models.BigIntegerField(default=0)
    actual_cached_tokens = models.BigIntegerField(default=0)
    predicted_cached_tokens = models.BigIntegerField(default=0)
    prediction_abs_error_tokens = models.BigIntegerField(default=0)
    hit_requests = models.IntegerField(default=0)
    ttft_count = models.IntegerField(default=0)
    ttft_sum_ms = models.FloatField(default=0.0)
    ttft_hist = models.JSONField(default=dict)
    e2e_count = models.IntegerField(default=0)
    e2e_sum_ms = models.FloatField(default=0.0)
    e2e_hist = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "granularity",
                    "bucket_start",
                    "model",
                    "worker_id",
                    "policy_version_id",
                    "experiment_id",
                    "arm",
                ],
                name="telemetry_rollup_unique_bucket",
            )
        ]
        ordering = ["bucket_start"]


class FleetSample(models.Model):
    """One scrape of one worker's /metrics; counters kept raw plus the delta since the
    previous scrape (a counter that went down means the engine restarted)."""

    worker_id = models.CharField(max_length=200)
    ts = models.DateTimeField(db_index=True)
    ok = models.BooleanField(default=True)
    error = models.CharField(max_length=300, blank=True, default="")
    running = models.FloatField(default=0.0)
    waiting = models.FloatField(default=0.0)
    kv_usage_frac = models.FloatField(default=0.0)
    prefix_hits_total = models.FloatField(default=0.0)
    prefix_queries_total = models.FloatField(default=0.0)
    preemptions_total = models.FloatField(default=0.0)
    evictions_total = models.FloatField(null=True, blank=True)
    prefix_hits_delta = models.FloatField(default=0.0)
    prefix_queries_delta = models.FloatField(default=0.0)
    preemptions_delta = models.FloatField(default=0.0)
    evictions_delta = models.FloatField(default=0.0)
    interval_s = models.FloatField(default=0.0)
    # The gateway's KV-event stream state for the worker (live, waiting, silent, stale,
    # broken; "" when no gateway view was available).
    events_state = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["worker_id", "ts"], name="telemetry_fleet_worker_ts")]
        ordering = ["ts"]


class StreamCursor(models.Model):
    """Last stream entry id consumed, per source; advanced in the same transaction as the
    rows it produced, which is what makes a drain safe to run twice."""

    name = models.CharField(max_length=100, unique=True)
    last_id = models.CharField(max_length=64, default="0-0")
    updated_at = models.DateTimeField(auto_now=True)


class ExperimentResult(models.Model):
    """The latest computed results of one experiment (JSON body, replaced each run)."""

    experiment_id = models.BigIntegerField(unique=True)
    computed_at = models.DateTimeField()
    body = models.JSONField(default=dict)
