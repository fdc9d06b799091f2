"""The GPUs a plan runs on (a profile, or the live devices through NVML) and one memory
estimate per pipeline stage: what `residency plan` subtracts from each rank's memory."""

from __future__ import annotations

from dataclasses import dataclass

from planner import GpuMemoryEstimate, estimate_gpu_kv_memory
from planner.parallel import pp_layer_ranges
from residency.capacity.gpu import LiveGpu, check_free_memory, read_visible_gpus, select_gpus
from residency.capacity.profiles import ResolvedModel, load_gpu_profile
from residency.errors import ProfileError


@dataclass(frozen=True, slots=True)
class HostGpus:
    """The devices of one plan: a name for the report, each rank's total memory (rank =
    pp_rank x TP + tp_rank, as vLLM numbers them) and, live, every visible device."""

    name: str
    totals: tuple[int, ...]
    devices: tuple[LiveGpu, ...] = ()
    used: tuple[LiveGpu, ...] = ()


def read_host_gpus(
    *, live: bool, profile: str, gpu_index: int, world_size: int, gpu_memory_utilization: float
) -> HostGpus:
    """A GPU profile taken for every rank, or the live devices (checked for free memory as
    vLLM's startup checks them)."""
    if not live:
        gpu = load_gpu_profile(profile)
        return HostGpus(f"{gpu.name} (profile)", (gpu.total_memory_bytes,) * world_size)
    devices = read_visible_gpus()
    used = select_gpus(devices, gpu_index, world_size)
    check_free_memory(used, gpu_memory_utilization)
    names = " + ".join(sorted({g.name for g in used}))
    where = f"live, NVML, {world_size} devices" if world_size > 1 else "live, NVML"
    return HostGpus(f"{names} ({where})", tuple(g.total_memory_bytes for g in used), devices, used)


def estimate_rank_memory(
    model: ResolvedModel,
    host: HostGpus,
    *,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enforce_eager: bool,
) -> tuple[GpuMemoryEstimate, ...]:
    """One estimate per pipeline stage; every TP rank of a stage holds the same share, so the
    stage's smallest device decides (each vLLM worker sizes its own pool)."""
    if model.weights_bytes is None:
        raise ProfileError(
            f"--model {model.name}: no *.safetensors files to size the weights; point --model "
            "at a directory with the weights, use a model profile, or pass --kv-cache-memory-bytes"
        )
    tp = tensor_parallel_size
    stages = pp_layer_ranges(model.spec.num_hidden_layers, pipeline_parallel_size)
    return tuple(
        estimate_gpu_kv_memory(
            total_memory_bytes=min(host.totals[index * tp : (index + 1) * tp]),
            gpu_memory_utilization=gpu_memory_utilization,
            weights_bytes=model.weights_bytes,
            weights_source=model.weights_source,
            model=model.spec,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tp,
            pipeline_stage=index,
            stage=stage if len(stages) > 1 else None,
        )
        for index, stage in enumerate(stages)
    )
