"""The tiny model's tokenizer (the part that needs no torch): deterministic, offline,
byte-level (any text round-trips) and with the chat template the `hf` adapter renders."""

from __future__ import annotations

import asyncio
from pathlib import Path

from routing.gateway.tokenization import HFAdapter
from workers.tiny_model import EOS_TOKEN, MARKER_FILE, build, is_built


def test_tokenizer_build_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    build(first, weights=False)
    build(second, weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", MARKER_FILE):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert is_built(first, weights=False) and not is_built(first, weights=True)

    adapter = HFAdapter(first)
    text = "Grüße, naïve café: 3.14159 — tabs\tand\nnewlines ✓"
    ids = asyncio.run(adapter.encode_text(text, worker_url="")).token_ids
    assert ids is not None and adapter.tokenizer.decode(ids) == text
    assert max(ids) < adapter.tokenizer.get_vocab_size() <= 2048

    rendered = adapter.render(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert rendered == f"<|system|>\nbe brief{EOS_TOKEN}\n<|user|>\nhi{EOS_TOKEN}\n<|assistant|>\n"
    chat_ids = asyncio.run(
        adapter.encode_chat([{"role": "user", "content": "hi"}], worker_url="")
    ).token_ids
    # Role markers are single special tokens, and no BOS is added: the engine sees the same ids.
    assert chat_ids is not None and chat_ids[0] == adapter.tokenizer.token_to_id("<|user|>")
