"""The `builtin` tokenizer: deterministic, file-free, shared by the simulated engine and
the gateway's `builtin` tokenizer adapter.

Text is cut into regex pieces (a word with its leading space, a number, one punctuation
mark, a run of whitespace, or a `<|special|>` marker). A piece found in the small fixed
word table gets that table's id (so filler text the simulator generates decodes and
re-encodes exactly); any other piece gets a stable id from a seedless 64-bit xxhash,
identical in every process and replica. Ids are in `[0, BUILTIN_VOCAB_SIZE)`.

`builtin_decode` inverts the word table; hashed ids cannot be inverted and decode to a
visible placeholder (`" <id>"`), which is enough for a simulator whose output is filler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

BUILTIN_VOCAB_SIZE: int = 32_000

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|end|>",
)
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
_NUM_SPECIAL_SLOTS = 16

# Common English words: the simulator's filler output is drawn from these, and each is
# present with and without a leading space so generated text round-trips.
_WORDS: tuple[str, ...] = tuple(
    """the of and to a in is it that for you was with on as have be at by this are from
or not but what all were we when your can said there use an each which she do how their
if will up other about out many then them these so some her would make like him into
time has look two more write go see number no way could people my than first water been
call who oil its now find long down day did get come made may part over new sound take
only little work know place year live me back give most very after thing our just name
good sentence man think say great where help through much before line right too mean old
any same tell boy follow came want show also around form three small set put end does
another well large must big even such because turn here why ask went men read need land
different home us move try kind hand picture again change off play spell air away animal
house point page letter mother answer found study still learn should world high every
near add food between own below country plant last school father keep tree never start
city earth eye light thought head under story saw left few while along might close
something seem next hard open example begin life always those both paper together got
group often run important until children side feet car mile night walk white sea began
grow took river four carry state once book hear stop without second later miss idea
enough eat face watch far really almost let above girl sometimes mountain cut young talk
soon list song being leave family model cache token block route prefix worker engine""".split()  # noqa: SIM905
)
_PUNCT: tuple[str, ...] = tuple(".,;:!?'\"()[]{}-_/\\*&%$#@+=<>|~`^")
_DIGITS: tuple[str, ...] = tuple("0123456789")
_SPACES: tuple[str, ...] = (" ", "\n", "\n\n", "  ", "\t")

_TABLE: tuple[str, ...] = (
    SPECIAL_TOKENS
    + ("",) * (_NUM_SPECIAL_SLOTS - len(SPECIAL_TOKENS))
    + _WORDS
    + tuple(" " + w for w in _WORDS)
    + tuple(w.capitalize() for w in _WORDS)
    + tuple(" " + w.capitalize() for w in _WORDS)
    + _PUNCT
    + tuple(" " + p for p in _PUNCT)
    + _DIGITS
    + tuple(" " + d for d in _DIGITS)
    + _SPACES
)
_PIECE_TO_ID: dict[str, int] = {p: i for i, p in enumerate(_TABLE) if p}
_HASHED_BASE: int = len(_TABLE)
_HASHED_RANGE: int = BUILTIN_VOCAB_SIZE - _HASHED_BASE

# Ids the simulator may emit as filler output: the space-prefixed words, which render as
# readable text and re-encode to the same ids.
FILLER_TOKEN_IDS: tuple[int, ...] = tuple(_PIECE_TO_ID[" " + w] for w in _WORDS)

# Known specials are cut out first so "<|user|>" is always one piece; the rest is a word
# with an optional leading space, digits one at a time (like most LLM tokenizers), single
# punctuation, and whitespace runs.
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_PIECE_RE = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\w\s]| ?_|\s+(?!\S)|\s")


def _piece_id(piece: str) -> int:
    known = _PIECE_TO_ID.get(piece)
    if known is not None:
        return known
    return _HASHED_BASE + xxhash.xxh64_intdigest(piece.encode("utf-8")) % _HASHED_RANGE


def builtin_encode(text: str) -> list[int]:
    """Token ids of `text`; deterministic across processes, no BOS added.

    Invariant: every id is in `[0, BUILTIN_VOCAB_SIZE)`; the empty string encodes to [].
    """
    ids: list[int] = []
    for i, segment in enumerate(_SPECIAL_RE.split(text)):
        if i % 2:
            ids.append(_PIECE_TO_ID[segment])
        else:
            ids.extend(_piece_id(m.group(0)) for m in _PIECE_RE.finditer(segment))
    return ids


def builtin_decode(ids: Sequence[int]) -> str:
    """Text of `ids`: exact for table ids (filler output), `" <id>"` for hashed ids."""
    parts: list[str] = []
    for token_id in ids:
        if 0 <= token_id < _HASHED_BASE and _TABLE[token_id]:
            parts.append(_TABLE[token_id])
        else:
            parts.append(f" <{token_id}>")
    return "".join(parts)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        # OpenAI content parts: only text parts carry tokens for this tokenizer.
        texts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        ]
        return "".join(texts)
    return str(content)


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """The builtin chat template: `<|role|>\\n{content}<|end|>\\n` per message, then the
    assistant header so the model's reply starts after it.

    Identical messages render identically, so a conversation's history is a token prefix
    of its next turn (what prefix caching and prefix routing rely on).
    """
    out: list[str] = []
    for message in messages:
        role = str(message.get("role", "user"))
        if role not in ("system", "user", "assistant", "tool"):
            role = "user"
        out.append(f"<|{role}|>\n{_content_text(message.get('content'))}<|end|>\n")
    out.append("<|assistant|>\n")
    return "".join(out)
