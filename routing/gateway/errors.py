"""OpenAI-shaped errors: every 4xx/5xx the gateway answers has the body
`{"error": {"message", "type", "param", "code"}}`, like the OpenAI API and vLLM."""

from __future__ import annotations

import json


class GatewayError(Exception):
    """An error the gateway answers with directly (never forwarded to a worker)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | int | None = None
) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type, "param": param, "code": code}},
        separators=(",", ":"),
    ).encode()


def bad_request(
    message: str, *, param: str | None = None, code: str = "invalid_value"
) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def sse_error_event(message: str, *, code: int = 502) -> bytes:
    """The event that ends a stream broken after its first byte, then the usual terminator."""
    payload = error_body(message, type="upstream_error", code=code)
    return b"data: " + payload + b"\n\ndata: [DONE]\n\n"
