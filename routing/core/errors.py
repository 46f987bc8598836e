"""Specific exception types raised by the routing core; the edges turn them into 4xx/5xx."""

from __future__ import annotations


class RoutingError(Exception):
    """Base class for every error the routing core raises."""


class NoRoutableWorker(RoutingError):
    """No candidate is healthy, not draining and serving the requested model."""


class InvalidPolicyParams(RoutingError):
    """Policy parameters failed validation; `field` names the offending key."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownPolicy(InvalidPolicyParams):
    """The policy type is not in `routing.core.registry.POLICIES`."""


class MalformedEvent(RoutingError):
    """A KV-event message could not be decoded; the index is left untouched."""
