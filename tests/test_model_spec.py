"""Reading model facts from HF config.json mappings, and refusing malformed ones."""

from __future__ import annotations

from typing import Any

import pytest

from planner import ModelConfigError, model_spec_from_hf_config

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    spec = model_spec_from_hf_config(LLAMA)
    assert (spec.head_size, spec.head_size_v, spec.num_kv_heads) == (128, 128, 8)
    assert spec.layer_kinds == ("full_attention",) * 32
    assert not spec.is_hybrid


def test_missing_kv_heads_means_multi_head_attention() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert model_spec_from_hf_config(cfg).num_kv_heads == 32


def test_multimodal_text_config_is_merged_and_interval_makes_gdn_layers() -> None:
    cfg = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "vocab_size": 1000,
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "mamba_ssm_dtype": "float32",
        },
    }
    spec = model_spec_from_hf_config(cfg)
    assert spec.layer_kinds == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",
    ) * 3 + ("full_attention",)
    assert spec.is_hybrid
    assert spec.gdn is not None
    assert spec.mamba_ssm_dtype == "float32"


def test_qwen2_sliding_window_is_ignored_unless_enabled() -> None:
    cfg = {**LLAMA, "sliding_window": 131072, "use_sliding_window": False}
    assert model_spec_from_hf_config(cfg).sliding_window is None


def test_gemma2_alternates_sliding_and_global_layers() -> None:
    cfg = {**LLAMA, "model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 4096}
    spec = model_spec_from_hf_config(cfg)
    assert spec.layer_kinds == (
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    )
    assert spec.sliding_window == 4096


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        pytest.param({"num_hidden_layers": None}, "num_hidden_layers", id="missing-layers"),
        pytest.param({"num_attention_heads": 0}, "num_attention_heads", id="zero-heads"),
        pytest.param({"architectures": []}, "architectures", id="no-architectures"),
        pytest.param({"torch_dtype": "int3"}, "dtype", id="bad-dtype"),
        pytest.param({"layer_types": ["full_attention"]}, "layer_types", id="short-layer-types"),
        pytest.param({"kv_lora_rank": 512}, "MLA", id="mla-unsupported"),
    ],
)
def test_malformed_configs_name_the_field(change: dict[str, Any], fragment: str) -> None:
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError, match=fragment):
        model_spec_from_hf_config(cfg)
