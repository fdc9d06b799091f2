"""KV page sizes, block sizes and groups for the shipped model profiles, against values computed
by hand from vLLM's formulas (planner/kv_layout.py cites them)."""

from __future__ import annotations

import pytest
from model_configs import ISSUE15_CONFIG

from planner import CacheSettings, build_kv_layout, compute_kv_capacity, model_spec_from_hf_config
from planner.units import KVCacheDType
from residency.capacity.profiles import resolve_model

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


# conv state: (2 x 1 x 128 + 2 x 128) x 3 x 2 B = 3,072 B; SSM state 2 x 128 x 128 elements.
_ISSUE15_FP32_STATE = 3_072 + 32_768 * 4  # 134,144 B
_ISSUE15_BF16_STATE = 3_072 + 32_768 * 2  # 68,608 B


@pytest.mark.parametrize(
    ("ssm_flag", "avx512_bf16", "ssm_dtype", "mamba_page", "block_size", "blocks", "tokens"),
    [
        # What vLLM CPU served in the issue: AVX512-BF16 host, auto -> float32 (cpu.py).
        # Block 128 x cdiv(134,144, 128 x 256) = 640; 2^30 // (640 x 256) = 6,553 blocks over
        # cdiv(32768, 640) + 3 x 2 = 58 blocks per request: int(6553 / 58 x 32768) = 3,702,219.
        pytest.param(
            "auto", True, "float32", _ISSUE15_FP32_STATE, 640, 6_553, 3_702_219, id="avx-auto"
        ),
        # What the planner printed in the issue: a bf16 state -> 128 x cdiv(68,608, 32,768) = 384;
        # 10,922 blocks / (86 + 6) x 32768 = 3,890,131.
        pytest.param(
            "auto", False, "bfloat16", _ISSUE15_BF16_STATE, 384, 10_922, 3_890_131, id="no-avx"
        ),
        # An explicit 16-bit SSM dtype survives on an AVX512-BF16 CPU (accelerated GDN backend).
        pytest.param(
            "bfloat16", True, "bfloat16", _ISSUE15_BF16_STATE, 384, 10_922, 3_890_131, id="avx-bf16"
        ),
        pytest.param(
            "float16", True, "float16", _ISSUE15_BF16_STATE, 384, 10_922, 3_890_131, id="avx-fp16"
        ),
        pytest.param(
            "float32", False, "float32", _ISSUE15_FP32_STATE, 640, 6_553, 3_702_219, id="fp32-flag"
        ),
    ],
)
def test_cpu_gdn_ssm_state_dtype_follows_vllm_cpu_rule(
    ssm_flag: str,
    avx512_bf16: bool,
    ssm_dtype: str,
    mamba_page: int,
    block_size: int,
    blocks: int,
    tokens: int,
) -> None:
    settings = CacheSettings.model_validate(
        {
            "platform": "cpu",
            "max_model_len": 32768,
            "mamba_ssm_cache_dtype": ssm_flag,
            "cpu_avx512_bf16": avx512_bf16,
        }
    )
    layout = build_kv_layout(model_spec_from_hf_config(ISSUE15_CONFIG), settings)
    capacity = compute_kv_capacity(layout, 1 << 30, 32768)
    assert layout.mamba_ssm_cache_dtype == ssm_dtype
    assert layout.mamba_cache_dtype == "bfloat16"
    assert layout.mamba_page_size_bytes == mamba_page
    assert (layout.block_size, capacity.num_blocks, capacity.kv_cache_tokens) == (
        block_size,
        blocks,
        tokens,
    )
    assert layout.mamba_ssm_cache_dtype_reason is not None
    assert f"--mamba-ssm-cache-dtype {ssm_flag}" in layout.mamba_ssm_cache_dtype_reason
    if ssm_flag == "auto":
        cited = "vllm/platforms/cpu.py" if avx512_bf16 else "mamba_utils.py"
        assert cited in layout.mamba_ssm_cache_dtype_reason


def test_cuda_ignores_the_cpu_avx512_rule() -> None:
    layout = build_kv_layout(
        model_spec_from_hf_config(ISSUE15_CONFIG),
        CacheSettings(max_model_len=32768, cpu_avx512_bf16=True),
    )
    # CUDA block 16: 16 x cdiv(68,608, 16 x 256) = 272.
    assert (layout.mamba_ssm_cache_dtype, layout.block_size) == ("bfloat16", 272)


def test_checkpoint_mamba_ssm_dtype_is_read_for_qwen35_only() -> None:
    # vllm/model_executor/models/config.py: only the Qwen3.5 config hooks read `mamba_ssm_dtype`.
    next_cfg = {**ISSUE15_CONFIG, "mamba_ssm_dtype": "float32"}
    qwen35_cfg = {**next_cfg, "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5"}
    settings = CacheSettings(max_model_len=32768)
    assert build_kv_layout(model_spec_from_hf_config(next_cfg), settings).block_size == 272
    qwen35 = build_kv_layout(model_spec_from_hf_config(qwen35_cfg), settings)
    assert qwen35.mamba_ssm_cache_dtype == "float32"
    assert qwen35.block_size == 16 * -(-_ISSUE15_FP32_STATE // (16 * 256))  # 528
    assert "config.json mamba_ssm_dtype float32" in (qwen35.mamba_ssm_cache_dtype_reason or "")
    # The flag wins over the checkpoint (vLLM only warns).
    flagged = build_kv_layout(
        model_spec_from_hf_config(qwen35_cfg),
        CacheSettings(max_model_len=32768, mamba_ssm_cache_dtype="bfloat16"),
    )
    assert flagged.mamba_ssm_cache_dtype == "bfloat16"


def test_qwen35_on_an_avx512_bf16_cpu_keeps_its_float32_checkpoint_state() -> None:
    spec = resolve_model("qwen3.5-4b-fp8").spec
    cpu = CacheSettings(platform="cpu", max_model_len=32768, cpu_avx512_bf16=True)
    layout = build_kv_layout(spec, cpu)
    # config.json asks float32 before the CPU hook runs: 2,146,304 B, 4,096 B per token,
    # CPU block 128 -> 128 x cdiv(2,146,304, 128 x 4,096) = 640.
    assert (layout.mamba_ssm_cache_dtype, layout.mamba_page_size_bytes) == ("float32", 2_146_304)
    assert layout.block_size == 640
