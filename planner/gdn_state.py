"""The state of a Gated DeltaNet (linear-attention) layer in vLLM's KV cache: the SSM state's
dtype and the bytes of one layer's page (the rules and sources are in `kv_layout`'s docstring)."""

from __future__ import annotations

from planner.errors import ModelConfigError
from planner.model_spec import ModelSpec
from planner.parallel import divide_for_tp
from planner.units import DTYPE_BYTES

# Architectures whose config hook copies the checkpoint's `mamba_ssm_dtype` into an "auto"
# --mamba-ssm-cache-dtype (vllm/model_executor/models/config.py MODELS_CONFIG_MAP entries that
# inherit Qwen3_5ForConditionalGenerationConfig.verify_and_update_config).
CONFIG_SSM_DTYPE_ARCHITECTURES = frozenset(
    {
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "ColQwen3_5",
    }
)


def resolve_ssm_dtype(
    model: ModelSpec, requested: str, platform: str, cpu_avx512_bf16: bool, conv_dtype: str
) -> tuple[str, str]:
    """The GDN recurrent-state dtype vLLM will use, and the rule that chose it (module
    docstring, steps 1-3; `requested`: --mamba-ssm-cache-dtype)."""
    source = f"--mamba-ssm-cache-dtype {requested}"
    if (
        requested == "auto"
        and model.mamba_ssm_dtype
        and model.architecture in CONFIG_SSM_DTYPE_ARCHITECTURES
    ):
        # vllm/model_executor/models/config.py Qwen3_5ForConditionalGenerationConfig.
        requested = model.mamba_ssm_dtype
        source = (
            f"config.json mamba_ssm_dtype {requested} (vllm/model_executor/models/config.py "
            "Qwen3_5ForConditionalGenerationConfig, --mamba-ssm-cache-dtype auto)"
        )
    if platform == "cpu" and cpu_avx512_bf16:
        if requested in ("float16", "bfloat16"):
            # The accelerated GDN backend stores 16-bit state when asked explicitly.
            return requested, (
                f"{source}; kept on an AVX512-BF16 CPU (vllm/platforms/cpu.py: 16-bit SSM "
                "state for the accelerated GDN backend)"
            )
        if requested != "float32":
            # vllm/platforms/cpu.py check_and_update_config: "Reset SSM cache type to float32
            # for accelerated GDN mamba backend".
            return "float32", (
                f"{source} reset to float32 on an AVX512-BF16 CPU (vllm/platforms/cpu.py "
                "check_and_update_config); --mamba-ssm-cache-dtype bfloat16 keeps 16-bit state"
            )
    if requested == "auto":
        # vllm/model_executor/layers/mamba/mamba_utils.py `_mamba_state_dtype`.
        cpu_note = (
            "; no AVX512-BF16 on the CPU, so vllm/platforms/cpu.py keeps it"
            if platform == "cpu"
            else ""
        )
        return conv_dtype, (
            f"{source}: the conv-state dtype {conv_dtype} (vllm/model_executor/layers/mamba/"
            f"mamba_utils.py _mamba_state_dtype){cpu_note}"
        )
    return requested, source


def gdn_page_bytes(model: ModelSpec, conv_dtype: str, ssm_dtype: str, tp: int) -> int:
    """Bytes of one Gated DeltaNet layer's state (conv + SSM) on one rank."""
    gdn = model.gdn
    if gdn is None:
        raise ModelConfigError("hybrid model lacks linear-attention dimensions")
    # mamba_utils.gated_delta_net_state_shape: conv state (conv_dim / tp, kernel - 1) and
    # temporal state (num_v_heads / tp, head_v_dim, head_k_dim).
    conv_dim = gdn.head_k_dim * gdn.num_k_heads * 2 + gdn.head_v_dim * gdn.num_v_heads
    conv_elems = divide_for_tp(conv_dim, tp, "the GDN conv dim") * (gdn.conv_kernel_size - 1)
    v_heads = divide_for_tp(gdn.num_v_heads, tp, "linear_num_value_heads")
    ssm_elems = v_heads * gdn.head_v_dim * gdn.head_k_dim
    return conv_elems * DTYPE_BYTES[conv_dtype] + ssm_elems * DTYPE_BYTES[ssm_dtype]
