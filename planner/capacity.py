"""KV-cache blocks, tokens and concurrency from KV bytes, mirroring vLLM v1's engine start.

Sources (vLLM 0.32, vllm/v1/core/kv_cache_utils.py):
- `get_kv_cache_config_from_groups`: num_blocks = available_bytes // bytes_per_block.
- `get_max_concurrency_for_kv_cache_config`: concurrency = num_blocks / sum over groups of the
  blocks one request at max_model_len holds.
- `get_kv_cache_capacity`: kv_cache_size_tokens = int(concurrency x max_model_len), the number
  logged as "GPU KV cache size: N tokens" and exported in `vllm:cache_config_info`.
- `get_kv_cache_configs` / `_check_enough_kv_cache_memory`: one block is the null block, and
  one request at max_model_len must fit ("To serve at least one request ...").

Worked example (dense, block 16, max_model_len 1000): 100 blocks, a request needs
cdiv(1000, 16) = 63 blocks, concurrency 100 / 63 = 1.587, KV tokens int(1587.3) = 1587 (not
100 x 16 = 1600: a request's last block is never full).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import CapacityError
from planner.kv_layout import KVLayout
from planner.units import cdiv, format_gib


class KVCapacity(BaseModel):
    """What vLLM will report for a KV layout and a number of KV bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kv_cache_memory_bytes: int = Field(ge=0, description="Bytes given to the KV cache.")
    num_blocks: int = Field(ge=0, description="vLLM num_gpu_blocks.")
    kv_cache_tokens: int = Field(ge=0, description="vLLM kv_cache_size_tokens.")
    max_concurrency: float = Field(
        ge=0, description="Requests of max_model_len tokens that fit at once."
    )
    max_model_len: int = Field(ge=1, description="--max-model-len the capacity refers to.")
    one_request_bytes: int = Field(ge=0, description="KV bytes one max_model_len request needs.")
    stage_num_blocks: tuple[int, ...] = Field(
        default=(),
        description="Pipeline parallel: the blocks each stage's memory holds before vLLM gives "
        "every stage the smallest count.",
    )


def _one_request_bytes(layout: KVLayout) -> int:
    # `_max_memory_usage_bytes_from_groups`: every group draws whole blocks from one pool.
    return layout.bytes_per_block * layout.blocks_per_request


def compute_kv_capacity(
    layout: KVLayout, kv_cache_memory_bytes: int | Sequence[int], max_model_len: int
) -> KVCapacity:
    """Blocks, tokens and concurrency vLLM derives from `kv_cache_memory_bytes` (per rank: one
    number for every rank, or one per pipeline stage).

    Raises `CapacityError` when one request at max_model_len does not fit, like vLLM does.
    """
    if not isinstance(kv_cache_memory_bytes, int):
        return _staged_capacity(layout, tuple(kv_cache_memory_bytes), max_model_len)
    if kv_cache_memory_bytes <= 0:
        raise CapacityError(
            f"no memory is left for the KV cache ({format_gib(kv_cache_memory_bytes)} GiB); "
            "raise --gpu-memory-utilization or use a smaller model"
        )
    num_blocks = kv_cache_memory_bytes // layout.bytes_per_block
    needed = _one_request_bytes(layout)
    usable = kv_cache_memory_bytes - layout.bytes_per_block  # the null block
    if needed > usable:
        at_least = needed + layout.bytes_per_block
        if usable < layout.bytes_per_block:  # not even one block besides vLLM's null block
            raise CapacityError(
                f"a KV cache of {kv_cache_memory_bytes:,} bytes holds no block: one takes "
                f"{layout.bytes_per_block:,} bytes, and one request of --max-model-len "
                f"{max_model_len} needs {at_least:,} bytes ({format_gib(at_least)} GiB) with "
                "vLLM's null block; raise --kv-cache-memory-bytes (or --gpu-memory-utilization) "
                f"to at least {at_least:,}"
            )
        fits_len = max_len_that_fits(layout, usable, max_model_len)
        hint = f"; at most --max-model-len {fits_len} fits" if fits_len > 0 else ""
        raise CapacityError(
            f"to serve one request of --max-model-len {max_model_len} the KV cache needs "
            f"{format_gib(needed)} GiB but only {format_gib(usable)} GiB is available{hint}; "
            "raise --gpu-memory-utilization (or --kv-cache-memory-bytes) or lower --max-model-len"
        )
    concurrency = num_blocks / layout.blocks_per_request
    return KVCapacity(
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        num_blocks=num_blocks,
        kv_cache_tokens=int(concurrency * max_model_len),
        max_concurrency=concurrency,
        max_model_len=max_model_len,
        one_request_bytes=needed,
    )


def _staged_capacity(
    layout: KVLayout, stage_bytes: tuple[int, ...], max_model_len: int
) -> KVCapacity:
    """Pipeline stages with their own memory: each stage sizes its pool from its own bytes and
    layers, then every stage gets the smallest count (kv_cache_utils.py `get_kv_cache_configs`,
    "Change the num_blocks of each rank to the smallest among all ranks")."""
    divisors = layout.stage_bytes_per_block or (layout.bytes_per_block,)
    if len(stage_bytes) != len(divisors):
        raise CapacityError(
            f"{len(stage_bytes)} KV-memory figures for {len(divisors)} pipeline stages"
        )
    per_stage = [
        compute_kv_capacity(layout.model_copy(update={"bytes_per_block": bpb}), kv, max_model_len)
        for kv, bpb in zip(stage_bytes, divisors, strict=True)
    ]
    binding = min(per_stage, key=lambda c: c.num_blocks)
    return binding.model_copy(update={"stage_num_blocks": tuple(c.num_blocks for c in per_stage)})


def max_len_that_fits(layout: KVLayout, usable_bytes: int, max_model_len: int) -> int:
    """Binary search for the longest request whose blocks fit in `usable_bytes`
    (kv_cache_utils.py `_estimate_max_model_len_from_groups`); 0 if not even one token."""

    def fits(length: int) -> bool:
        blocks = 0
        for g in layout.groups:
            if g.kind == "full_attention":
                blocks += cdiv(length, g.block_size)
            elif g.kind == "sliding_attention":
                blocks += min(g.blocks_per_request, cdiv(length, g.block_size) + 1)
            else:
                blocks += g.blocks_per_request
        return blocks * layout.bytes_per_block <= usable_bytes

    lo, hi, best = 1, max_model_len, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
