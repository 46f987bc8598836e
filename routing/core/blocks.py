"""Chained block keys: a prompt becomes the keys of its full blocks.

Block ``i`` of a prompt has key ``key_i = H(key_{i-1}, tokens_i)`` with ``key_{-1} = ROOT_KEY``,
so two prompts share key ``i`` exactly when they share their first ``i + 1`` blocks (up to
64-bit hash collisions). ``H`` is xxh3-64 of the block's token ids packed as unsigned 32-bit
little-endian integers, seeded with the parent key. The hash has no per-process salt (unlike
Python's ``hash``), so every gateway replica, the simulated engine and offline replays compute
the same keys on any machine.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from xxhash import xxh3_64_intdigest

__all__ = ["ROOT_KEY", "chain_key", "text_block_keys", "token_block_keys"]

# A fixed, arbitrary non-zero parent for block 0 (xxh3-64 of b"kvroute/root/v1"); pinned as a
# literal so that the key space can only change by editing this line.
ROOT_KEY: int = 0x51380E23927CB977

_TOKEN_BYTES = 4
_UINT32 = "I" if array("I").itemsize == _TOKEN_BYTES else "L"
_BIG_ENDIAN_HOST = sys.byteorder == "big"


def _pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes; raises ValueError outside [0, 2**32)."""
    try:
        if type(tokens) is list:
            packed = array(_UINT32)
            packed.fromlist(tokens)  # the fastest conversion, and lists are the common input
        else:
            packed = array(_UINT32, tokens)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
    if _BIG_ENDIAN_HOST:  # pragma: no cover - keys must not depend on the host's byte order
        packed.byteswap()
    return packed.tobytes()


def _chain_keys(buf: bytes, *, step: int, parent: int) -> tuple[int, ...]:
    """Chained xxh3-64 keys of the consecutive ``step``-byte blocks of ``buf`` (whole blocks)."""
    keys: list[int] = []
    append = keys.append
    key = parent
    for offset in range(0, len(buf), step):
        key = xxh3_64_intdigest(buf[offset : offset + step], key)
        append(key)
    return tuple(keys)


def chain_key(parent: int, tokens: Sequence[int]) -> int:
    """Key (unsigned 64-bit) of one block of ``tokens`` whose preceding block has key ``parent``."""
    return xxh3_64_intdigest(_pack_tokens(tokens), parent)


def token_block_keys(
    tokens: Sequence[int], block_size: int, *, parent: int = ROOT_KEY
) -> tuple[int, ...]:
    """Chained keys of the full ``block_size``-token blocks of ``tokens``.

    A partial last block gets no key (an engine caches only full blocks). ``parent`` is the key of
    the block before ``tokens[0]`` (``ROOT_KEY`` for a prompt's start). Its cost per prompt size
    is measured by ``bench/core_bench.py`` (the ``hashing`` table in BENCHMARKS.md).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    full_blocks = len(tokens) // block_size
    if full_blocks == 0:
        return ()
    buf = _pack_tokens(
        tokens if len(tokens) == full_blocks * block_size else tokens[: full_blocks * block_size]
    )
    return _chain_keys(buf, step=block_size * _TOKEN_BYTES, parent=parent)


def text_block_keys(text: str, block_chars: int, *, parent: int = ROOT_KEY) -> tuple[int, ...]:
    """Chained keys of the full ``block_chars``-character blocks of ``text``.

    For models served without a tokenizer: each block is hashed as UTF-32-LE (fixed width, so a
    block boundary never splits a character) seeded with its parent key; a partial last block gets
    no key.
    """
    if block_chars <= 0:
        raise ValueError(f"block_chars must be positive, got {block_chars}")
    full_blocks = len(text) // block_chars
    if full_blocks == 0:
        return ()
    buf = text[: full_blocks * block_chars].encode("utf-32-le", "surrogatepass")
    return _chain_keys(buf, step=block_chars * 4, parent=parent)
