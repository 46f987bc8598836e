"""Chained block keys: prefix sharing, full blocks only, and the same keys in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.blocks import ROOT_KEY, chain_key, text_block_keys, token_block_keys
from tests.routing.core.conftest import make_tokens

REPO_ROOT = Path(__file__).resolve().parents[3]

token_lists = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=80)


def test_each_key_chains_on_the_previous_block_key() -> None:
    tokens = make_tokens(48)
    keys = token_block_keys(tokens, 16)
    assert keys == (
        chain_key(ROOT_KEY, tokens[0:16]),
        chain_key(keys[0], tokens[16:32]),
        chain_key(keys[1], tokens[32:48]),
    )
    assert all(0 <= k < 2**64 for k in keys)


def test_known_answer_pins_the_key_function() -> None:
    # Changing the hash, packing or root would silently split every deployed index; this
    # literal was computed once from the implementation and must only change on purpose.
    assert token_block_keys(list(range(32)), 16) == (
        6166684700553993718,
        16519427889063326364,
    )
    assert text_block_keys("You are a helpful assistant.", 8) == (
        10786656481321181442,
        6094257929908486864,
        16622182127827436161,
    )


def test_partial_last_block_gets_no_key() -> None:
    tokens = make_tokens(16 * 3 + 15)
    assert len(token_block_keys(tokens, 16)) == 3
    assert token_block_keys(tokens, 16) == token_block_keys(tokens[:48], 16)
    assert token_block_keys(tokens[:15], 16) == ()


def test_parent_continues_a_chain() -> None:
    tokens = make_tokens(64)
    keys = token_block_keys(tokens, 16)
    assert token_block_keys(tokens[32:], 16, parent=keys[1]) == keys[2:]


def test_list_tuple_and_array_inputs_give_the_same_keys() -> None:
    tokens = make_tokens(40)
    expected = token_block_keys(tokens, 8)
    assert token_block_keys(tuple(tokens), 8) == expected
    assert token_block_keys(array("I", tokens), 8) == expected
    assert token_block_keys(range(40), 8) == token_block_keys(list(range(40)), 8)


def test_block_size_changes_the_keys() -> None:
    tokens = make_tokens(64)
    assert token_block_keys(tokens, 16)[1] != token_block_keys(tokens, 32)[0]


@pytest.mark.parametrize("bad", [[-1], [2**32], ["7"], [1.5]])
def test_token_ids_outside_uint32_are_rejected(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        token_block_keys([1] * 15 + bad, 16)  # type: ignore[operator]


@pytest.mark.parametrize("size", [0, -16])
def test_block_size_must_be_positive(size: int) -> None:
    with pytest.raises(ValueError, match="block_size"):
        token_block_keys([1, 2, 3], size)
    with pytest.raises(ValueError, match="block_chars"):
        text_block_keys("abc", size)


@settings(max_examples=40, deadline=None)
@given(common=token_lists, left=token_lists, right=token_lists, block=st.integers(1, 9))
def test_keys_agree_exactly_on_shared_full_blocks(
    common: list[int], left: list[int], right: list[int], block: int
) -> None:
    a, b = common + left, common + right
    keys_a, keys_b = token_block_keys(a, block), token_block_keys(b, block)
    shared_blocks = 0
    while (shared_blocks + 1) * block <= min(len(a), len(b)) and (
        a[shared_blocks * block : (shared_blocks + 1) * block]
        == b[shared_blocks * block : (shared_blocks + 1) * block]
    ):
        shared_blocks += 1
    assert keys_a[:shared_blocks] == keys_b[:shared_blocks]
    # the first differing block differs in key, and so does every block after it
    for i in range(shared_blocks, min(len(keys_a), len(keys_b))):
        assert keys_a[i] != keys_b[i]


def test_text_keys_full_blocks_and_prefix_sharing() -> None:
    system = "Tu es un assistant précis. 日本語も話せます。" * 3
    keys_a = text_block_keys(system + " Question A?", 16)
    keys_b = text_block_keys(system + " Another question", 16)
    assert len(keys_a) == len(system + " Question A?") // 16
    shared = len(system) // 16
    assert keys_a[:shared] == keys_b[:shared]
    assert keys_a[shared] != keys_b[shared]
    assert text_block_keys("short", 16) == ()


def test_keys_are_identical_in_a_process_with_another_hash_seed() -> None:
    tokens = make_tokens(100, seed=3)
    text = "shared system prompt " * 5
    script = (
        "import json, sys\n"
        "from routing.core.blocks import token_block_keys, text_block_keys\n"
        "data = json.load(sys.stdin)\n"
        "print(json.dumps([token_block_keys(data['t'], 16), text_block_keys(data['s'], 8)]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps({"t": tokens, "s": text}),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        check=True,
        timeout=30,
    )
    other_tokens, other_text = json.loads(done.stdout)
    assert tuple(other_tokens) == token_block_keys(tokens, 16)
    assert tuple(other_text) == text_block_keys(text, 8)
