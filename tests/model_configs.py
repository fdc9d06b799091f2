"""HF config.json mappings shared by the planner's unit and CLI tests (no weights, no files)."""

from __future__ import annotations

# Issue #15's tiny Qwen3-Next: 3 GDN + 1 full-attention layer, 1 KV head x head_dim 64 (256 B per
# attention token), GDN 1 key / 2 value heads of 128, conv kernel 4, bf16 weights.
ISSUE15_CONFIG: dict[str, object] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 8000,
    "dtype": "bfloat16",
}
