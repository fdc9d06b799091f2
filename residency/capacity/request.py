"""What `residency plan` is asked about a host, as one pydantic model: light enough for the CLI
to bind its flags to at import time (`residency/cli/fields.py`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner import CacheSettings, Reserves
from residency.capacity.profiles import DEFAULT_MODEL, DEFAULT_PROFILE

DEFAULT_MAX_MODEL_LEN = 32768


def _default_cache() -> CacheSettings:
    return CacheSettings(max_model_len=DEFAULT_MAX_MODEL_LEN)


class CapacityRequest(BaseModel):
    """Everything `residency plan` was asked: the host, the vLLM flags that shape the KV cache
    (`cache`, the planner's own `CacheSettings`), the memory flags and the reserves."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    model: str | None = Field(
        default=None,
        description=f"Model profile name or local HF model dir / config.json "
        f"(default: {DEFAULT_MODEL}).",
    )
    profile: str | None = Field(
        default=None,
        description=f"GPU profile (default: {DEFAULT_PROFILE}); see `residency profiles`.",
    )
    gpu: Literal["auto"] | None = Field(
        default=None, description="auto: read the live GPU through NVML."
    )
    gpu_index: int = Field(
        default=0,
        ge=0,
        description="--gpu auto: first visible CUDA device the plan uses (CUDA_VISIBLE_DEVICES "
        "applied; vLLM itself starts at 0).",
    )
    server: str | None = Field(
        default=None, description="URL of a running vLLM: read its own KV numbers and compare."
    )
    cache: CacheSettings = Field(
        default_factory=_default_cache, description="The vLLM flags that shape the KV cache."
    )
    cpu_avx512_bf16: bool | None = Field(
        default=None,
        description="--platform cpu, hybrid models: the serving CPU has AVX512-BF16, so vLLM "
        "keeps GDN state in float32 unless --mamba-ssm-cache-dtype is 16-bit (default: detect "
        "on this host, taken as the serving host).",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="--gpu-memory-utilization: the share of GPU memory vLLM may use, in (0, 1].",
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="--kv-cache-memory-bytes: KV bytes, bypassing memory profiling.",
    )
    max_num_seqs: int = Field(
        default=256,
        ge=1,
        description="--max-num-seqs: sequences per scheduler step (sizes the sampler's warm-up "
        "memory).",
    )
    enforce_eager: bool = Field(default=False, description="--enforce-eager: no CUDA-graph memory.")
    reserves: Reserves = Field(default_factory=Reserves, description="Per-request reserves.")
