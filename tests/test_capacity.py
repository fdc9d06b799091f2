"""Blocks, tokens, concurrency and the resident budget from KV bytes."""

from __future__ import annotations

import pytest

from planner import (
    CacheSettings,
    CapacityError,
    InfeasiblePlanError,
    Reserves,
    build_kv_layout,
    compute_kv_capacity,
    compute_resident_budget,
    estimate_gpu_kv_memory,
    plan_capacity,
)
from planner.units import GiB
from residency.capacity.profiles import resolve_model


def _llama_layout(max_model_len: int) -> object:
    return build_kv_layout(
        resolve_model("llama-3.1-8b-instruct").spec, CacheSettings(max_model_len=max_model_len)
    )


def test_kv_tokens_count_only_full_blocks_per_request() -> None:
    layout = build_kv_layout(
        resolve_model("llama-3.1-8b-instruct").spec, CacheSettings(max_model_len=1000)
    )
    cap = compute_kv_capacity(layout, 100 * layout.bytes_per_block + 123, 1000)
    # 100 blocks; a 1000-token request needs cdiv(1000, 16) = 63 -> 100 / 63 x 1000 = 1587.
    assert cap.num_blocks == 100
    assert cap.kv_cache_tokens == 1587
    assert cap.max_concurrency == pytest.approx(100 / 63)


def test_one_request_must_fit_like_vllm_says() -> None:
    layout = build_kv_layout(
        resolve_model("llama-3.1-8b-instruct").spec, CacheSettings(max_model_len=32768)
    )
    # 32768 tokens need 2048 blocks of 2 MiB = 4 GiB; give 1 GiB.
    with pytest.raises(CapacityError) as info:
        compute_kv_capacity(layout, GiB, 32768)
    message = str(info.value)
    assert "4.00 GiB" in message
    assert "1.00 GiB" in message
    assert "--max-model-len 8176" in message  # (512 - 1 null block) x 16 tokens
    assert "--gpu-memory-utilization" in message


def test_hybrid_tokens_divide_blocks_over_all_groups() -> None:
    spec = resolve_model("qwen3.5-4b-fp8").spec
    layout = build_kv_layout(spec, CacheSettings(max_model_len=32768))
    cap = compute_kv_capacity(layout, 300 * layout.bytes_per_block, 32768)
    # A request holds 63 attention blocks + 3 groups x 2 GDN blocks = 69 blocks.
    assert cap.num_blocks == 300
    assert cap.kv_cache_tokens == int(300 / 69 * 32768)


@pytest.mark.parametrize(
    ("kv_tokens", "concurrency", "binding", "budget"),
    [
        pytest.param(200_000, 1, "max_model_len", 32768 - 3392, id="context-binds"),
        # kv side: 40,000 - 4 x round_up(3392, 16) = 26,432 < 29,376.
        pytest.param(40_000, 4, "kv_cache", 40_000 - 4 * 3392, id="kv-binds"),
    ],
)
def test_budget_reports_the_binding_constraint(
    kv_tokens: int, concurrency: int, binding: str, budget: int
) -> None:
    result = compute_resident_budget(
        max_model_len=32768,
        kv_cache_tokens=kv_tokens,
        block_size=16,
        reserves=Reserves(concurrent_requests=concurrency),
        align_to_blocks=False,
    )
    assert result.binding_constraint == binding
    assert result.resident_budget_tokens == budget


def test_hybrid_budget_rounds_down_to_attention_blocks() -> None:
    result = compute_resident_budget(
        max_model_len=32768,
        kv_cache_tokens=10**6,
        block_size=528,
        reserves=Reserves(),
        align_to_blocks=True,
    )
    assert result.resident_budget_tokens == (32768 - 3392) // 528 * 528 == 29040


@pytest.mark.parametrize(
    ("max_model_len", "kv_tokens", "concurrency", "fragments"),
    [
        pytest.param(
            2048, 10**6, 1, ("--max-model-len 2048", "3392", "--reserve"), id="context-too-short"
        ),
        pytest.param(
            32768, 10_000, 8, ("10000", "--concurrency 8", "at most 1"), id="too-many-concurrent"
        ),
    ],
)
def test_budget_at_or_below_zero_is_infeasible(
    max_model_len: int, kv_tokens: int, concurrency: int, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(InfeasiblePlanError) as info:
        compute_resident_budget(
            max_model_len=max_model_len,
            kv_cache_tokens=kv_tokens,
            block_size=16,
            reserves=Reserves(concurrent_requests=concurrency),
            align_to_blocks=False,
        )
    for fragment in fragments:
        assert fragment in str(info.value)


def test_weights_that_do_not_fit_name_the_utilization_that_would() -> None:
    spec = resolve_model("qwen3-4b").spec
    with pytest.raises(CapacityError, match=r"--gpu-memory-utilization 0\.62 is the least"):
        estimate_gpu_kv_memory(
            total_memory_bytes=12 * GiB,
            gpu_memory_utilization=0.5,
            weights_bytes=int(7.4 * GiB),
            weights_source="test",
            model=spec,
            max_num_batched_tokens=2048,
            max_num_seqs=256,
        )


def test_default_host_budget_is_near_30k_tokens() -> None:
    """RTX 4070 12 GB, Qwen3.5-4B FP8, 32K context, 0.90: the docs/design/background.md setup."""
    from residency.capacity.profiles import load_gpu_profile

    model = resolve_model("qwen3.5-4b-fp8")
    assert model.weights_bytes is not None
    memory = estimate_gpu_kv_memory(
        total_memory_bytes=load_gpu_profile("rtx4070-12gb").total_memory_bytes,
        gpu_memory_utilization=0.9,
        weights_bytes=model.weights_bytes,
        weights_source="profile",
        model=model.spec,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
    )
    plan = plan_capacity(model.spec, CacheSettings(max_model_len=32768), memory, Reserves())
    assert plan.budget.binding_constraint == "max_model_len"
    assert 28_000 <= plan.budget.resident_budget_tokens <= 31_000
    assert plan.budget.resident_budget_tokens % 528 == 0
    assert plan.capacity_low is not None
    assert plan.capacity_high is not None
    assert plan.capacity_low.kv_cache_tokens < plan.capacity.kv_cache_tokens
    assert plan.capacity.kv_cache_tokens < plan.capacity_high.kv_cache_tokens


@pytest.mark.parametrize(
    ("gpu", "requested", "kv_bytes", "num_blocks", "kv_tokens"),
    [
        # H100 SXM 80 GB: ceil(85,520,809,984 B x 0.9) = 76,968,728,986 (vllm/v1/worker/utils.py
        # request_memory rounds up); minus weights 16,060,522,496,
        # activation 2048 x (2 x 14336 + 8 x 4096) x 2 B + 256 x 128256 x 4 B x 2 = 514,326,528,
        # non-torch 200 MiB and CUDA graphs 256 MiB = 59,915,729,306 B -> // 2 MiB = 28,570
        # blocks; a 32K request holds 2,048 blocks -> int(28570 / 2048 x 32768) = 457,120.
        pytest.param("h100-80gb", 76_968_728_986, 59_915_729_306, 28_570, 457_120, id="h100"),
        # RTX 4090: ceil(25,757,220,864 x 0.9) = 23,181,498,778 -> 6,128,499,098 B -> 2,922 blocks.
        pytest.param("rtx4090-24gb", 23_181_498_778, 6_128_499_098, 2_922, 46_752, id="rtx4090"),
    ],
)
def test_gpu_profiles_llama31_8b_hand_computed(
    gpu: str, requested: int, kv_bytes: int, num_blocks: int, kv_tokens: int
) -> None:
    from residency.capacity.profiles import load_gpu_profile

    model = resolve_model("llama-3.1-8b-instruct")
    assert model.weights_bytes == 16_060_522_496
    memory = estimate_gpu_kv_memory(
        total_memory_bytes=load_gpu_profile(gpu).total_memory_bytes,
        gpu_memory_utilization=0.9,
        weights_bytes=model.weights_bytes,
        weights_source="profile",
        model=model.spec,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
    )
    assert memory.requested_memory_bytes == requested
    assert memory.kv_cache_memory_bytes == kv_bytes
    plan = plan_capacity(model.spec, CacheSettings(max_model_len=32768), memory, Reserves())
    assert plan.capacity.num_blocks == num_blocks
    assert plan.capacity.kv_cache_tokens == kv_tokens
