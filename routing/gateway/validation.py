"""Request parsing and validation at the edge: bytes in, a `ParsedRequest` or a 400 naming the field.

Only what routing needs is checked strictly (model, messages/prompt, max_tokens, stream
flags); every other OpenAI field is forwarded to the worker untouched, which validates it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from routing.gateway.errors import GatewayError, bad_request

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
_MAX_TOKEN_ID = 2**32


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion request.

    Exactly one of `messages` (chat), `prompt_text`, `prompt_ids` is set; for a batch
    prompt (a list of prompts) routing uses the first one and `extra_prompt_tokens`-free
    counting is left to the worker.
    """

    kind: str  # "chat" | "completions"
    model: str
    stream: bool
    client_wants_usage: bool
    payload: dict[str, Any]
    messages: list[dict[str, Any]] | None = None
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None


def _check_max_tokens(body: dict[str, Any], *, limit: int) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        if name not in body or body[name] is None:
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"'{name}' must be an integer", param=name, code="invalid_type")
        if value < 1 or value > limit:
            raise bad_request(f"'{name}' must be between 1 and {limit}, got {value}", param=name)


def _check_token_ids(ids: list[Any], *, param: str) -> list[int]:
    for tok in ids:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < _MAX_TOKEN_ID:
            raise bad_request(
                f"'{param}' token ids must be integers in [0, 2**32)",
                param=param,
                code="invalid_type",
            )
    return ids


def _check_text(text: str, *, param: str) -> None:
    """Text to tokenize must be valid Unicode: a JSON `\\ud800` escape decodes to a lone
    surrogate that no tokenizer (and no UTF-8 encoder) accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(
            f"'{param}' contains an unpaired surrogate (invalid Unicode)", param=param
        ) from None


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; strict upstreams (vLLM's pydantic) reject or misread them.
    raise ValueError(f"{name} is not a valid JSON number")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"'{where}' must be an object", param=where, code="invalid_type")
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad_request(
                f"'{where}.role' must be one of {sorted(CHAT_ROLES)}", param=f"{where}.role"
            )
        content = msg.get("content")
        if content is None:
            if role != "assistant":
                raise bad_request(f"'{where}.content' is required", param=f"{where}.content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise bad_request(
                        f"'{where}.content[{j}]' must be an object with a 'type'",
                        param=f"{where}.content[{j}]",
                    )
                if part["type"] == "text":
                    if not isinstance(part.get("text"), str):
                        raise bad_request(
                            f"'{where}.content[{j}].text' must be a string",
                            param=f"{where}.content[{j}].text",
                        )
                    _check_text(part["text"], param=f"{where}.content[{j}].text")
        elif isinstance(content, str):
            _check_text(content, param=f"{where}.content")
        else:
            raise bad_request(
                f"'{where}.content' must be a string or a list of parts",
                param=f"{where}.content",
                code="invalid_type",
            )
    return messages


def parse_request(body: bytes, *, kind: str, max_tokens_limit: int) -> ParsedRequest:
    """Parse one `/v1/chat/completions` (kind="chat") or `/v1/completions` body.

    Raises `GatewayError` (400) with `param` naming the offending field.
    """
    if not body:
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request("request body is nested too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(
            400,
            "'model' is required and must be a non-empty string",
            param="model",
            code="missing_required_parameter",
        )
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream", code="invalid_type")
    options = data.get("stream_options")
    wants_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request(
                "'stream_options' must be an object", param="stream_options", code="invalid_type"
            )
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise bad_request(
                "'stream_options.include_usage' must be a boolean",
                param="stream_options.include_usage",
                code="invalid_type",
            )
        wants_usage = include
    _check_max_tokens(data, limit=max_tokens_limit)

    if kind == "chat":
        messages = _check_messages(data.get("messages"))
        return ParsedRequest("chat", model, stream, wants_usage, data, messages=messages)

    prompt = data.get("prompt")
    if isinstance(prompt, str):
        _check_text(prompt, param="prompt")
        return ParsedRequest("completions", model, stream, wants_usage, data, prompt_text=prompt)
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            if not all(isinstance(p, str) for p in prompt):
                raise bad_request(
                    "'prompt' list must hold only strings", param="prompt", code="invalid_type"
                )
            for p in prompt:
                _check_text(p, param="prompt")
            return ParsedRequest("completions", model, stream, wants_usage, data, prompt_text=first)
        if isinstance(first, list):
            for p in prompt:
                if not isinstance(p, list) or not p:
                    raise bad_request(
                        "'prompt' must be a list of non-empty token-id lists", param="prompt"
                    )
                _check_token_ids(p, param="prompt")
            return ParsedRequest(
                "completions", model, stream, wants_usage, data, prompt_ids=prompt[0]
            )
        ids = _check_token_ids(prompt, param="prompt")
        return ParsedRequest("completions", model, stream, wants_usage, data, prompt_ids=ids)
    raise bad_request(
        "'prompt' is required: a string, a list of strings, or a list of token ids",
        param="prompt",
    )
