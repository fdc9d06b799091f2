"""Tensor and pipeline parallel on GPU configurations, against vLLM's own code as the oracle.

No GPU and no server: vLLM's functions run in-process on the KV specs a GPU host's workers would
report. `ModelConfig.get_num_kv_heads` gives the heads per rank, `get_pp_indices` each stage's
layers, and `get_kv_cache_configs` + `get_kv_cache_capacity`
(vllm/v1/core/kv_cache_utils.py) the blocks per worker and the "KV cache size: N tokens" figure.
The planner must produce the same numbers from the same per-rank KV bytes (its own memory
estimate, so the arithmetic after it is what is checked; the live agreement at TP=2 / PP=2 on
vLLM CPU is in tests/test_agreement_vllm.py).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

# find_spec, not an import: collecting the suite stays quick (vLLM imports torch).
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM's CPU build is installed by make install", allow_module_level=True)

from planner import CacheSettings, build_kv_layout, compute_kv_capacity
from planner.units import DTYPE_BYTES
from residency.capacity.profiles import load_gpu_profile, resolve_model
from residency.capacity.ranks import HostGpus, estimate_rank_memory


def _vllm_capacity(
    spec_model: Any, tp: int, pp: int, kv_bytes: list[int], max_model_len: int, block: int
) -> tuple[int, list[int], int]:
    """vLLM's heads per rank, its blocks per worker and its KV-cache tokens."""
    import torch
    from vllm.config import ModelConfig, VllmConfig
    from vllm.distributed.utils import get_pp_indices
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    arch = SimpleNamespace(total_num_kv_heads=spec_model.num_kv_heads)
    heads = ModelConfig.get_num_kv_heads(
        SimpleNamespace(use_mla=False, model_arch_config=arch),  # type: ignore[arg-type]
        SimpleNamespace(tensor_parallel_size=tp),  # type: ignore[arg-type]
    )
    config = VllmConfig()
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(max_model_len=max_model_len, original_max_model_len=max_model_len),
    )
    config.cache_config.block_size = block
    config.cache_config.kv_cache_layout = "LBNHC"
    dtype = {2: torch.bfloat16, 1: torch.float8_e4m3fn}[DTYPE_BYTES[spec_model.dtype]]
    workers = []
    for stage in range(pp):
        start, end = get_pp_indices(spec_model.num_hidden_layers, stage, pp)
        layer_specs = {
            f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
                block_size=block, num_kv_heads=heads, head_size=spec_model.head_size, dtype=dtype
            )
            for i in range(start, end)
        }
        workers.extend([layer_specs] * tp)  # every TP rank of a stage reports the same specs
    memory = [kv_bytes[rank // tp] for rank in range(tp * pp)]
    configs = kv_cache_utils.get_kv_cache_configs(config, workers, memory)
    scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    tokens, _ = kv_cache_utils.get_kv_cache_capacity(config, scheduler)
    return heads, [c.num_blocks for c in configs], tokens


@pytest.mark.parametrize(
    ("model_name", "gpu", "tp", "pp"),
    [
        pytest.param("llama-3.1-8b-instruct", "rtx4090-24gb", 2, 1, id="llama8b-4090-tp2"),
        pytest.param("llama-3.1-8b-instruct", "rtx4090-24gb", 1, 2, id="llama8b-4090-pp2"),
        pytest.param("llama-3.1-8b-instruct", "l4-24gb", 2, 2, id="llama8b-l4-tp2-pp2"),
        pytest.param("llama-3.1-8b-instruct", "h100-80gb", 16, 1, id="llama8b-tp16-replicated"),
        pytest.param("qwen2.5-7b-instruct", "rtx4090-24gb", 4, 1, id="qwen25-7b-tp4"),
        pytest.param("qwen3-8b", "a10g-24gb", 2, 3, id="qwen3-8b-tp2-pp3-uneven"),
    ],
)
def test_planner_equals_vllms_own_kv_cache_utils(
    model_name: str, gpu: str, tp: int, pp: int
) -> None:
    model = resolve_model(model_name)
    total = load_gpu_profile(gpu).total_memory_bytes
    memory = estimate_rank_memory(
        model,
        HostGpus(gpu, (total,) * (tp * pp)),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=0.9,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        enforce_eager=False,
    )
    kv_bytes = [m.kv_cache_memory_bytes for m in memory]
    settings = CacheSettings(
        max_model_len=32768, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    layout = build_kv_layout(model.spec, settings)
    capacity = compute_kv_capacity(layout, kv_bytes[0] if pp == 1 else tuple(kv_bytes), 32768)
    heads, blocks, tokens = _vllm_capacity(model.spec, tp, pp, kv_bytes, 32768, layout.block_size)
    assert layout.num_kv_heads_per_rank == heads
    assert [capacity.num_blocks] * (tp * pp) == blocks
    assert capacity.kv_cache_tokens == tokens
