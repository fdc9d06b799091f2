"""The live GPUs through NVML (`--gpu auto`): every device this process may use, and vLLM's
startup check of free memory.

Which devices: vLLM gives local rank r the r-th entry of `CUDA_VISIBLE_DEVICES` (an NVML index
or a `GPU-...` UUID; unset or empty: NVML index r), vllm/platforms/interface.py
`device_id_to_physical_device_id` and vllm/platforms/cuda.py
`device_control_id_to_physical_device_id`. NVML itself ignores `CUDA_VISIBLE_DEVICES`, so the
mapping is applied here. A TP x PP plan uses the visible devices `--gpu-index` ..
`--gpu-index + TP x PP - 1` (vLLM starts at visible device 0; `--gpu-index` plans as if
`CUDA_VISIBLE_DEVICES` began further on).

Free memory: vLLM refuses to start when a device's free memory is below
`ceil(total x gpu_memory_utilization)` (vllm/v1/worker/utils.py `request_memory`: "Free memory
on device ... on startup is less than desired GPU memory utilization"); `check_free_memory`
applies the same rule before a plan is made.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from planner.units import format_gib
from residency.errors import GpuError


class LiveGpu(BaseModel):
    """What NVML reports for one device."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    index: int = Field(ge=0, description="CUDA device index as this process sees it.")
    nvml_index: int = Field(default=0, ge=0, description="NVML (physical) device index.")
    uuid: str = Field(default="", description="Device UUID as NVML reports it.")
    name: str = Field(description="Device name as NVML reports it.")
    total_memory_bytes: int = Field(ge=1, description="Total device memory.")
    free_memory_bytes: int = Field(ge=0, description="Free device memory right now.")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_reason(exc: Any) -> str:
    return str(exc) or type(exc).__name__


def _visible_nvml_indices(pynvml: Any, count: int) -> list[int]:
    """NVML indices of the devices CUDA shows this process, in CUDA order."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        # vLLM treats an empty value as unset (interface.py device_id_to_physical_device_id).
        return list(range(count))
    indices: list[int] = []
    for entry in (e.strip() for e in raw.split(",")):
        try:
            index = int(entry)
        except ValueError:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
                index = int(pynvml.nvmlDeviceGetIndex(handle))
            except pynvml.NVMLError:
                raise GpuError(
                    f"CUDA_VISIBLE_DEVICES={raw}: no NVIDIA GPU has the id {entry!r}; "
                    f"NVML sees {count} device(s), indices 0-{count - 1}"
                ) from None
        if not 0 <= index < count:
            raise GpuError(
                f"CUDA_VISIBLE_DEVICES={raw}: device {index} does not exist; NVML sees {count} "
                f"device(s), indices 0-{count - 1}"
            )
        indices.append(index)
    return indices


def read_visible_gpus() -> tuple[LiveGpu, ...]:
    """Every device `CUDA_VISIBLE_DEVICES` lets this process use, through pynvml; `GpuError`
    says why when it cannot."""
    try:
        import pynvml
    except ImportError:
        raise GpuError(
            "--gpu auto needs NVML bindings: pip install 'residency[gpu]' (nvidia-ml-py), "
            "or pass --profile NAME"
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuError(
            f"--gpu auto: no NVIDIA driver answered ({_nvml_reason(exc)}); "
            "pass --profile NAME (see `residency profiles`) or --server URL"
        ) from None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        gpus = []
        for cuda_index, nvml_index in enumerate(_visible_nvml_indices(pynvml, count)):
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                LiveGpu(
                    index=cuda_index,
                    nvml_index=nvml_index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    total_memory_bytes=int(mem.total),
                    free_memory_bytes=int(mem.free),
                )
            )
        return tuple(gpus)
    except pynvml.NVMLError as exc:
        raise GpuError(f"--gpu auto: NVML failed ({_nvml_reason(exc)})") from None
    finally:
        pynvml.nvmlShutdown()


def select_gpus(visible: Sequence[LiveGpu], gpu_index: int, world_size: int) -> tuple[LiveGpu, ...]:
    """The devices a TP x PP plan runs on: `world_size` visible devices from `gpu_index`."""
    if not visible:
        raise GpuError(
            f"--gpu auto: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} "
            "hides every GPU; unset it or list a device"
        )
    end = gpu_index + world_size
    if end > len(visible):
        need = (
            f"--tensor-parallel-size x --pipeline-parallel-size = {world_size} GPUs"
            if world_size > 1
            else "one GPU"
        )
        raise GpuError(
            f"--gpu-index {gpu_index}: {need} from device {gpu_index} needs devices "
            f"{gpu_index}-{end - 1}, but only {len(visible)} are visible (0-{len(visible) - 1}); "
            "lower --gpu-index, the parallel sizes, or widen CUDA_VISIBLE_DEVICES"
        )
    return tuple(visible[gpu_index:end])


def largest_startable_utilization(total_memory_bytes: int, free_memory_bytes: int) -> float:
    """The largest --gpu-memory-utilization (2 decimals) with ceil(total x u) <= free."""
    u = math.floor(free_memory_bytes / total_memory_bytes * 100) / 100
    while u > 0 and math.ceil(total_memory_bytes * u) > free_memory_bytes:
        u = round(u - 0.01, 2)
    return max(u, 0.0)


def check_free_memory(gpus: Sequence[LiveGpu], gpu_memory_utilization: float) -> None:
    """Refuse, as vLLM's startup does, when a device has less free memory than
    ceil(total x utilization) (vllm/v1/worker/utils.py `request_memory`)."""
    for gpu in gpus:
        requested = math.ceil(gpu.total_memory_bytes * gpu_memory_utilization)
        if gpu.free_memory_bytes >= requested:
            continue
        best = min(
            largest_startable_utilization(g.total_memory_bytes, g.free_memory_bytes) for g in gpus
        )
        fix = (
            f"--gpu-memory-utilization {best:.2f} is the largest that would start"
            if best > 0
            else "no --gpu-memory-utilization would start"
        )
        raise GpuError(
            f"GPU {gpu.index} ({gpu.name}) has {format_gib(gpu.free_memory_bytes)} GiB free of "
            f"{format_gib(gpu.total_memory_bytes)} GiB, but --gpu-memory-utilization "
            f"{gpu_memory_utilization} asks vLLM for {format_gib(requested)} GiB at startup, "
            f"which it refuses (vllm/v1/worker/utils.py request_memory); {fix}, or free the "
            "memory other processes hold"
        )
