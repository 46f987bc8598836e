from __future__ import annotations

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


def test_ids_are_pinned_so_every_process_and_version_agrees() -> None:
    # Seedless xxhash, not Python's hash(): these values must never change, or a gateway
    # and a worker running different builds would disagree on every prompt's blocks.
    assert builtin_encode("Zebra-striped quokkas élan 😀 1234") == [
        1410, 1218, 6800, 25445, 5101, 21904, 1279, 1270, 1271, 1272,
    ]  # fmt: skip


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
