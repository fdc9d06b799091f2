"""`residency plan` capacity part: gather inputs (profiles, live GPU, a running server), run the
pure planner, and compare its prediction with vLLM's own numbers."""

from __future__ import annotations

from planner import plan_capacity
from residency.capacity.assemble import (
    CapacityInputs,
    CapacityReport,
    ServerComparison,
    assemble_report,
    batch_defaults,
    report_inputs,
    resolve_settings,
)
from residency.capacity.profiles import (
    DEFAULT_MODEL,
    DEFAULT_PROFILE,
    ResolvedModel,
    resolve_model,
)
from residency.capacity.ranks import estimate_rank_memory, read_host_gpus
from residency.capacity.request import CapacityRequest
from residency.capacity.server import server_report
from residency.errors import ConfigError
from residency.machine import machine_info

__all__ = [
    "CapacityInputs",
    "CapacityReport",
    "ServerComparison",
    "build_capacity_report",
    "host_memory_bytes",
]


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
        return server_report(req)
    model = resolve_model(req.model or DEFAULT_MODEL)
    req = _default_window(req, model)
    if req.kv_cache_memory_bytes is not None:
        settings = resolve_settings(req)
        _check_kv_bytes_fit_the_device(req, model)
        plan = plan_capacity(model.spec, settings, req.kv_cache_memory_bytes, req.reserves)
        inputs = report_inputs(req, model, settings, "--kv-cache-memory-bytes (profiling bypassed)")
        return assemble_report(plan, inputs)
    tp, pp = req.cache.tensor_parallel_size, req.cache.pipeline_parallel_size
    world = tp * pp
    host = read_host_gpus(
        live=req.gpu == "auto",
        profile=req.profile or DEFAULT_PROFILE,
        gpu_index=req.gpu_index,
        world_size=world,
        gpu_memory_utilization=req.gpu_memory_utilization,
    )
    settings = resolve_settings(req, host)
    assert settings.max_num_batched_tokens is not None
    memory = estimate_rank_memory(
        model,
        host,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=req.gpu_memory_utilization,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=req.max_num_seqs or batch_defaults(req, host).max_num_seqs,
        enforce_eager=req.enforce_eager,
    )
    plan = plan_capacity(model.spec, settings, memory, req.reserves)
    inputs = report_inputs(
        req,
        model,
        settings,
        "estimate: total x utilization - non-KV terms" + (", per rank" if world > 1 else ""),
        gpu=host.name,
        total=min(host.totals),
        devices=host.devices,
        used=host.used,
    )
    return assemble_report(plan, inputs, memory)
