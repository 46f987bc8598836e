"""GPU workers known to the control plane. Health is derived (see selectors), never stored."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Lower


class Worker(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        DRAINING = "draining"
        DISABLED = "disabled"

    name = models.CharField(max_length=128, unique=True)
    base_url = models.CharField(max_length=500)
    model = models.CharField(max_length=200, db_index=True)
    kv_events_endpoint = models.CharField(max_length=300, blank=True, default="")
    replay_endpoint = models.CharField(max_length=300, blank=True, default="")
    block_size = models.PositiveIntegerField(default=16)
    capacity_blocks = models.PositiveIntegerField(default=0)
    network_ms = models.FloatField(default=0.0)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)

    # Load as last reported by the worker's agent.
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    running = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    kv_usage_frac = models.FloatField(default=0.0)
    inflight = models.PositiveIntegerField(default=0)

    # Reachability as last probed by a gateway.
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_ok_at = models.DateTimeField(null=True, blank=True)
    probe_failures = models.PositiveIntegerField(default=0, help_text="consecutive failed probes")
    last_probe_error = models.CharField(max_length=300, blank=True, default="")

    registered_by = models.CharField(max_length=150, blank=True, default="")
    owner_token = models.ForeignKey(
        "common.ApiToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="workers",
        help_text="the worker token that registered it; only that token may act on it",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "name"]
        constraints = [
            # Names differing only in case would confuse operators and dashboards alike.
            models.UniqueConstraint(Lower("name"), name="worker_name_ci_unique"),
            models.CheckConstraint(
                condition=models.Q(state__in=["active", "draining", "disabled"]),
                name="worker_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(block_size__gte=1), name="worker_block_size_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(network_ms__gte=0), name="worker_network_ms_nonneg"
            ),
            models.CheckConstraint(
                condition=models.Q(kv_usage_frac__gte=0) & models.Q(kv_usage_frac__lte=1),
                name="worker_kv_usage_frac_unit",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.model})"
