"""Tensor and pipeline parallel in the capacity model, against hand-computed values from vLLM's
rules (planner/parallel.py cites them). The live agreement with vLLM CPU at TP=2 and PP=2 is in
tests/test_agreement_vllm.py."""

from __future__ import annotations

import pytest
from model_configs import ISSUE15_CONFIG

from planner import (
    CacheSettings,
    ModelConfigError,
    Reserves,
    build_kv_layout,
    compute_kv_capacity,
    estimate_gpu_kv_memory,
    model_spec_from_hf_config,
    plan_capacity,
)
from planner.memory import rank_weights_bytes
from planner.parallel import kv_heads_per_rank, pp_layer_ranges
from residency.capacity.profiles import load_gpu_profile, resolve_model
from residency.capacity.ranks import HostGpus, estimate_rank_memory


@pytest.mark.parametrize(
    ("layers", "pp", "sizes"),
    [
        pytest.param(32, 2, [16, 16], id="even"),
        # 30 / 4 = 7 rem 2: the remainder goes to stages -2 and -3 (get_pp_indices).
        pytest.param(30, 4, [7, 8, 8, 7], id="remainder-in-the-middle"),
        pytest.param(5, 2, [3, 2], id="odd-two-stages"),
        pytest.param(32, 3, [11, 11, 10], id="last-stage-lightest"),
    ],
)
def test_pp_layer_ranges_follow_get_pp_indices(layers: int, pp: int, sizes: list[int]) -> None:
    ranges = pp_layer_ranges(layers, pp)
    assert [len(r) for r in ranges] == sizes
    assert ranges[0].start == 0
    assert ranges[-1].stop == layers


@pytest.mark.parametrize(
    ("kv_heads", "tp", "per_rank"),
    [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (1, 4, 1)],
)
def test_kv_heads_split_then_replicate(kv_heads: int, tp: int, per_rank: int) -> None:
    assert kv_heads_per_rank(kv_heads, tp) == per_rank


def _llama_layout(tp: int, pp: int = 1) -> object:
    spec = resolve_model("llama-3.1-8b-instruct").spec
    settings = CacheSettings(
        max_model_len=32768, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    return build_kv_layout(spec, settings)


def test_llama_tp2_on_rtx4090_hand_computed() -> None:
    """The issue's target: Llama-3.1-8B on two RTX 4090s (24,564 MiB each), TP=2, 0.9.

    Per rank: ceil(25,757,220,864 x 0.9) = 23,181,498,778 B requested; weights 16,060,522,496 / 2
    = 8,030,261,248; activation 2048 x (2 x 14,336 / 2 + 8 x 4,096) x 2 B + 256 x 128,256 x 8 B
    = 192,937,984 + 262,668,288 = 455,606,272; non-torch 200 MiB; CUDA graphs 256 MiB -> KV
    14,217,480,602 B. A block is 32 layers x 16 tokens x 4 heads x 256 x 2 B = 1 MiB -> 13,558
    blocks; a 32K request holds 2,048 -> int(13,558 / 2,048 x 32,768) = 216,928 tokens (one
    GPU: 46,752).
    """
    model = resolve_model("llama-3.1-8b-instruct")
    total = load_gpu_profile("rtx4090-24gb").total_memory_bytes
    memory = estimate_gpu_kv_memory(
        total_memory_bytes=total,
        gpu_memory_utilization=0.9,
        weights_bytes=model.weights_bytes or 0,
        weights_source="profile",
        model=model.spec,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        tensor_parallel_size=2,
    )
    assert memory.requested_memory_bytes == 23_181_498_778
    assert [t.bytes for t in memory.terms[:2]] == [8_030_261_248, 455_606_272]
    assert memory.kv_cache_memory_bytes == 14_217_480_602
    settings = CacheSettings(max_model_len=32768, tensor_parallel_size=2)
    plan = plan_capacity(model.spec, settings, memory, Reserves())
    assert plan.layout.bytes_per_block == 1 << 20
    assert plan.capacity.num_blocks == 13_558
    assert plan.capacity.kv_cache_tokens == 216_928


def test_pipeline_stages_take_the_smallest_block_count() -> None:
    """Llama-3.1-8B on RTX 4090s, PP=2: stage 0 holds the embedding, stage 1 the head and the
    sampler's logits, so stage 1 has less KV memory and sets every stage's blocks."""
    model = resolve_model("llama-3.1-8b-instruct")
    host = HostGpus("rtx4090 x 2", (load_gpu_profile("rtx4090-24gb").total_memory_bytes,) * 2)
    memory = estimate_rank_memory(
        model,
        host,
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.9,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        enforce_eager=False,
    )
    assert [m.layers for m in memory] == [(0, 16), (16, 32)]
    # Body 16,060,522,496 - 2 x 1,050,673,152 (embedding, untied head) split 16/16, plus one
    # vocab matrix on each end.
    assert [m.terms[0].bytes for m in memory] == [8_030_261_248, 8_030_261_248]
    # The sampler's logits (256 x 128,256 x 8 B) are on the last stage only.
    assert memory[1].terms[1].bytes - memory[0].terms[1].bytes == 262_668_288
    plan = plan_capacity(
        model.spec,
        CacheSettings(max_model_len=32768, pipeline_parallel_size=2),
        memory,
        Reserves(),
    )
    assert plan.layout.stage_layers == ((0, 16), (16, 32))
    blocks = plan.capacity.stage_num_blocks
    assert blocks == tuple(m.kv_cache_memory_bytes // (1 << 20) for m in memory)
    assert plan.capacity.num_blocks == min(blocks) == blocks[1]


def test_uneven_stages_size_blocks_by_the_fullest_stage() -> None:
    """A 5-layer dense model over 2 stages holds [3, 2] layers: a block costs 3 layers' pages
    on stage 0, so 1 GiB per rank gives 1 GiB // (3 x page) blocks, not // (5 x page)."""
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": 5,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 8000,
        "torch_dtype": "bfloat16",
    }
    spec = model_spec_from_hf_config(cfg)
    settings = CacheSettings(platform="cpu", max_model_len=32768, pipeline_parallel_size=2)
    layout = build_kv_layout(spec, settings)
    page = 128 * 2 * (64 + 64) * 2  # block 128, 2 KV heads x (64 + 64) x bf16
    assert layout.stage_bytes_per_block == (3 * page, 2 * page)
    assert compute_kv_capacity(layout, 1 << 30, 32768).num_blocks == (1 << 30) // (3 * page)


def test_hybrid_tp2_halves_the_gdn_state_and_replicates_the_kv_head() -> None:
    """Issue #15's hybrid (1 KV head, GDN 1 key / 2 value heads of 128) at TP=2, CPU with
    AVX512-BF16 (fp32 SSM state): the state halves to 64 x 128 x 128 x 4 + (256 + 128) / 2 x 3 x
    2 = 65,536 + ... per rank; the single KV head is replicated (256 B a token on each rank)."""
    spec = model_spec_from_hf_config(ISSUE15_CONFIG)
    one = build_kv_layout(
        spec, CacheSettings(platform="cpu", max_model_len=32768, cpu_avx512_bf16=True)
    )
    two = build_kv_layout(
        spec,
        CacheSettings(
            platform="cpu", max_model_len=32768, cpu_avx512_bf16=True, tensor_parallel_size=2
        ),
    )
    assert one.mamba_page_size_bytes == 134_144
    # conv (128 x 2 + 256) / 2 = 256 channels x 3 x 2 B = 1,536; SSM 1 x 128 x 128 x 4 = 65,536.
    assert two.mamba_page_size_bytes == 67_072
    assert two.num_kv_heads_per_rank == 1
    assert two.attention_page_bytes_per_token == one.attention_page_bytes_per_token == 256
    assert two.block_size == 128 * -(-67_072 // (128 * 256))


@pytest.mark.parametrize(
    ("tp", "match"),
    [
        pytest.param(3, "32 attention heads are not divisible", id="heads"),
        pytest.param(64, "attention heads are not divisible", id="too-many-ranks"),
    ],
)
def test_tp_sizes_vllm_refuses_are_refused(tp: int, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        _llama_layout(tp)


def test_more_stages_than_layers_is_refused() -> None:
    spec = model_spec_from_hf_config(ISSUE15_CONFIG)
    with pytest.raises(ModelConfigError, match="only 4 layers"):
        build_kv_layout(spec, CacheSettings(max_model_len=1024, pipeline_parallel_size=5))


def test_tied_head_is_copied_on_the_last_stage() -> None:
    spec = model_spec_from_hf_config({**ISSUE15_CONFIG, "tie_word_embeddings": True})
    embed = 8000 * 128 * 2
    total = 10 * embed
    stages = pp_layer_ranges(4, 2)
    shares = [rank_weights_bytes(spec, total, 1, s) for s in stages]
    body = total - embed
    assert shares == [body * 2 // 4 + embed, body * 2 // 4 + embed]
