"""Byte units and dtype sizes, in vLLM's vocabulary (`--dtype`, `--kv-cache-dtype`)."""

from __future__ import annotations

from typing import Literal

GiB = 1 << 30
MiB = 1 << 20

# The model dtypes vLLM resolves `--dtype auto` to (vllm/config/model.py: _resolve_auto_dtype).
ModelDType = Literal["float32", "bfloat16", "float16"]
# `--kv-cache-dtype` values with a plain per-element layout (vllm/config/cache.py: CacheDType).
KVCacheDType = Literal["auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2"]
# `--mamba-cache-dtype` / `--mamba-ssm-cache-dtype`.
MambaDType = Literal["auto", "float32", "bfloat16", "float16"]
DTypeFlag = Literal["auto", "float32", "bfloat16", "float16"]  # vllm serve --dtype

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# HF config.json spellings of dtypes (`torch_dtype` / `dtype`).
HF_DTYPE_ALIASES: dict[str, ModelDType] = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (vllm/utils/math_utils.py: cdiv)."""
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= x."""
    return cdiv(x, multiple) * multiple


def format_gib(num_bytes: int | float) -> str:
    """Bytes as GiB with two decimals, as vLLM logs them."""
    return f"{num_bytes / GiB:.2f}"
