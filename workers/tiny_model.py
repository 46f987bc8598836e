"""A tiny random-weight Llama and its tokenizer, built offline and deterministically.

`python -m workers.tiny_model DIR` writes a directory that real vLLM (the CPU build) can
serve and that the gateway's `hf` tokenizer adapter can load: `config.json`, bf16
`model.safetensors` (hidden 128, 2 layers, 2 heads, 1 KV head), a byte-level BPE
`tokenizer.json` trained with the `tokenizers` package on text generated here from a
fixed seed, `tokenizer_config.json` with a chat template (also as `chat_template.jinja`).

Nothing is downloaded. The tokenizer needs only `tokenizers`; the weights need `torch`
and `transformers`, which live in the vLLM venv (`.venv-vllm`), so those imports are
lazy and the module imports anywhere. The same seed gives the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SEED = 20261129
VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 4096
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|end|>"
PAD_TOKEN = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)
# No BOS is added automatically: a prompt's token ids are exactly the encoding of its
# text, so the gateway's `hf` adapter and the engine count the same blocks.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
MARKER_FILE = "kvroute_tiny_model.json"

_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w")
_ONSETS += ("br", "ch", "cl", "dr", "gr", "pl", "qu", "sh", "st", "th", "tr", "wh")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "ck", "rt")


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Shape of the tiny model; the defaults are what the `vllm` test tier serves."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    vocab_size: int = VOCAB_SIZE
    max_position_embeddings: int = MAX_POSITION_EMBEDDINGS
    seed: int = SEED


def corpus_lines(*, seed: int = SEED, n_lines: int = 12000) -> list[str]:
    """Deterministic English-like text (pseudo-words, numbers, punctuation, code-ish lines)."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < 4000:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
            for _ in range(rng.choice((1, 1, 2, 2, 2, 3)))
        )
        if word and word not in seen:
            seen.add(word)
            words.append(word)
    # Zipf-like weights so frequent words become single tokens, as in natural text.
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 10
        n_words = rng.randint(4, 18)
        chosen = rng.choices(words, weights=weights, k=n_words)
        if kind == 9:
            name = "_".join(chosen[:2])
            lines.append(f"def {name}({chosen[2]}, {chosen[3]}={rng.randint(0, 999)}):")
            lines.append(f"    return {chosen[2]} + {rng.random():.3f}")
            continue
        sentence = " ".join(chosen)
        if kind == 3:
            sentence += f" {rng.randint(0, 100000)}"
        punct = rng.choice((".", ".", ".", "?", "!", ",", ";", ":"))
        lines.append(sentence[0].upper() + sentence[1:] + punct)
    return lines


def build_tokenizer(out_dir: Path, *, spec: TinyModelSpec = TinyModelSpec()) -> int:
    """Train and write the byte-level BPE tokenizer files; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus_lines(seed=spec.seed), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.max_position_embeddings,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tokenizer.token_to_id(tok)): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tok in SPECIAL_TOKENS
        },
    }
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out_dir / "special_tokens_map.json",
        {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN},
    )
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return int(tokenizer.get_vocab_size())


def build_weights(out_dir: Path, *, vocab_size: int, spec: TinyModelSpec = TinyModelSpec()) -> None:
    """Write config.json and bf16 random weights (needs torch and transformers)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tok.token_to_id(BOS_TOKEN),
        eos_token_id=tok.token_to_id(EOS_TOKEN),
        pad_token_id=tok.token_to_id(PAD_TOKEN),
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build(out_dir: Path, *, spec: TinyModelSpec = TinyModelSpec(), weights: bool = True) -> Path:
    """Build the whole model directory (tokenizer, and weights unless `weights` is False)."""
    out_dir = Path(out_dir)
    vocab_size = build_tokenizer(out_dir, spec=spec)
    if weights:
        build_weights(out_dir, vocab_size=vocab_size, spec=spec)
    _write_json(
        out_dir / MARKER_FILE,
        {
            "builder": "workers.tiny_model",
            "seed": spec.seed,
            "vocab_size": vocab_size,
            "weights": weights,
        },
    )
    return out_dir


def is_built(out_dir: Path, *, weights: bool = True) -> bool:
    """Whether `out_dir` already holds a finished build (the marker is written last)."""
    marker = Path(out_dir) / MARKER_FILE
    if not marker.exists():
        return False
    data = json.loads(marker.read_text(encoding="utf-8"))
    return data.get("seed") == SEED and (data.get("weights") or not weights)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.tiny_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path, help="directory to write the model into")
    parser.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="write only the tokenizer files (no torch needed)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args(argv)
    weights = not args.tokenizer_only
    if not args.force and is_built(args.out_dir, weights=weights):
        print(f"tiny model already built in {args.out_dir}")
        return 0
    start_s = time.monotonic()
    build(args.out_dir, weights=weights)
    print(f"tiny model written to {args.out_dir} in {time.monotonic() - start_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
