"""One call from model facts + flags + memory to the capacity report `residency plan` prints."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from planner.budget import Reserves, ResidentBudget, compute_resident_budget
from planner.capacity import KVCapacity, compute_kv_capacity
from planner.errors import CapacityError
from planner.kv_layout import CacheSettings, KVLayout, build_kv_layout
from planner.memory import GpuMemoryEstimate
from planner.model_spec import ModelSpec


class CapacityPlan(BaseModel):
    """KV layout, capacity (central and band) and resident budget for one host."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    layout: KVLayout = Field(description="Pages, block size and groups.")
    capacity: KVCapacity = Field(description="At the central KV-bytes estimate.")
    capacity_low: KVCapacity | None = Field(
        default=None, description="At the low end of the memory estimate (GPU estimates only)."
    )
    capacity_high: KVCapacity | None = Field(
        default=None, description="At the high end of the memory estimate (GPU estimates only)."
    )
    budget: ResidentBudget = Field(description="Resident prefix budget.")


def _per_stage(estimates: Sequence[GpuMemoryEstimate], field: str) -> int | tuple[int, ...]:
    values = tuple(int(getattr(e, field)) for e in estimates)
    return values[0] if len(values) == 1 else values


def check_max_model_len(model: ModelSpec, max_model_len: int) -> None:
    """CapacityError when --max-model-len is above what the model's config allows: vLLM refuses
    to start with it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN, past which RoPE positions are NaN)."""
    limit = model.max_model_len_limit
    if limit is None or max_model_len <= limit:
        return
    scaled = (
        f" x RoPE factor {model.rope_scaling_factor:g}" if model.rope_scaling_factor != 1 else ""
    )
    raise CapacityError(
        f"--max-model-len {max_model_len} is above the model's limit of {limit} (config.json "
        f"max_position_embeddings {model.max_position_embeddings}{scaled}); vLLM refuses it: "
        f"lower --max-model-len to at most {limit}"
    )


def plan_capacity(
    model: ModelSpec,
    settings: CacheSettings,
    kv_memory: int | GpuMemoryEstimate | Sequence[GpuMemoryEstimate],
    reserves: Reserves,
    *,
    check_model_limit: bool = True,
) -> CapacityPlan:
    """Lay out the KV cache, size it from `kv_memory` (bytes per rank, a GPU estimate, or one
    estimate per pipeline stage) and derive the resident budget."""
    if check_model_limit:  # a running server's own window is a fact, not a request
        check_max_model_len(model, settings.max_model_len)
    layout = build_kv_layout(model, settings)
    length = settings.max_model_len
    low = high = None
    if isinstance(kv_memory, GpuMemoryEstimate):
        kv_memory = (kv_memory,)
    if isinstance(kv_memory, int):
        capacity = compute_kv_capacity(layout, kv_memory, length)
    else:
        capacity = compute_kv_capacity(
            layout, _per_stage(kv_memory, "kv_cache_memory_bytes"), length
        )
        if min(e.kv_cache_memory_bytes_low for e in kv_memory) > layout.bytes_per_block:
            low = compute_kv_capacity(
                layout, _per_stage(kv_memory, "kv_cache_memory_bytes_low"), length
            )
        high = compute_kv_capacity(
            layout, _per_stage(kv_memory, "kv_cache_memory_bytes_high"), length
        )
    budget = compute_resident_budget(
        max_model_len=length,
        kv_cache_tokens=capacity.kv_cache_tokens,
        block_size=layout.block_size,
        reserves=reserves,
        align_to_blocks=model.is_hybrid,
    )
    return CapacityPlan(
        layout=layout, capacity=capacity, capacity_low=low, capacity_high=high, budget=budget
    )
