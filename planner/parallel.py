"""Tensor and pipeline parallel: what each rank holds, mirroring vLLM 0.32.

Sources:
- KV heads per rank: vllm/config/model.py `ModelConfig.get_num_kv_heads`,
  ``max(1, total_num_kv_heads // tensor_parallel_size)``: the KV heads are split over the TP
  ranks, and replicated when there are fewer KV heads than ranks (each rank keeps one).
- What TP sizes a model admits: vllm/config/model.py `verify_with_parallel_config` (query heads
  divisible by TP) and vllm/model_executor/layers/linear.py `QKVParallelLinear` (KV heads divisible
  by TP, or TP divisible by KV heads when they are replicated).
- GDN state per rank: vllm/model_executor/layers/mamba/mamba_utils.py
  `gated_delta_net_state_shape(tp_world_size, ...)`: conv dim and value heads divided by TP.
- Layers per pipeline stage: vllm/distributed/utils.py `get_pp_indices`: an even split, the
  remainder spread over all stages but the last, from the second-to-last backwards.
- Blocks with PP: vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs` groups the layers of the
  whole model, projects the groups onto each stage's layers
  (`_project_kv_cache_groups_to_worker`), sizes every worker's pool from its own memory and
  layers, then gives every worker the smallest worker's block count.

Worked example (Llama-3.1-8B, 8 KV heads, TP=2, bf16): 4 KV heads per rank, a token costs
32 layers x 4 x 256 x 2 B = 64 KiB per rank instead of 128 KiB on one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import ModelConfigError


def kv_heads_per_rank(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads one TP rank stores (config/model.py `get_num_kv_heads`)."""
    return max(1, num_kv_heads // tensor_parallel_size)


def check_tensor_parallel(
    num_attention_heads: int, num_kv_heads: int, tensor_parallel_size: int
) -> None:
    """`ModelConfigError` in vLLM's terms when the heads do not split over the TP ranks."""
    tp = tensor_parallel_size
    if num_attention_heads % tp:
        raise ModelConfigError(
            f"--tensor-parallel-size {tp}: the model's {num_attention_heads} attention heads "
            f"are not divisible by it (vllm/config/model.py verify_with_parallel_config); "
            f"use a divisor of {num_attention_heads}"
        )
    if num_kv_heads >= tp and num_kv_heads % tp:
        raise ModelConfigError(
            f"--tensor-parallel-size {tp}: the model's {num_kv_heads} KV heads are not "
            "divisible by it (vllm/model_executor/layers/linear.py QKVParallelLinear)"
        )
    if num_kv_heads < tp and tp % num_kv_heads:
        raise ModelConfigError(
            f"--tensor-parallel-size {tp}: {num_kv_heads} KV heads cannot be replicated evenly "
            f"over {tp} ranks (vllm/model_executor/layers/linear.py QKVParallelLinear)"
        )


def divide_for_tp(value: int, tensor_parallel_size: int, what: str) -> int:
    """`vllm.distributed.utils.divide`: an exact split over the TP ranks."""
    if value % tensor_parallel_size:
        raise ModelConfigError(
            f"--tensor-parallel-size {tensor_parallel_size}: {what} ({value}) is not divisible "
            "by it (vllm/model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape)"
        )
    return value // tensor_parallel_size


def pp_layer_ranges(num_hidden_layers: int, pipeline_parallel_size: int) -> tuple[range, ...]:
    """Each pipeline stage's decoder layers (distributed/utils.py `get_pp_indices`, without a
    VLLM_PP_LAYER_PARTITION override).

    Worked example: 30 layers over 4 stages: 7 each, remainder 2 goes to stages 2 and 1 ->
    [7, 8, 8, 7].
    """
    pp = pipeline_parallel_size
    if pp > num_hidden_layers:
        raise ModelConfigError(
            f"--pipeline-parallel-size {pp}: the model has only {num_hidden_layers} layers"
        )
    partitions = [num_hidden_layers // pp] * pp
    for i in range(2, num_hidden_layers % pp + 2):
        partitions[-i] += 1
    ranges: list[range] = []
    start = 0
    for n in partitions:
        ranges.append(range(start, start + n))
        start += n
    return tuple(ranges)


def group_layer_indices(
    layer_kinds: Sequence[str], groups: Sequence[tuple[str, int]]
) -> list[tuple[int, ...]]:
    """The decoder-layer indices of each KV-cache group, as vLLM deals them: per kind in layer
    order, group i of a kind split into n groups takes that kind's layers[i::n]
    (kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`, which deals them so that every
    PP stage holds a share of every group)."""
    per_kind: dict[str, list[int]] = {}
    for i, kind in enumerate(layer_kinds):
        per_kind.setdefault(kind, []).append(i)
    groups_of_kind: dict[str, int] = {}
    for kind, _ in groups:
        groups_of_kind[kind] = groups_of_kind.get(kind, 0) + 1
    seen: dict[str, int] = {}
    out: list[tuple[int, ...]] = []
    for kind, _ in groups:
        i = seen.get(kind, 0)
        seen[kind] = i + 1
        out.append(tuple(per_kind[kind][i :: groups_of_kind[kind]]))
    return out


def stage_group_layers(
    group_layers: Sequence[tuple[int, ...]], stages: Sequence[range]
) -> list[tuple[int, ...]]:
    """Per stage, how many of each group's layers it holds (kv_cache_utils.py
    `_project_kv_cache_groups_to_worker`)."""
    return [
        tuple(sum(1 for i in layers if i in stage) for layers in group_layers) for stage in stages
    ]


__all__ = [
    "check_tensor_parallel",
    "divide_for_tp",
    "group_layer_indices",
    "kv_heads_per_rank",
    "pp_layer_ranges",
    "stage_group_layers",
]
