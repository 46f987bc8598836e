"""Base class of every control-plane API view: authentication, scopes, error mapping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import authentication, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView, exception_handler

from controlplane.common.auth import (
    Actor,
    BearerTokenAuthentication,
    ScopePermission,
    actor_from_request,
)
from controlplane.common.errors import ServiceError


def service_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """ServiceError -> 400 `{field: [message]}`, or its own status with `{"detail", "field"}`."""
    if isinstance(exc, ServiceError):
        if exc.status_code == status.HTTP_400_BAD_REQUEST:
            exc = ValidationError({exc.field or "non_field_errors": [exc.message]})
        else:
            body: dict[str, Any] = {"detail": exc.message}
            if exc.field:
                body["field"] = exc.field
            return Response(body, status=exc.status_code)
    return exception_handler(exc, context)


class ApiView(APIView):
    authentication_classes = [BearerTokenAuthentication, authentication.SessionAuthentication]
    permission_classes = [ScopePermission]
    write_scopes: tuple[str, ...] | dict[str, tuple[str, ...]] = ("operator",)

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        return service_exception_handler

    def actor(self) -> Actor:
        actor = actor_from_request(self.request)
        assert actor is not None, "ScopePermission lets no anonymous write through"
        return actor
