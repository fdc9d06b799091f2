"""KV page sizes, block sizes and groups for the shipped model profiles, against values computed
by hand from vLLM's formulas (planner/kv_layout.py cites them)."""

from __future__ import annotations

import pytest

from planner import CacheSettings, build_kv_layout
from planner.units import KVCacheDType
from residency.profiles import resolve_model

KiB = 1024


@pytest.mark.parametrize(
    ("model", "kv_dtype", "kv_bytes_per_token", "block_size", "bytes_per_block"),
    [
        # 32 layers x 8 KV heads x (128 + 128) x 2 B = 128 KiB per token; 16-token blocks.
        pytest.param(
            "llama-3.1-8b-instruct", "auto", 128 * KiB, 16, 32 * 16 * 4 * KiB, id="llama3.1-8b-bf16"
        ),
        # fp8 KV halves it: 1 byte per element.
        pytest.param(
            "llama-3.1-8b-instruct", "fp8", 64 * KiB, 16, 32 * 16 * 2 * KiB, id="llama3.1-8b-fp8"
        ),
        # 28 layers x 4 KV heads x 256 x 2 B = 56 KiB per token.
        pytest.param(
            "qwen2.5-7b-instruct", "auto", 56 * KiB, 16, 28 * 16 * 2 * KiB, id="qwen2.5-7b"
        ),
        # 36 layers x 8 x 256 x 2 B = 144 KiB.
        pytest.param("qwen3-4b", "auto", 144 * KiB, 16, 36 * 16 * 4 * KiB, id="qwen3-4b"),
        # Gemma-2-2B: 26 layers x 4 x 512 x 2 B = 104 KiB; two groups of 13 (sliding, global).
        pytest.param("gemma-2-2b-it", "auto", 104 * KiB, 16, 13 * 16 * 4 * KiB, id="gemma2-2b"),
        # Qwen3.5-4B: only 8 of 32 layers hold KV: 8 x 4 x 512 x 2 B = 32 KiB (not 128 KiB).
        # GDN state page: conv (2*16*128 + 32*128) x 3 x 2 B + 32x128x128 x 4 B (fp32 SSM)
        # = 2,146,304 B; attention block = 16 x cdiv(2,146,304, 16 x 4,096) = 528 tokens.
        pytest.param(
            "qwen3.5-4b-fp8", "auto", 32 * KiB, 528, 8 * 528 * 4 * KiB, id="qwen3.5-4b-hybrid"
        ),
        # fp8 KV: 2,048 B per token per layer -> 16 x cdiv(2,146,304, 32,768) = 1,056 tokens.
        pytest.param(
            "qwen3.5-4b-fp8", "fp8", 16 * KiB, 1056, 8 * 1056 * 2 * KiB, id="qwen3.5-4b-hybrid-fp8"
        ),
        # Qwen3-Next-80B: 12 of 48 layers attention, 2 KV heads x 512 x 2 B = 2 KiB each;
        # bf16 SSM state: 24,576 x 2 + 524,288 x 2 = 1,097,728 B -> 16 x cdiv(., 32,768) = 544.
        pytest.param(
            "qwen3-next-80b-a3b-instruct",
            "auto",
            24 * KiB,
            544,
            12 * 544 * 2 * KiB,
            id="qwen3-next-80b-hybrid",
        ),
    ],
)
def test_profile_layouts_match_hand_computed_values(
    model: str,
    kv_dtype: KVCacheDType,
    kv_bytes_per_token: int,
    block_size: int,
    bytes_per_block: int,
) -> None:
    spec = resolve_model(model).spec
    layout = build_kv_layout(spec, CacheSettings(max_model_len=8192, kv_cache_dtype=kv_dtype))
    assert layout.kv_bytes_per_token == kv_bytes_per_token
    assert layout.block_size == block_size
    assert layout.bytes_per_block == bytes_per_block


def test_counting_every_qwen35_layer_as_attention_would_overestimate_kv_4x() -> None:
    spec = resolve_model("qwen3.5-4b-fp8").spec
    layout = build_kv_layout(spec, CacheSettings(max_model_len=32768))
    naive = spec.num_hidden_layers * layout.attention_page_bytes_per_token
    assert naive == 4 * layout.kv_bytes_per_token


def test_qwen35_groups_and_mamba_padding() -> None:
    layout = build_kv_layout(
        resolve_model("qwen3.5-4b-fp8").spec, CacheSettings(max_model_len=32768)
    )
    assert [(g.kind, g.num_layers, g.blocks_per_request) for g in layout.groups] == [
        ("full_attention", 8, 63),  # cdiv(32768, 528)
        ("linear_attention", 8, 2),  # align mode: running state + checkpoint
        ("linear_attention", 8, 2),
        ("linear_attention", 8, 2),
    ]
    assert layout.mamba_page_size_bytes == 2_146_304
    assert layout.page_size_bytes == 528 * 4096  # mamba page padded to the attention page
    assert layout.mamba_cache_mode == "align"


def test_without_prefix_caching_mamba_holds_one_block() -> None:
    layout = build_kv_layout(
        resolve_model("qwen3.5-4b-fp8").spec,
        CacheSettings(max_model_len=32768, enable_prefix_caching=False),
    )
    assert layout.mamba_cache_mode == "none"
    assert layout.blocks_per_request == 63 + 3 * 1


def test_gemma2_sliding_group_reserves_window_plus_in_flight_tokens() -> None:
    layout = build_kv_layout(resolve_model("gemma-2-2b-it").spec, CacheSettings(max_model_len=8192))
    blocks = {g.kind: g.blocks_per_request for g in layout.groups}
    # full: cdiv(8192, 16) = 512; sliding: cdiv(min(4095 + 2048, 8192), 16) + 1 = 385.
    assert blocks == {"sliding_attention": 385, "full_attention": 512}


@pytest.mark.parametrize(
    ("platform", "block_size", "expected"),
    [
        pytest.param("cuda", None, 16, id="cuda-default"),
        pytest.param("cpu", None, 128, id="cpu-default"),
        pytest.param("cuda", 32, 32, id="explicit"),
    ],
)
def test_dense_block_size_defaults_per_platform(
    platform: str, block_size: int | None, expected: int
) -> None:
    settings = CacheSettings.model_validate(
        {"platform": platform, "max_model_len": 4096, "block_size": block_size}
    )
    layout = build_kv_layout(resolve_model("qwen3-4b").spec, settings)
    assert layout.block_size == expected
