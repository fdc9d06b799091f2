"""The `--dtype` a local vLLM CPU server runs with, chosen from the CPU it runs on.

vLLM's CPU build computes bfloat16 natively only where the CPU has AMX-BF16 or AVX512-BF16;
elsewhere bf16 matmuls are emulated (widened to float32 and back), which halves prefill speed.
Measured on an Intel Xeon @ 2.80 GHz without AVX512-BF16 or AMX, 2 cores, SmolLM2-135M, cold
prefill through /v1/completions: 2,048 tokens in 8.79 s with `--dtype bfloat16` against 4.27 s
with `--dtype float32` (the demo's and the test fixtures' server; DESIGN.md §5). So residency
starts vLLM in bfloat16 where the CPU has it and in float32 elsewhere; `--dtype` overrides.

Hybrid (Gated DeltaNet) models are the exception: vLLM's CPU GDN kernel runs in bfloat16 only
(`assert mixed_qkv.dtype == torch.bfloat16, "CPU GDN attention requires BF16."`,
vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py, vLLM 0.32): a float32 server starts,
then its engine dies on the first request. So `auto` gives them bfloat16 on every CPU, and an
explicit float32 is refused.

float32 doubles the KV bytes per token (and the GDN state of hybrid models): the planner reads
the dtype the server runs from its own block count (`residency.capacity.report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.units import DTYPE_BYTES
from residency.errors import ConfigError
from residency.machine import cpu_flags

CpuDtype = Literal["bfloat16", "float32"]
CpuDtypeFlag = Literal["auto", "bfloat16", "float32"]
# /proc/cpuinfo flags under which vLLM CPU runs bf16 natively (oneDNN's AMX / AVX512-BF16 kernels).
NATIVE_BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")

DTYPE_FLAG_HELP = (
    "The vLLM CPU server's --dtype: auto picks bfloat16 where the CPU has AMX-BF16 or "
    "AVX512-BF16 and float32 elsewhere (bf16 is emulated there, at about half float32's "
    "prefill speed)."
)


class DtypeChoice(BaseModel):
    """The dtype a vLLM CPU server is started with, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    dtype: CpuDtype = Field(description="The `--dtype` passed to vLLM.")
    reason: str = Field(min_length=1, max_length=512, description="Why this dtype, in one line.")


def choose_cpu_dtype(
    requested: CpuDtypeFlag = "auto", proc: Path = Path("/proc"), *, hybrid: bool = False
) -> DtypeChoice:
    """`requested` unless it is auto; else bfloat16 with native bf16 in the CPU, float32 without.
    A `hybrid` (GDN) model runs bfloat16 on every CPU; float32 for one is a ConfigError.

    >>> choose_cpu_dtype("float32").dtype
    'float32'
    >>> choose_cpu_dtype("auto", hybrid=True).dtype
    'bfloat16'
    """
    if hybrid and requested == "float32":
        raise ConfigError(
            "--dtype float32: vLLM's CPU build runs Gated DeltaNet (hybrid) layers in bfloat16 "
            "only (its GDN kernel asserts it); use --dtype auto or bfloat16"
        )
    if requested != "auto":
        return DtypeChoice(dtype=requested, reason=f"--dtype {requested} (given)")
    flags = cpu_flags(proc)
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    if hybrid:
        how = f"native here ({', '.join(native)})" if native else "emulated on this CPU"
        return DtypeChoice(
            dtype="bfloat16",
            reason=f"bfloat16: vLLM's CPU GDN kernel (hybrid model) runs bfloat16 only; {how}",
        )
    if native:
        return DtypeChoice(
            dtype="bfloat16",
            reason=f"bfloat16: the CPU computes it natively ({', '.join(native)} in /proc/cpuinfo)",
        )
    return DtypeChoice(
        dtype="float32",
        reason="float32: the CPU has neither amx_bf16 nor avx512_bf16 (/proc/cpuinfo), so vLLM "
        "would emulate bfloat16 at about half float32's speed; --dtype bfloat16 overrides",
    )


def same_tokens_gib(dtype: str, bfloat16_gib: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE that holds as many KV tokens in `dtype` as `bfloat16_gib` does in
    bfloat16 (float32: twice the GiB), so a plan's shape does not depend on the CPU."""
    return bfloat16_gib * max(1, DTYPE_BYTES.get(dtype, 2) // 2)


def with_dtype(args: tuple[str, ...], choice: DtypeChoice) -> tuple[str, ...]:
    """vLLM server args with `--dtype` added, unless they already name one."""
    if any(a == "--dtype" or a.startswith("--dtype=") for a in args):
        return args
    return (*args, "--dtype", choice.dtype)
