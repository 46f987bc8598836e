"""Base class of every control-plane API view: authentication, scopes, error mapping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from rest_framework import authentication, exceptions, parsers, status
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
    if isinstance(exc, RequestDataTooBig):
        # Django refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE; say so in JSON, with 413.
        return Response({"detail": str(exc)}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, ServiceError):
        if exc.status_code == status.HTTP_400_BAD_REQUEST:
            exc = ValidationError({exc.field or "non_field_errors": [exc.message]})
        else:
            body: dict[str, Any] = {"detail": exc.message}
            if exc.field:
                body["field"] = exc.field
            return Response(body, status=exc.status_code)
    return exception_handler(exc, context)


class SafeJSONParser(parsers.JSONParser):
    """JSON nested too deep for Python's decoder is a 400 parse error, not a 500."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply.") from None


def _reject_null_characters(kwargs: dict[str, Any], query: Any) -> None:
    # Names never contain NUL, and PostgreSQL refuses it in text parameters (a 500 there):
    # answer with the parameter's name instead of letting it reach a query.
    values = [*kwargs.items(), *((k, v) for k, vs in query.lists() for v in vs)]
    errors = {
        key: ["Null characters are not allowed."]
        for key, value in values
        if isinstance(value, str) and "\x00" in value
    }
    if errors:
        raise ValidationError(errors)


class ApiView(APIView):
    authentication_classes = [BearerTokenAuthentication, authentication.SessionAuthentication]
    permission_classes = [ScopePermission]
    parser_classes = [SafeJSONParser, parsers.FormParser, parsers.MultiPartParser]
    write_scopes: tuple[str, ...] | dict[str, tuple[str, ...]] = ("operator",)

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        return service_exception_handler

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication and scope come first
        _reject_null_characters(kwargs, request.query_params)

    def actor(self) -> Actor:
        actor = actor_from_request(self.request)
        assert actor is not None, "ScopePermission lets no anonymous write through"
        return actor
