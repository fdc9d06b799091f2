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

Tensor and pipeline parallel: every rank (one GPU each) runs this on its own device. A rank holds
1/TP of its stage's layers' weights, plus 1/TP of the input embedding on the first stage and of
the output head on the last (vocab-parallel; a tied head is a copy on the last stage when PP > 1);
its MLP activations are 1/TP wide; the sampler runs on the last stage only. vLLM then gives every
rank the smallest rank's block count (planner/parallel.py).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import CapacityError
from planner.model_spec import ModelSpec
from planner.units import DTYPE_BYTES, GiB, MiB, format_gib


class MemoryTerm(BaseModel):
    """One term subtracted from the requested memory."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(description="What the memory holds.")
    bytes: int = Field(ge=0, description="Central estimate, bytes.")
    uncertainty_bytes: int = Field(ge=0, description="Plus/minus band of the estimate, bytes.")
    source: str = Field(description="Where the number comes from.")


class GpuMemoryEstimate(BaseModel):
    """The KV-cache bytes a GPU leaves for one model, with the terms that decide it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    total_memory_bytes: int = Field(ge=1, description="Device memory as CUDA reports it.")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="--gpu-memory-utilization.")
    requested_memory_bytes: int = Field(ge=0, description="total x utilization.")
    terms: tuple[MemoryTerm, ...] = Field(description="Non-KV memory, term by term.")
    kv_cache_memory_bytes: int = Field(description="Central estimate of KV bytes.")
    kv_cache_memory_bytes_low: int = Field(description="KV bytes if every term is at its high.")
    kv_cache_memory_bytes_high: int = Field(description="KV bytes if every term is at its low.")
    pipeline_stage: int = Field(default=0, ge=0, description="Pipeline stage of this rank.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="Ranks of this stage.")
    layers: tuple[int, int] | None = Field(
        default=None, description="Decoder layers [start, end) this rank holds (PP only)."
    )


def estimate_activation_peak_bytes(
    model: ModelSpec,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tensor_parallel_size: int = 1,
    last_stage: bool = True,
) -> int:
    """Heuristic peak of vLLM's profile run: one chunk of `max_num_batched_tokens` through the
    widest layer (MLP gate+up split over the TP ranks, residual and attention buffers) plus, on
    the last pipeline stage, the sampler's float32 logits and probabilities for `max_num_seqs`
    requests."""
    act = DTYPE_BYTES["bfloat16"] if model.dtype == "float32" else DTYPE_BYTES[model.dtype]
    mlp = (model.intermediate_size or 4 * model.hidden_size) * 2 // tensor_parallel_size
    per_token = (mlp + 8 * model.hidden_size) * act
    sampler = max_num_seqs * model.vocab_size * 4 * 2 if last_stage else 0
    return max_num_batched_tokens * per_token + sampler


def rank_weights_bytes(
    model: ModelSpec,
    weights_bytes: int,
    tensor_parallel_size: int = 1,
    stage: range | None = None,
) -> int:
    """One rank's share of `weights_bytes`: its stage's decoder layers and, on the first / last
    stage, the input embedding / output head, all split over the TP ranks.

    Worked example (Llama-3.1-8B, 16,060,522,496 B, TP=2, one stage): every rank holds half,
    8,030,261,248 B. With PP=2 instead, stage 0 holds the embedding (128,256 x 4,096 x 2 B =
    1,050,673,152 B) and 16 of 32 layers, stage 1 the other 16 and the untied head.
    """
    layers = model.num_hidden_layers
    stage = stage if stage is not None else range(layers)
    if len(stage) == layers:
        return weights_bytes // tensor_parallel_size
    act = DTYPE_BYTES["bfloat16"] if model.dtype == "float32" else DTYPE_BYTES[model.dtype]
    embed = model.vocab_size * model.hidden_size * act
    heads = embed if model.tie_word_embeddings else 2 * embed
    body = max(weights_bytes - heads, 0)
    share = body * len(stage) // layers
    if stage.start == 0:
        share += embed
    if stage.stop == layers:
        share += embed  # the output head (a copy when tied and PP > 1)
    return share // tensor_parallel_size


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
    tensor_parallel_size: int = 1,
    pipeline_stage: int = 0,
    stage: range | None = None,
) -> GpuMemoryEstimate:
    """KV bytes left on one GPU (one rank); `CapacityError` when the weights alone do not fit.
    `weights_bytes` is the whole model's; the rank's share is taken here."""
    full_weights = weights_bytes
    weights_bytes = rank_weights_bytes(model, full_weights, tensor_parallel_size, stage)
    last_stage = stage is None or stage.stop == model.num_hidden_layers
    if not 0 < gpu_memory_utilization <= 1:
        raise CapacityError(
            f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    # vllm/v1/worker/utils.py `request_memory`: math.ceil(total x utilization).
    requested = math.ceil(total_memory_bytes * gpu_memory_utilization)
    _refuse_unless_weights_fit(
        weights_bytes,
        full_weights,
        requested,
        total_memory_bytes,
        gpu_memory_utilization,
        pipeline_stage,
    )
    activation = estimate_activation_peak_bytes(
        model, max_num_batched_tokens, max_num_seqs, tensor_parallel_size, last_stage
    )
    split = stage is not None and len(stage) < model.num_hidden_layers
    terms = _memory_terms(
        weights_bytes,
        full_weights,
        weights_source,
        activation,
        enforce_eager,
        tensor_parallel_size,
        stage if split else None,
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
        pipeline_stage=pipeline_stage,
        tensor_parallel_size=tensor_parallel_size,
        layers=(stage.start, stage.stop) if split and stage is not None else None,
    )


def _refuse_unless_weights_fit(
    weights_bytes: int,
    full_weights: int,
    requested: int,
    total_memory_bytes: int,
    gpu_memory_utilization: float,
    pipeline_stage: int,
) -> None:
    """`CapacityError` when the rank's weights alone take the requested memory, with the least
    --gpu-memory-utilization that holds them."""
    if weights_bytes < requested:
        return
    need = math.ceil(weights_bytes / total_memory_bytes * 100) / 100
    hint = (
        f"; --gpu-memory-utilization {need:.2f} is the least that holds them"
        if need < 1
        else "; the model does not fit on this GPU: pick a smaller or quantized model"
    )
    if weights_bytes == full_weights:
        what = "model weights take"
    else:
        what = f"one rank's share of the weights (stage {pipeline_stage}) takes"
        hint += "; or raise --tensor-parallel-size / --pipeline-parallel-size"
    raise CapacityError(
        f"{what} {format_gib(weights_bytes)} GiB but --gpu-memory-utilization "
        f"{gpu_memory_utilization} of {format_gib(total_memory_bytes)} GiB allows only "
        f"{format_gib(requested)} GiB{hint}"
    )


def _memory_terms(
    weights_bytes: int,
    full_weights: int,
    weights_source: str,
    activation: int,
    enforce_eager: bool,
    tensor_parallel_size: int,
    stage: range | None,
) -> tuple[MemoryTerm, ...]:
    """What vLLM takes from the requested memory before the KV cache, with the uncertainty of
    each term (`stage`: this rank's layers where the model is split across stages)."""
    weights_note = (
        weights_source
        if weights_bytes == full_weights
        else f"{weights_source}; this rank's share (TP {tensor_parallel_size}"
        + (f", layers {stage.start}-{stage.stop - 1}" if stage is not None else "")
        + "), estimated from the layer count"
    )
    return (
        MemoryTerm(
            name="weights",
            bytes=weights_bytes,
            uncertainty_bytes=0 if weights_bytes == full_weights else weights_bytes // 50,
            source=weights_note,
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
