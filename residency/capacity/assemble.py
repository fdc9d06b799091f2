"""The capacity report's model, and how it is put together: the request's cache flags resolved
(AVX512-BF16, vLLM's batch defaults), the inputs with their sources, and the planner's plan turned
into a `CapacityReport`. Shared by the planned report (`report`) and the server's (`server`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner import CacheSettings, CapacityPlan, GpuMemoryEstimate, Reserves
from planner.batch_defaults import BatchDefaults, vllm_batch_defaults
from residency.capacity.gpu import LiveGpu
from residency.capacity.profiles import ResolvedModel
from residency.capacity.ranks import HostGpus
from residency.capacity.request import CapacityRequest
from residency.machine import cpu_flags


class CapacityInputs(BaseModel):
    """The inputs a report was computed from, with their sources."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    model: str = Field(description="Model profile or path.")
    model_config_source: str = Field(description="Where the config facts come from.")
    architecture: str = Field(description="Model architecture.")
    attention_layers: int = Field(ge=0, description="Layers that hold KV.")
    linear_attention_layers: int = Field(ge=0, description="Gated DeltaNet layers.")
    gpu: str | None = Field(default=None, description="GPU profile, live device, or None.")
    total_memory_bytes: int | None = Field(default=None, description="Device memory.")
    devices: tuple[LiveGpu, ...] = Field(
        default=(), description="--gpu auto: every device CUDA_VISIBLE_DEVICES shows (NVML)."
    )
    used_devices: tuple[int, ...] = Field(
        default=(), description="--gpu auto: CUDA indices of the devices the plan runs on."
    )
    kv_memory_source: str = Field(description="How the KV bytes were obtained.")
    server: str | None = Field(default=None, description="--server URL, if any.")
    settings: CacheSettings = Field(description="vLLM flags the layout used.")
    cpu_avx512_bf16_source: str | None = Field(
        default=None,
        description="Whether the serving CPU has AVX512-BF16 and how that is known (CPU "
        "platform, hybrid models: it decides vLLM's GDN SSM state dtype).",
    )
    reserves: Reserves = Field(description="Per-request reserves and concurrency.")


class ServerComparison(BaseModel):
    """vLLM's own numbers beside the planner's prediction."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    served_model: str = Field(description="Model id the server serves.")
    max_model_len: int = Field(description="The server's max_model_len.")
    block_size: int = Field(description="vLLM block_size.")
    num_blocks: int = Field(description="vLLM num_gpu_blocks.")
    kv_cache_tokens: int = Field(description="vLLM kv_cache_size_tokens.")
    predicted_block_size: int = Field(description="Planner's block size.")
    predicted_num_blocks: int = Field(description="Planner's number of blocks.")
    predicted_kv_cache_tokens: int = Field(description="Planner's KV-cache tokens.")
    agrees: bool = Field(description="All three predictions equal vLLM's numbers.")
    cache_config_info: dict[str, str] = Field(description="All labels of vllm:cache_config_info.")


class CapacityReport(BaseModel):
    """The capacity part of `residency plan`: one JSON object with `--json`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kv_cache_tokens: int = Field(description="KV-cache tokens (vLLM kv_cache_size_tokens).")
    kv_cache_tokens_range: tuple[int, int] | None = Field(
        default=None, description="Low/high KV tokens from the memory estimate's band."
    )
    block_size: int = Field(description="Attention block size, tokens.")
    num_blocks: int = Field(description="KV-cache blocks (vLLM num_gpu_blocks).")
    max_concurrency: float = Field(description="Requests of max_model_len that fit at once.")
    resident_budget_tokens: int = Field(description="Tokens the resident prefix may take.")
    binding_constraint: str = Field(description="max_model_len or kv_cache.")
    reasoning: str = Field(description="Why the budget is what it is.")
    kv_bytes_per_token: int = Field(description="Attention KV bytes per token, all layers.")
    kv_cache_memory_bytes: int = Field(description="Bytes given to the KV cache.")
    inputs: CapacityInputs = Field(description="What the numbers were computed from.")
    memory: GpuMemoryEstimate | None = Field(
        default=None, description="GPU memory terms of the rank that sets the block count."
    )
    ranks: tuple[GpuMemoryEstimate, ...] = Field(
        default=(), description="GPU memory terms per pipeline stage (every TP rank alike)."
    )
    plan: CapacityPlan = Field(description="Layout, capacity and budget details.")
    server: ServerComparison | None = Field(default=None, description="vLLM's own numbers.")


def cpu_has_avx512_bf16() -> bool:
    """This host's CPU has AVX512-BF16. vLLM asks `torch.cpu._is_avx512_bf16_supported()`
    (CPUID through the cpuinfo library); Linux lists the same CPUID bit as the `avx512_bf16`
    flag in /proc/cpuinfo (cleared when the OS does not enable AVX-512 state), which is read
    here so planning needs no torch."""
    return "avx512_bf16" in cpu_flags()


def resolve_cpu_avx512_bf16(req: CapacityRequest) -> tuple[bool, str | None]:
    """Whether the serving CPU has AVX512-BF16, and how that is known (vLLM's GDN SSM state
    dtype depends on it: vllm/platforms/cpu.py check_and_update_config)."""
    if req.cache.platform != "cpu":
        return False, None
    if req.cpu_avx512_bf16 is not None:
        if req.cpu_avx512_bf16:
            return True, "yes: --cpu-avx512-bf16"
        return False, "no: --no-cpu-avx512-bf16"
    if cpu_has_avx512_bf16():
        return True, (
            "yes: detected on this host (/proc/cpuinfo flag avx512_bf16), taken as the serving "
            "host; --no-cpu-avx512-bf16 plans for a CPU without it"
        )
    return False, (
        "no: not detected on this host (/proc/cpuinfo flag avx512_bf16), taken as the serving "
        "host; --cpu-avx512-bf16 plans for a CPU with it"
    )


def resolve_settings(
    req: CapacityRequest, device: HostGpus | None = None, **overrides: object
) -> CacheSettings:
    """The request's cache flags with the AVX512-BF16 answer resolved, --max-num-batched-tokens
    at vLLM's default for the device when not given (planner/batch_defaults.py), and
    `overrides` applied (what a running server says it uses)."""
    data = req.cache.model_dump()
    data["cpu_avx512_bf16"] = resolve_cpu_avx512_bf16(req)[0]
    if data["max_num_batched_tokens"] is None:
        data["max_num_batched_tokens"] = batch_defaults(req, device).max_num_batched_tokens
    data.update(overrides)
    return CacheSettings.model_validate(data)


def batch_defaults(req: CapacityRequest, device: HostGpus | None) -> BatchDefaults:
    """vLLM's OpenAI-server batch defaults on the request's platform and device."""
    world = req.cache.tensor_parallel_size * req.cache.pipeline_parallel_size
    if device is None or req.cache.platform == "cpu":
        return vllm_batch_defaults(req.cache.platform, world)
    return vllm_batch_defaults("cuda", world, min(device.totals), device.name)


def report_inputs(
    req: CapacityRequest,
    model: ResolvedModel,
    settings: CacheSettings,
    kv_source: str,
    gpu: str | None = None,
    total: int | None = None,
    cpu_avx512_bf16_source: str | None = None,
    devices: tuple[LiveGpu, ...] = (),
    used: tuple[LiveGpu, ...] = (),
) -> CapacityInputs:
    """The inputs a report was computed from, each with its source."""
    if cpu_avx512_bf16_source is None and model.spec.is_hybrid:
        cpu_avx512_bf16_source = resolve_cpu_avx512_bf16(req)[1]
    return CapacityInputs(
        model=model.name,
        model_config_source=model.config_source,
        architecture=model.spec.architecture,
        attention_layers=model.spec.count("full_attention") + model.spec.count("sliding_attention"),
        linear_attention_layers=model.spec.count("linear_attention"),
        gpu=gpu,
        total_memory_bytes=total,
        devices=devices,
        used_devices=tuple(g.index for g in used),
        kv_memory_source=kv_source,
        server=req.server,
        settings=settings,
        cpu_avx512_bf16_source=cpu_avx512_bf16_source,
        reserves=req.reserves,
    )


def binding_rank(
    memory: tuple[GpuMemoryEstimate, ...], stage_num_blocks: tuple[int, ...]
) -> GpuMemoryEstimate | None:
    """The stage whose pool holds the fewest blocks: vLLM gives every rank its count."""
    if not memory:
        return None
    if len(stage_num_blocks) != len(memory):
        return memory[0]
    return memory[stage_num_blocks.index(min(stage_num_blocks))]


def assemble_report(
    plan: CapacityPlan,
    inputs: CapacityInputs,
    memory: tuple[GpuMemoryEstimate, ...] = (),
    server: ServerComparison | None = None,
) -> CapacityReport:
    """The planner's plan as a report: the binding rank's memory, the band, vLLM's numbers."""
    cap = plan.capacity
    band = None
    if plan.capacity_high is not None:
        low = plan.capacity_low.kv_cache_tokens if plan.capacity_low else 0
        band = (low, plan.capacity_high.kv_cache_tokens)
    return CapacityReport(
        kv_cache_tokens=cap.kv_cache_tokens,
        kv_cache_tokens_range=band,
        block_size=plan.layout.block_size,
        num_blocks=cap.num_blocks,
        max_concurrency=round(cap.max_concurrency, 4),
        resident_budget_tokens=plan.budget.resident_budget_tokens,
        binding_constraint=plan.budget.binding_constraint,
        reasoning=plan.budget.reasoning,
        kv_bytes_per_token=plan.layout.kv_bytes_per_token,
        kv_cache_memory_bytes=cap.kv_cache_memory_bytes,
        inputs=inputs,
        memory=binding_rank(memory, plan.capacity.stage_num_blocks),
        ranks=memory if len(memory) > 1 else (),
        plan=plan,
        server=server,
    )
