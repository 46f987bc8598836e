"""Checks shared by the services: each raises ServiceError naming the field."""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import urlsplit

from controlplane.common.errors import ServiceError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MODEL_RE = re.compile(r"^[^\s]{1,200}$")
TCP_ENDPOINT_RE = re.compile(
    r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+|\*):(?P<port>\d{1,5})$"
)


def check_name(value: Any, *, field: str = "name") -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ServiceError(
            "Use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            field=field,
        )
    return value


def check_name_case_unique(queryset: Any, name: str, *, kind: str, field: str = "name") -> None:
    """Refuse a name that differs only in letter case from an existing one (`queryset`'s
    `name` column): `GPU-1` next to `gpu-1` is a typo waiting to route traffic wrongly."""
    clash = queryset.filter(name__iexact=name).exclude(name=name).values_list("name", flat=True)
    existing = clash.first()
    if existing is not None:
        raise ServiceError(
            f"{kind} {existing!r} already exists; names must differ by more than letter case.",
            field=field,
        )


def check_model(value: Any, *, field: str = "model") -> str:
    if not isinstance(value, str) or not MODEL_RE.match(value):
        raise ServiceError("A model name is 1-200 characters with no whitespace.", field=field)
    return value


def check_http_url(value: Any, *, field: str) -> str:
    """An http(s) base URL with a host; returned without a trailing slash."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ServiceError("Enter an http:// or https:// URL.", field=field)
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError as exc:
        raise ServiceError(f"Not a valid URL: {exc}.", field=field) from exc
    if parts.scheme not in {"http", "https"}:
        raise ServiceError(
            f"The URL scheme must be http or https, not {parts.scheme or 'missing'!r}.", field=field
        )
    if not parts.hostname:
        raise ServiceError("The URL has no host.", field=field)
    if "@" in parts.netloc:
        # Anything stored here is shown to every reader and copied into the routing snapshot.
        raise ServiceError("A base URL carries no credentials (user:password@).", field=field)
    if port == 0:
        raise ServiceError("The URL port must be 1-65535.", field=field)
    if parts.query or parts.fragment:
        raise ServiceError("A base URL takes no query string or fragment.", field=field)
    return value.rstrip("/")


def check_tcp_endpoint(value: Any, *, field: str) -> str:
    """'' (none) or tcp://host:port, as a ZMQ client connects to it."""
    if value is None or value == "":
        return ""
    match = TCP_ENDPOINT_RE.match(value) if isinstance(value, str) else None
    if match is None or not 1 <= int(match.group("port")) <= 65535:
        raise ServiceError("Enter tcp://host:port (port 1-65535), or leave empty.", field=field)
    return value


def check_int(value: Any, *, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServiceError("A whole number is required.", field=field)
    if not low <= value <= high:
        raise ServiceError(f"Must be between {low} and {high}.", field=field)
    return value


def check_float(value: Any, *, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServiceError("A number is required.", field=field)
    number = float(value)
    if not math.isfinite(number):
        raise ServiceError("Must be a finite number (not NaN or infinity).", field=field)
    if not low <= number <= high:
        raise ServiceError(f"Must be between {low:g} and {high:g}.", field=field)
    return number


def check_labels(value: Any, *, field: str = "labels") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError("Labels are a JSON object of string keys to string values.", field=field)
    if len(value) > 50:
        raise ServiceError("At most 50 labels.", field=field)
    for key, item in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 63 or "\x00" in key:
            raise ServiceError(
                "Label keys are 1-63 characters, with no null character.", field=field
            )
        if not isinstance(item, str) or len(item) > 200:
            raise ServiceError(
                f"Label {key!r}: values are strings of at most 200 characters.", field=field
            )
    return dict(value)
