"""Tokenizer adapters: a request's prompt -> the token ids (or text) its block keys come from.

Adapters, chosen per model (see `routing.gateway.config`):

- `builtin`: `routing.core.tokenizer` (exactly what the simulated engine does);
- `hf:/dir`: a local Hugging Face tokenizer directory (`tokenizer.json`, and the chat template
  from `tokenizer_config.json` or `chat_template.jinja`, rendered with jinja2 like vLLM does);
- `remote`: the worker's own `POST /tokenize` (vLLM's endpoint), results cached by prompt;
- `text[:N]`: no tokenizer; the rendered text is cut into N-character blocks (default 64)
  and the token count is estimated at 4 characters per token.

Token-id prompts never reach an adapter. Every adapter is async so that `remote` fits the
same call; the local ones do not await anything.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from routing.core.tokenizer import builtin_encode, render_chat

CHARS_PER_TOKEN_ESTIMATE = 4


@dataclass(frozen=True, slots=True)
class Encoded:
    """Token ids of a prompt, or (text adapter) the text itself with an estimated count."""

    token_ids: list[int] | None
    text: str | None
    prompt_tokens: int


class TokenizerAdapter(Protocol):
    name: str

    async def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, worker_url: str
    ) -> Encoded: ...

    async def encode_text(self, text: str, *, worker_url: str) -> Encoded: ...


_ASSISTANT_HEADER = render_chat([])


class BuiltinAdapter:
    """`routing.core.tokenizer`, memoised per chat message.

    The builtin tokenizer cuts special markers out before anything else, and the builtin
    template puts markers around every message's content, so the ids of a rendered
    conversation are exactly the concatenation of each message's ids plus the assistant
    header's. Shared system prompts and conversation history are then tokenized once, not
    per request (tests/gateway/test_parts.py checks the equality on awkward inputs).
    """

    name = "builtin"

    def __init__(self, *, cache_size: int = 4096, max_cached_chars: int = 262_144) -> None:
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        self._max_cached_chars = max_cached_chars
        self._header_ids = builtin_encode(_ASSISTANT_HEADER)

    def _message_ids(self, message: dict[str, Any]) -> list[int]:
        text = render_chat([message])[: -len(_ASSISTANT_HEADER)]
        ids = self._cache.get(text)
        if ids is not None:
            self._cache.move_to_end(text)
            return ids
        ids = builtin_encode(text)
        if len(text) <= self._max_cached_chars:
            self._cache[text] = ids
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return ids

    async def encode_chat(self, messages: Sequence[dict[str, Any]], *, worker_url: str) -> Encoded:
        ids: list[int] = []
        for message in messages:
            ids.extend(self._message_ids(message))
        ids.extend(self._header_ids)
        return Encoded(ids, None, len(ids))

    async def encode_text(self, text: str, *, worker_url: str) -> Encoded:
        ids = builtin_encode(text)
        return Encoded(ids, None, len(ids))


class TextAdapter:
    """No tokenizer: character blocks. Keys never match engine KV events, so such a model
    is routed on the approximate (routed-history) index only."""

    name = "text"

    def __init__(self, *, block_chars: int = 64) -> None:
        if block_chars <= 0:
            raise ValueError("text adapter block size must be positive")
        self.block_chars = block_chars

    async def encode_chat(self, messages: Sequence[dict[str, Any]], *, worker_url: str) -> Encoded:
        return await self.encode_text(render_chat(messages), worker_url=worker_url)

    async def encode_text(self, text: str, *, worker_url: str) -> Encoded:
        return Encoded(None, text, max(1, len(text) // CHARS_PER_TOKEN_ESTIMATE))


class HFAdapter:
    """A local tokenizer directory, read once at start-up (no network)."""

    name = "hf"

    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(directory)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config: dict[str, Any] = {}
        if (path / "tokenizer_config.json").exists():
            config = json.loads((path / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # several named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        self._special = {
            k: (v.get("content") if isinstance(v, dict) else v)
            for k, v in config.items()
            if k in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self._template = None
        if template:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(template)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        if self._template is None:
            return render_chat(messages)
        return self._template.render(
            messages=list(messages), add_generation_prompt=True, **self._special
        )

    async def encode_chat(self, messages: Sequence[dict[str, Any]], *, worker_url: str) -> Encoded:
        # The template already holds any BOS, so (like vLLM) add no special tokens.
        ids = self.tokenizer.encode(self.render(messages), add_special_tokens=False).ids
        return Encoded(ids, None, len(ids))

    async def encode_text(self, text: str, *, worker_url: str) -> Encoded:
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        return Encoded(ids, None, len(ids))


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


class RemoteAdapter:
    """The worker's `/tokenize`, with an LRU cache keyed by the prompt's digest."""

    name = "remote"

    def __init__(self, *, client: httpx.AsyncClient, model: str, cache_size: int = 4096) -> None:
        self._client = client
        self._model = model
        self._cache: OrderedDict[bytes, Encoded] = OrderedDict()
        self._cache_size = cache_size

    async def _tokenize(self, body: dict[str, Any], *, worker_url: str) -> Encoded:
        digest = hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).digest()
        hit = self._cache.get(digest)
        if hit is not None:
            self._cache.move_to_end(digest)
            return hit
        resp = await self._client.post(
            f"{worker_url}/tokenize", json={"model": self._model, **body}
        )
        resp.raise_for_status()
        ids = resp.json()["tokens"]
        enc = Encoded(list(ids), None, len(ids))
        self._cache[digest] = enc
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return enc

    async def encode_chat(self, messages: Sequence[dict[str, Any]], *, worker_url: str) -> Encoded:
        return await self._tokenize({"messages": list(messages)}, worker_url=worker_url)

    async def encode_text(self, text: str, *, worker_url: str) -> Encoded:
        return await self._tokenize({"prompt": text}, worker_url=worker_url)


def build_adapter(spec: str, *, model: str, client: httpx.AsyncClient) -> TokenizerAdapter:
    """`builtin` | `hf:/dir` | `remote` | `text` | `text:N` -> an adapter; ValueError otherwise."""
    kind, _, arg = spec.partition(":")
    if kind == "builtin":
        return BuiltinAdapter()
    if kind == "text":
        return TextAdapter(block_chars=int(arg) if arg else 64)
    if kind == "hf":
        if not arg:
            raise ValueError(f"tokenizer spec {spec!r} needs a directory: hf:/path/to/tokenizer")
        return HFAdapter(arg)
    if kind == "remote":
        return RemoteAdapter(client=client, model=model)
    raise ValueError(f"unknown tokenizer adapter {spec!r} (builtin, hf:/dir, remote, text[:N])")
