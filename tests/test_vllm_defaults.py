"""Every default of residency's that mirrors a `vllm serve` flag is the pinned vLLM's own, read
from vLLM's config classes (a server started without the flag is the one planned for)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from planner import CacheSettings
from planner.batch_defaults import vllm_batch_defaults
from residency.capacity.request import CapacityRequest


@pytest.fixture(scope="module")
def vllm_config() -> Any:
    """vllm.config, imported by the tests that read it (collecting stays quick)."""
    return pytest.importorskip("vllm.config", reason="vLLM's CPU build: make install")


def _default(cls: type[Any], name: str) -> Any:
    """A vLLM config dataclass field's default."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is not dataclasses.MISSING:
        default = field.default
        # pydantic dataclasses keep Field(default=...) as the dataclass default
        return getattr(default, "default", default)
    assert field.default_factory is not dataclasses.MISSING, name
    return field.default_factory()


# (residency's model, its field, vLLM's config class, its field)
MIRRORED = [
    (CapacityRequest, "gpu_memory_utilization", "CacheConfig", "gpu_memory_utilization"),
    (CapacityRequest, "enforce_eager", "ModelConfig", "enforce_eager"),
    (CacheSettings, "kv_cache_dtype", "CacheConfig", "cache_dtype"),
    (CacheSettings, "mamba_cache_dtype", "CacheConfig", "mamba_cache_dtype"),
    (CacheSettings, "mamba_ssm_cache_dtype", "CacheConfig", "mamba_ssm_cache_dtype"),
    (CacheSettings, "enable_prefix_caching", "CacheConfig", "enable_prefix_caching"),
    (CacheSettings, "dtype", "ModelConfig", "dtype"),
    (CacheSettings, "tensor_parallel_size", "ParallelConfig", "tensor_parallel_size"),
    (CacheSettings, "pipeline_parallel_size", "ParallelConfig", "pipeline_parallel_size"),
]


@pytest.mark.parametrize(
    ("ours", "name", "theirs", "their_name"),
    MIRRORED,
    ids=[f"{m[0].__name__}.{m[1]}" for m in MIRRORED],
)
def test_a_mirrored_default_is_vllms(
    vllm_config: Any, ours: type[Any], name: str, theirs: str, their_name: str
) -> None:
    vllm_default = _default(getattr(vllm_config, theirs), their_name)
    assert ours.model_fields[name].default == vllm_default


def test_block_size_and_batch_sizes_default_to_what_vllm_decides_per_platform(
    vllm_config: Any,
) -> None:
    # vLLM leaves these unset and resolves them per platform and device: so do we.
    assert _default(vllm_config.CacheConfig, "block_size") is None
    assert CacheSettings.model_fields["block_size"].default is None
    assert CacheSettings.model_fields["max_num_batched_tokens"].default is None
    assert CapacityRequest.model_fields["max_num_seqs"].default is None


def test_the_cpu_batch_defaults_are_vllms_own() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    for world in (1, 2):
        tokens, seqs = EngineArgs.get_batch_defaults(world)  # this host is vLLM's CPU platform
        ours = vllm_batch_defaults("cpu", world)
        assert ours.max_num_batched_tokens == tokens[UsageContext.OPENAI_API_SERVER]
        assert ours.max_num_seqs == seqs[UsageContext.OPENAI_API_SERVER]


@pytest.mark.parametrize(
    ("memory_gib", "name", "expected"),
    [
        (12, "rtx4070-12gb", (2048, 256)),
        (80, "a100-80gb", (2048, 256)),  # vLLM keeps the A100 on the small defaults (#17885)
        (80, "h100-80gb", (8192, 1024)),
        (141, "h200-141gb", (8192, 1024)),
        (180, "b200", (16384, 1024)),
        (None, "", (2048, 256)),  # a GPU vLLM cannot query
    ],
)
def test_the_gpu_batch_defaults_follow_vllms_table(
    memory_gib: int | None, name: str, expected: tuple[int, int]
) -> None:
    # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.32.0), OPENAI_API_SERVER.
    memory = None if memory_gib is None else memory_gib << 30
    got = vllm_batch_defaults("cuda", 1, memory, name)
    assert (got.max_num_batched_tokens, got.max_num_seqs) == expected
