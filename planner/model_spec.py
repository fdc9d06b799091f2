"""What the capacity math needs to know about a model, read from its HF `config.json` dict.

Pure: takes an already-parsed mapping (from a file, a profile or a server), never reads files.
The layer kinds mirror how vLLM builds one KV-cache spec per layer: full attention
(`FullAttentionSpec`), sliding-window attention (`SlidingWindowSpec`) and Gated DeltaNet linear
attention (`MambaSpec`, vllm/model_executor/models/qwen3_next.py, qwen3_5.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import ModelConfigError
from planner.units import HF_DTYPE_ALIASES, ModelDType

LayerKind = Literal["full_attention", "sliding_attention", "linear_attention"]

_LAYER_TYPE_ALIASES: dict[str, LayerKind] = {
    "full_attention": "full_attention",
    "attention": "full_attention",
    "global": "full_attention",
    "sliding_attention": "sliding_attention",
    "sliding_window": "sliding_attention",
    "local": "sliding_attention",
    "linear_attention": "linear_attention",
}

# Model types whose configs carry a `sliding_window` but alternate local / global layers
# without listing `layer_types` (HF Gemma2: `is_sliding = not bool(layer_idx % 2)`).
_ALTERNATING_SLIDING = {"gemma2"}


class GdnSpec(BaseModel):
    """Gated DeltaNet (linear attention) state dimensions of one layer."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    num_k_heads: int = Field(ge=1, description="linear_num_key_heads")
    num_v_heads: int = Field(ge=1, description="linear_num_value_heads")
    head_k_dim: int = Field(ge=1, description="linear_key_head_dim")
    head_v_dim: int = Field(ge=1, description="linear_value_head_dim")
    conv_kernel_size: int = Field(ge=2, description="linear_conv_kernel_dim")


class ModelSpec(BaseModel):
    """The facts of a model that decide its KV-cache footprint and weights size."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    architecture: str = Field(description="First entry of config.json `architectures`.")
    model_type: str = Field(description="config.json `model_type` (of the text model).")
    dtype: ModelDType = Field(description="Weights dtype from config.json (`torch_dtype`).")
    layer_kinds: tuple[LayerKind, ...] = Field(
        min_length=1, description="Kind of every decoder layer, in order."
    )
    num_attention_heads: int = Field(ge=1, description="Query heads.")
    num_kv_heads: int = Field(ge=1, description="Key/value heads (GQA/MQA).")
    head_size: int = Field(ge=1, description="Per-head key dimension (`head_dim`).")
    head_size_v: int = Field(ge=1, description="Per-head value dimension.")
    sliding_window: int | None = Field(
        default=None, ge=1, description="Window of sliding-attention layers, tokens."
    )
    hidden_size: int = Field(ge=1, description="Residual stream width.")
    intermediate_size: int | None = Field(default=None, ge=1, description="MLP width.")
    vocab_size: int = Field(ge=1, description="Vocabulary size.")
    max_position_embeddings: int | None = Field(
        default=None, ge=1, description="Longest context the model was configured for."
    )
    rope_scaling_factor: float = Field(
        default=1.0,
        gt=0,
        description="RoPE scaling factor vLLM multiplies max_position_embeddings by (1: none, "
        "or a RoPE type whose positions are already scaled: yarn, llama3, longrope).",
    )
    gdn: GdnSpec | None = Field(default=None, description="Linear-attention dimensions.")
    mamba_ssm_dtype: ModelDType | None = Field(
        default=None,
        description="SSM state dtype the checkpoint asks for (Qwen3.5 `mamba_ssm_dtype`).",
    )
    quantization: str | None = Field(
        default=None, description="`quantization_config.quant_method`, e.g. fp8."
    )
    tie_word_embeddings: bool = Field(
        default=False, description="The output head shares the input embedding's weights."
    )

    @property
    def num_hidden_layers(self) -> int:
        """Decoder layers of every kind."""
        return len(self.layer_kinds)

    @property
    def is_hybrid(self) -> bool:
        """True when some layers keep a recurrent (mamba / GDN) state instead of KV."""
        return "linear_attention" in self.layer_kinds

    def count(self, kind: LayerKind) -> int:
        """Number of layers of one kind."""
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def max_model_len_limit(self) -> int | None:
        """The longest --max-model-len vLLM accepts for this config: max_position_embeddings
        times the RoPE factor (vllm/config/model.py _get_and_verify_max_len); None: unknown."""
        if self.max_position_embeddings is None:
            return None
        return int(self.max_position_embeddings * self.rope_scaling_factor)


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Merge a multimodal config's `text_config` over its top level (Qwen3.5, Gemma3, ...)."""
    merged = {k: v for k, v in config.items() if k != "text_config"}
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged.update(text)
    return merged


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ModelConfigError(f"model config lacks `{key}`")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"model config `{key}` must be a positive integer, got {value!r}")
    return value


# RoPE types whose max_position_embeddings is already the scaled length: vLLM does not multiply
# it by `factor` (vllm/config/model.py _get_and_verify_max_len).
_PRESCALED_ROPE = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


def _rope_factor(cfg: Mapping[str, Any]) -> float:
    """The factor vLLM scales the derived max_model_len by (`rope_scaling` or
    `rope_parameters`; 1.0 without one, for a pre-scaled RoPE type, or a null factor)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return 1.0
    kind = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if kind in _PRESCALED_ROPE or not isinstance(factor, int | float) or factor <= 0:
        return 1.0
    return float(factor)


def _dtype(cfg: Mapping[str, Any], key: str) -> ModelDType | None:
    raw = cfg.get(key)
    if raw is None:
        return None
    dtype = HF_DTYPE_ALIASES.get(str(raw).removeprefix("torch."))
    if dtype is None:
        raise ModelConfigError(f"model config `{key}` has unsupported dtype {raw!r}")
    return dtype


def _layer_kinds(cfg: Mapping[str, Any], model_type: str) -> tuple[LayerKind, ...]:
    num_layers = _int(cfg, "num_hidden_layers")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ModelConfigError(
                f"model config `layer_types` must list {num_layers} layers "
                f"(num_hidden_layers), got {layer_types!r:.80}"
            )
        kinds = []
        for raw in layer_types:
            kind = _LAYER_TYPE_ALIASES.get(str(raw))
            if kind is None:
                raise ModelConfigError(f"model config `layer_types` has unknown kind {raw!r}")
            kinds.append(kind)
        return tuple(kinds)
    interval = cfg.get("full_attention_interval")
    if interval is not None:
        # Qwen3-Next / Qwen3.5: every `interval`-th layer is full attention, the rest GDN
        # (transformers configuration_qwen3_next.py: `bool((i + 1) % interval)` → linear).
        step = _int(cfg, "full_attention_interval")
        return tuple(
            "full_attention" if (i + 1) % step == 0 else "linear_attention"
            for i in range(num_layers)
        )
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        if model_type in _ALTERNATING_SLIDING:
            return tuple(
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
            )
        return tuple("sliding_attention" for _ in range(num_layers))
    return tuple("full_attention" for _ in range(num_layers))


def model_spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """Read a `ModelSpec` from an HF config.json mapping; `ModelConfigError` names a bad field."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"model config must be a JSON object, got {type(config).__name__}")
    cfg = _text_config(config)
    architectures = config.get("architectures") or cfg.get("architectures") or []
    if not isinstance(architectures, list) or not architectures:
        raise ModelConfigError("model config lacks `architectures`")
    if cfg.get("kv_lora_rank") is not None:
        raise ModelConfigError(
            "MLA models (kv_lora_rank, e.g. DeepSeek) are not supported by the planner yet"
        )
    model_type = str(cfg.get("model_type") or config.get("model_type") or "")
    num_heads = _int(cfg, "num_attention_heads")
    hidden_size = _int(cfg, "hidden_size")
    head_size = _int(cfg, "head_dim", cfg.get("head_dim") or hidden_size // num_heads)
    kinds = _layer_kinds(cfg, model_type)
    gdn = None
    if "linear_attention" in kinds:
        gdn = GdnSpec(
            num_k_heads=_int(cfg, "linear_num_key_heads"),
            num_v_heads=_int(cfg, "linear_num_value_heads"),
            head_k_dim=_int(cfg, "linear_key_head_dim"),
            head_v_dim=_int(cfg, "linear_value_head_dim"),
            conv_kernel_size=_int(cfg, "linear_conv_kernel_dim"),
        )
    quant = cfg.get("quantization_config") or config.get("quantization_config")
    dtype = _dtype(cfg, "torch_dtype") or _dtype(cfg, "dtype") or _dtype(config, "torch_dtype")
    sliding = cfg.get("sliding_window") if "sliding_attention" in kinds else None
    return ModelSpec(
        architecture=str(architectures[0]),
        model_type=model_type,
        dtype=dtype or "bfloat16",
        layer_kinds=kinds,
        num_attention_heads=num_heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", num_heads),
        head_size=head_size,
        head_size_v=_int(cfg, "v_head_dim", head_size),
        sliding_window=int(sliding) if sliding else None,
        hidden_size=hidden_size,
        intermediate_size=cfg.get("intermediate_size") or None,
        vocab_size=_int(cfg, "vocab_size"),
        max_position_embeddings=cfg.get("max_position_embeddings") or None,
        rope_scaling_factor=_rope_factor(cfg),
        gdn=gdn,
        mamba_ssm_dtype=_dtype(cfg, "mamba_ssm_dtype"),
        quantization=str(quant["quant_method"])
        if isinstance(quant, Mapping) and "quant_method" in quant
        else None,
        tie_word_embeddings=bool(
            cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
        ),
    )
