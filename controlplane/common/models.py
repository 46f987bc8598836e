"""API tokens: only a SHA-256 of the secret is stored; the secret is shown once."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    class Scope(models.TextChoices):
        OPERATOR = "operator", "operator (everything)"
        WORKER = "worker", "worker (register and heartbeat its own workers)"
        READ = "read", "read (GET only)"

    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(
        max_length=12, editable=False, help_text="first characters, for recognition"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__in=["operator", "worker", "read"]),
                name="apitoken_scope_valid",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.scope})"
