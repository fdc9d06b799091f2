"""`residency plan` capacity part: gather inputs (profiles, live GPU, a running server), run the
pure planner, and compare its prediction with vLLM's own numbers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner import (
    CacheSettings,
    CapacityPlan,
    GpuMemoryEstimate,
    Reserves,
    plan_capacity,
)
from planner.batch_defaults import BatchDefaults, vllm_batch_defaults
from residency.capacity.gpu import LiveGpu
from residency.capacity.profiles import (
    DEFAULT_MODEL,
    DEFAULT_PROFILE,
    ResolvedModel,
    resolve_model,
)
from residency.capacity.ranks import HostGpus, estimate_rank_memory, read_host_gpus
from residency.capacity.request import CapacityRequest
from residency.errors import ConfigError
from residency.machine import cpu_flags, machine_info


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


def _cpu_has_avx512_bf16() -> bool:
    """This host's CPU has AVX512-BF16. vLLM asks `torch.cpu._is_avx512_bf16_supported()`
    (CPUID through the cpuinfo library); Linux lists the same CPUID bit as the `avx512_bf16`
    flag in /proc/cpuinfo (cleared when the OS does not enable AVX-512 state), which is read
    here so planning needs no torch."""
    return "avx512_bf16" in cpu_flags()


def _resolve_cpu_avx512_bf16(req: CapacityRequest) -> tuple[bool, str | None]:
    """Whether the serving CPU has AVX512-BF16, and how that is known (vLLM's GDN SSM state
    dtype depends on it: vllm/platforms/cpu.py check_and_update_config)."""
    if req.cache.platform != "cpu":
        return False, None
    if req.cpu_avx512_bf16 is not None:
        if req.cpu_avx512_bf16:
            return True, "yes: --cpu-avx512-bf16"
        return False, "no: --no-cpu-avx512-bf16"
    if _cpu_has_avx512_bf16():
        return True, (
            "yes: detected on this host (/proc/cpuinfo flag avx512_bf16), taken as the serving "
            "host; --no-cpu-avx512-bf16 plans for a CPU without it"
        )
    return False, (
        "no: not detected on this host (/proc/cpuinfo flag avx512_bf16), taken as the serving "
        "host; --cpu-avx512-bf16 plans for a CPU with it"
    )


def _settings(
    req: CapacityRequest, device: HostGpus | None = None, **overrides: object
) -> CacheSettings:
    """The request's cache flags with the AVX512-BF16 answer resolved, --max-num-batched-tokens
    at vLLM's default for the device when not given (planner/batch_defaults.py), and
    `overrides` applied (what a running server says it uses)."""
    data = req.cache.model_dump()
    data["cpu_avx512_bf16"] = _resolve_cpu_avx512_bf16(req)[0]
    if data["max_num_batched_tokens"] is None:
        data["max_num_batched_tokens"] = _batch_defaults(req, device).max_num_batched_tokens
    data.update(overrides)
    return CacheSettings.model_validate(data)


def _batch_defaults(req: CapacityRequest, device: HostGpus | None) -> BatchDefaults:
    """vLLM's OpenAI-server batch defaults on the request's platform and device."""
    world = req.cache.tensor_parallel_size * req.cache.pipeline_parallel_size
    if device is None or req.cache.platform == "cpu":
        return vllm_batch_defaults(req.cache.platform, world)
    return vllm_batch_defaults("cuda", world, min(device.totals), device.name)


def _inputs(
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
    if cpu_avx512_bf16_source is None and model.spec.is_hybrid:
        cpu_avx512_bf16_source = _resolve_cpu_avx512_bf16(req)[1]
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


def _binding_rank(
    memory: tuple[GpuMemoryEstimate, ...], stage_num_blocks: tuple[int, ...]
) -> GpuMemoryEstimate | None:
    """The stage whose pool holds the fewest blocks: vLLM gives every rank its count."""
    if not memory:
        return None
    if len(stage_num_blocks) != len(memory):
        return memory[0]
    return memory[stage_num_blocks.index(min(stage_num_blocks))]


def _report(
    plan: CapacityPlan,
    inputs: CapacityInputs,
    memory: tuple[GpuMemoryEstimate, ...] = (),
    server: ServerComparison | None = None,
) -> CapacityReport:
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
        memory=_binding_rank(memory, plan.capacity.stage_num_blocks),
        ranks=memory if len(memory) > 1 else (),
        plan=plan,
        server=server,
    )


def _check_kv_bytes_fit_the_device(req: CapacityRequest, model: ResolvedModel) -> None:
    """ConfigError when --kv-cache-memory-bytes and the weights (per rank) exceed the memory
    of the device named: the GPU of the profile (or the default one) on --platform cuda, this
    host's memory on --platform cpu (vLLM CPU keeps both in RAM). No server could hold it."""
    kv = req.kv_cache_memory_bytes
    assert kv is not None
    world = req.cache.tensor_parallel_size * req.cache.pipeline_parallel_size
    weights = (model.weights_bytes or 0) // world
    if req.cache.platform == "cpu":
        total, where = host_memory_bytes(), "this host's memory"
        fix = "plan on the host that runs vLLM, or read its KV from it with --server"
    elif req.cache.platform == "cuda" and req.gpu != "auto":
        from residency.capacity.profiles import load_gpu_profile

        gpu = load_gpu_profile(req.profile or DEFAULT_PROFILE)
        total, where = gpu.total_memory_bytes, f"the {gpu.name}"
        fix = "name the GPU with --profile" if req.profile is None else "check --profile"
    else:
        return
    if total is None or kv + weights <= total:
        return
    gib = 1 << 30
    device = f"{where} ({total:,} bytes, {total / gib:.2f} GiB)"
    if weights >= total:
        raise ConfigError(
            f"--model {model.name}: its weights alone ({weights:,} bytes per rank) are more "
            f"than {device}, whatever --kv-cache-memory-bytes says: {fix}"
        )
    if weights:
        estimate = ""
        if req.cache.platform == "cuda":
            estimate = " (or drop it to plan from --gpu-memory-utilization)"
        raise ConfigError(
            f"--kv-cache-memory-bytes {kv:,} plus the weights ({weights:,} bytes per rank) is "
            f"more than {device}: lower it to at most {total - weights:,}{estimate}, or {fix}"
        )
    raise ConfigError(
        f"--kv-cache-memory-bytes {kv:,} is more than {where} ({total:,} bytes, "
        f"{total / gib:.2f} GiB): lower it below {total:,}, or {fix}"
    )


def host_memory_bytes() -> int | None:
    """This machine's memory (MemTotal), None where it cannot be read."""
    gib = machine_info().memory_gib
    return None if gib is None else int(gib * (1 << 30))


def _default_window(req: CapacityRequest, model: ResolvedModel) -> CapacityRequest:
    """`req` with --max-model-len lowered to the model's own limit when the flag was not given
    and residency's default (32,768) is above it: vLLM derives the window from the model when
    the flag is absent, so a default the model cannot run is never refused as if typed."""
    limit = model.spec.max_model_len_limit
    if req.max_model_len is not None or limit is None:
        return req
    if req.cache.max_model_len <= limit:
        return req
    cache = req.cache.model_copy(update={"max_model_len": limit})
    return req.model_copy(update={"cache": cache})


def build_capacity_report(req: CapacityRequest) -> CapacityReport:
    """Plan capacity from a GPU profile, the live GPU, explicit KV bytes or a running server."""
    if req.server:
        from residency.capacity.server import server_report

        return server_report(req)
    model = resolve_model(req.model or DEFAULT_MODEL)
    req = _default_window(req, model)
    if req.kv_cache_memory_bytes is not None:
        settings = _settings(req)
        _check_kv_bytes_fit_the_device(req, model)
        plan = plan_capacity(model.spec, settings, req.kv_cache_memory_bytes, req.reserves)
        inputs = _inputs(req, model, settings, "--kv-cache-memory-bytes (profiling bypassed)")
        return _report(plan, inputs)
    tp, pp = req.cache.tensor_parallel_size, req.cache.pipeline_parallel_size
    world = tp * pp
    host = read_host_gpus(
        live=req.gpu == "auto",
        profile=req.profile or DEFAULT_PROFILE,
        gpu_index=req.gpu_index,
        world_size=world,
        gpu_memory_utilization=req.gpu_memory_utilization,
    )
    settings = _settings(req, host)
    assert settings.max_num_batched_tokens is not None
    memory = estimate_rank_memory(
        model,
        host,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=req.gpu_memory_utilization,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=req.max_num_seqs or _batch_defaults(req, host).max_num_seqs,
        enforce_eager=req.enforce_eager,
    )
    plan = plan_capacity(model.spec, settings, memory, req.reserves)
    inputs = _inputs(
        req,
        model,
        settings,
        "estimate: total x utilization - non-KV terms" + (", per rank" if world > 1 else ""),
        gpu=host.name,
        total=min(host.totals),
        devices=host.devices,
        used=host.used,
    )
    return _report(plan, inputs, memory)
