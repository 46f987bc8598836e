from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from routing.core.tokenizer import (
    BUILTIN_VOCAB_SIZE,
    EOS_ID,
    FILLER_TOKEN_IDS,
    builtin_decode,
    builtin_encode,
    render_chat,
)


def test_known_words_round_trip_and_specials_are_single_tokens() -> None:
    text = "<|user|>\nthe cache is 42, right?<|end|>"
    ids = builtin_encode(text)
    assert builtin_decode(ids) == text
    assert ids.count(builtin_encode("<|user|>")[0]) == 1
    assert builtin_encode("<|eos|>") == [EOS_ID]


def test_filler_tokens_decode_and_reencode_exactly() -> None:
    ids = list(FILLER_TOKEN_IDS[:50])
    assert builtin_encode(builtin_decode(ids)) == ids


def test_ids_are_stable_across_processes() -> None:
    text = "Zebra-striped quokkas élan 😀 1234"
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from routing.core.tokenizer import builtin_encode as e; print(e({text!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[3],
    ).stdout.strip()
    assert other == str(builtin_encode(text))


def test_shared_text_prefix_gives_shared_token_prefix() -> None:
    system = "You are a helpful assistant. Answer briefly and cite the docs.\n"
    a = builtin_encode(system + "What is a KV cache?")
    b = builtin_encode(system + "Why route by prefix?")
    shared = builtin_encode(system)
    assert a[: len(shared)] == shared == b[: len(shared)]


def test_chat_history_is_a_prefix_of_the_next_turn() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    r1, r2 = render_chat(turn1), render_chat(turn2)
    assert r1.endswith("<|assistant|>\n")
    assert r2.startswith(r1.removesuffix("<|assistant|>\n"))
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert render_chat(parts) == render_chat([{"role": "user", "content": "hi"}])


@given(st.text(max_size=200))
def test_every_id_is_in_the_vocabulary(text: str) -> None:
    ids = builtin_encode(text)
    assert all(0 <= i < BUILTIN_VOCAB_SIZE for i in ids)
    assert (len(ids) == 0) == (text == "")
