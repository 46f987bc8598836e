"""Errors raised by control-plane services; the API layer maps them to 4xx bodies."""

from __future__ import annotations


class ServiceError(Exception):
    """Invalid input to a service: becomes 400 with `{field: [message]}`."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Conflict(ServiceError):
    """The request is valid but clashes with the current state (e.g. an experiment already running): 409."""

    status_code = 409


class NotFound(ServiceError):
    status_code = 404


class Forbidden(ServiceError):
    """An authenticated caller acting on something it does not own: 403."""

    status_code = 403
