"""GPU memory left for the KV cache under `--gpu-memory-utilization`, term by term.

vLLM (vllm/v1/worker/gpu_worker.py `determine_available_memory`, vllm/utils/mem_utils.py
`memory_profiling`) measures this at boot:

    available_kv = total x gpu_memory_utilization
                   - weights - peak activation (profile run) - non-torch increase
                   - CUDA-graph estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, default)

Only the weights are known before boot (safetensors sizes). The other terms are estimates with
a stated uncertainty; the planner carries a low/high band through to KV tokens. The CUDA context
itself exists before vLLM's first memory snapshot, so it eats the (1 - utilization) headroom,
not the KV cache. `--kv-cache-memory-bytes` bypasses all of this, as in vLLM.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import CapacityError
from planner.model_spec import ModelSpec
from planner.units import DTYPE_BYTES, GiB, MiB, format_gib


class MemoryTerm(BaseModel):
    """One term subtracted from the requested memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="What the memory holds.")
    bytes: int = Field(ge=0, description="Central estimate, bytes.")
    uncertainty_bytes: int = Field(ge=0, description="Plus/minus band of the estimate, bytes.")
    source: str = Field(description="Where the number comes from.")


class GpuMemoryEstimate(BaseModel):
    """The KV-cache bytes a GPU leaves for one model, with the terms that decide it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_memory_bytes: int = Field(ge=1, description="Device memory as CUDA reports it.")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="--gpu-memory-utilization.")
    requested_memory_bytes: int = Field(ge=0, description="total x utilization.")
    terms: tuple[MemoryTerm, ...] = Field(description="Non-KV memory, term by term.")
    kv_cache_memory_bytes: int = Field(description="Central estimate of KV bytes.")
    kv_cache_memory_bytes_low: int = Field(description="KV bytes if every term is at its high.")
    kv_cache_memory_bytes_high: int = Field(description="KV bytes if every term is at its low.")


def estimate_activation_peak_bytes(
    model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Heuristic peak of vLLM's profile run: one chunk of `max_num_batched_tokens` through the
    widest layer (MLP gate+up, residual and attention buffers) plus the sampler's float32 logits
    and probabilities for `max_num_seqs` requests."""
    act = DTYPE_BYTES["bfloat16"] if model.dtype == "float32" else DTYPE_BYTES[model.dtype]
    mlp = (model.intermediate_size or 4 * model.hidden_size) * 2
    per_token = (mlp + 8 * model.hidden_size) * act
    sampler = max_num_seqs * model.vocab_size * 4 * 2
    return max_num_batched_tokens * per_token + sampler


def estimate_gpu_kv_memory(
    *,
    total_memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    weights_source: str,
    model: ModelSpec,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enforce_eager: bool = False,
) -> GpuMemoryEstimate:
    """KV bytes left on one GPU; `CapacityError` when the weights alone do not fit."""
    if not 0 < gpu_memory_utilization <= 1:
        raise CapacityError(
            f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    requested = int(total_memory_bytes * gpu_memory_utilization)
    if weights_bytes >= requested:
        need = math.ceil(weights_bytes / total_memory_bytes * 100) / 100
        hint = (
            f"; --gpu-memory-utilization {need:.2f} is the least that holds them"
            if need < 1
            else "; the model does not fit on this GPU: pick a smaller or quantized model"
        )
        raise CapacityError(
            f"model weights take {format_gib(weights_bytes)} GiB but --gpu-memory-utilization "
            f"{gpu_memory_utilization} of {format_gib(total_memory_bytes)} GiB allows only "
            f"{format_gib(requested)} GiB{hint}"
        )
    activation = estimate_activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs)
    terms = (
        MemoryTerm(
            name="weights",
            bytes=weights_bytes,
            uncertainty_bytes=0,
            source=weights_source,
        ),
        MemoryTerm(
            name="peak activation (profile run)",
            bytes=activation,
            uncertainty_bytes=activation // 2,
            source="estimate: max_num_batched_tokens x widest layer + sampler logits; vLLM "
            "measures it in gpu_worker.py determine_available_memory (profile_run)",
        ),
        MemoryTerm(
            name="non-torch increase (cuBLAS/NCCL workspaces)",
            bytes=200 * MiB,
            uncertainty_bytes=150 * MiB,
            source="typical value; vLLM measures it in mem_utils.py memory_profiling",
        ),
        MemoryTerm(
            name="CUDA-graph estimate",
            bytes=0 if enforce_eager else GiB // 4,
            uncertainty_bytes=0 if enforce_eager else GiB // 4,
            source="typical value (0 with --enforce-eager); vLLM measures it in "
            "profile_cudagraph_memory when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1",
        ),
    )
    central = requested - sum(t.bytes for t in terms)
    band = sum(t.uncertainty_bytes for t in terms)
    return GpuMemoryEstimate(
        total_memory_bytes=total_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_memory_bytes=requested,
        terms=terms,
        kv_cache_memory_bytes=central,
        kv_cache_memory_bytes_low=central - band,
        kv_cache_memory_bytes_high=central + band,
    )
