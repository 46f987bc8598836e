"""Routing policies with immutable versions, per-model activation history, and A/B experiments."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Lower


class Policy(models.Model):
    name = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=200, db_index=True)
    description = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "name"]
        verbose_name_plural = "policies"
        constraints = [models.UniqueConstraint(Lower("name"), name="policy_name_ci_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.model})"


class PolicyVersion(models.Model):
    """One immutable parameter set of a policy: never updated, only superseded."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    type = models.CharField(max_length=64, help_text="a name in routing.core.registry.POLICIES")
    params = models.JSONField(default=dict, blank=True)
    author = models.CharField(max_length=150, blank=True, default="")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["policy", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "number"], name="policyversion_unique_number"
            ),
            models.CheckConstraint(
                condition=models.Q(number__gte=1), name="policyversion_number_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy.name} v{self.number} ({self.type})"


class Activation(models.Model):
    """History: one row per activation or rollback of a model's default-route policy."""

    class Kind(models.TextChoices):
        ACTIVATE = "activate"
        ROLLBACK = "rollback"

    model = models.CharField(max_length=200, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ACTIVATE)
    version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="activations")
    previous_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # What a rollback of this activation returns to: rollbacks walk this chain back,
    # so rolling back twice goes two steps back instead of re-activating the bad version.
    previous_activation = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor = models.CharField(max_length=150, blank=True, default="")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.model}: {self.kind} -> {self.version}"


class ActiveVersion(models.Model):
    """The one active version per model (unique on model); the row is the activation lock."""

    model = models.CharField(max_length=200, unique=True)
    version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    activation = models.ForeignKey(
        Activation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return f"{self.model}: {self.version}"


class Experiment(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        RUNNING = "running"
        STOPPED = "stopped"

    class StickyKey(models.TextChoices):
        SESSION = "session", "session header"
        TENANT = "tenant", "tenant / API key"
        REQUEST = "request", "per request"

    name = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=200, db_index=True)
    description = models.TextField(blank=True, default="")
    sticky_key = models.CharField(
        max_length=16, choices=StickyKey.choices, default=StickyKey.SESSION
    )
    shadow_version = models.ForeignKey(
        PolicyVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="decisions computed and recorded for comparison, never routed",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(Lower("name"), name="experiment_name_ci_unique"),
            models.UniqueConstraint(
                fields=["model"],
                condition=models.Q(status="running"),
                name="experiment_one_running_per_model",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["draft", "running", "stopped"]),
                name="experiment_status_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(sticky_key__in=["session", "tenant", "request"]),
                name="experiment_sticky_key_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.model}, {self.status})"


class ExperimentArm(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="arms")
    name = models.CharField(max_length=32)
    version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="arms")
    share = models.PositiveSmallIntegerField(help_text="percent of traffic, 1-100; arms sum to 100")

    class Meta:
        ordering = ["experiment", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "name"], name="experimentarm_unique_name"
            ),
            models.CheckConstraint(
                condition=models.Q(share__gte=1) & models.Q(share__lte=100),
                name="experimentarm_share_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.name}/{self.name}: {self.version} {self.share}%"
