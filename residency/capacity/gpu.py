"""The live GPU through NVML (`--gpu auto`): name and total memory of one device."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from residency.errors import GpuError


class LiveGpu(BaseModel):
    """What NVML reports for one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="CUDA device index.")
    name: str = Field(description="Device name as NVML reports it.")
    total_memory_bytes: int = Field(ge=1, description="Total device memory.")
    free_memory_bytes: int = Field(ge=0, description="Free device memory right now.")


def read_live_gpu(index: int = 0) -> LiveGpu:
    """Read device `index` through pynvml; `GpuError` says why when it cannot."""
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
        count = pynvml.nvmlDeviceGetCount()
        if index >= count:
            raise GpuError(f"--gpu-index {index}: only {count} NVIDIA GPU(s) present")
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return LiveGpu(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            total_memory_bytes=int(mem.total),
            free_memory_bytes=int(mem.free),
        )
    except pynvml.NVMLError as exc:
        raise GpuError(f"--gpu auto: NVML failed ({_nvml_reason(exc)})") from None
    finally:
        pynvml.nvmlShutdown()


def _nvml_reason(exc: Any) -> str:
    return str(exc) or type(exc).__name__
