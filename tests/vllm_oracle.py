"""vLLM's own capacity numbers for a model directory and `vllm serve` flags, without a server.

A vLLM CPU server resolves its configuration (`EngineArgs.create_engine_config`: the platform's
block size, the hybrid attention-block growth and mamba page padding, the GDN state dtypes),
asks every layer for its KV-cache spec, and hands the specs and the KV bytes to
`get_kv_cache_configs` / `get_kv_cache_capacity` (vllm/v1/core/kv_cache_utils.py), which group
the layers, unify page sizes and count blocks and tokens. This module runs the same functions
in-process: the configuration and the counting are vLLM's; only the per-layer spec is assembled
here, field for field as the layers build it (vllm/model_executor/layers/attention/attention.py
`Attention.get_kv_cache_spec`, vllm/model_executor/layers/mamba/abstract.py
`MambaBase.get_kv_cache_spec`), from vLLM's own readers (`ModelConfig.get_num_kv_heads`,
`get_head_size`, the model class's `get_mamba_state_shape_from_config` /
`get_mamba_state_dtype_from_config`, `get_pp_indices`).

It stands in for a server start (~30 s on 2 cores) in the capacity-agreement matrix; the real
servers of the matrix's representative subset (tests/test_agreement_vllm.py) hold it to what a
running engine does.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VllmNumbers:
    """What a vLLM server with these flags would report and log."""

    block_size: int
    num_blocks: int
    kv_cache_tokens: int
    mamba_page_size_padded: int | None
    mamba_ssm_cache_dtype: str | None


@contextlib.contextmanager
def _env(extra: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _engine_config(model_dir: Path, max_model_len: int, server_args: Sequence[str]) -> Any:
    """The VllmConfig `vllm serve MODEL --max-model-len N ARGS` resolves to on this CPU."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", str(model_dir), "--max-model-len", str(max_model_len), *server_args]
    )
    return EngineArgs.from_cli_args(args).create_engine_config()


def _layer_specs(config: Any, stage: int) -> dict[str, Any]:
    """The KV-cache spec of every layer pipeline stage `stage` holds, as its workers report."""
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    model, cache, parallel = config.model_config, config.cache_config, config.parallel_config
    hf = model.hf_text_config
    layers = hf.num_hidden_layers
    kinds = list(getattr(hf, "layer_types", None) or ["full_attention"] * layers)
    start, end = get_pp_indices(layers, stage, parallel.pipeline_parallel_size)
    specs: dict[str, Any] = {}
    model_cls = None
    for i in range(start, end):
        if kinds[i] == "linear_attention":
            if model_cls is None:
                model_cls, _ = ModelRegistry.resolve_model_cls(model.architectures, model)
            specs[f"model.layers.{i}.linear_attn"] = MambaSpec(
                shapes=tuple(model_cls.get_mamba_state_shape_from_config(config)),
                dtypes=model_cls.get_mamba_state_dtype_from_config(config),
                block_size=cache.mamba_block_size,
                page_size_padded=cache.mamba_page_size_padded,
                mamba_type="gdn_attention",
                mamba_cache_mode=cache.mamba_cache_mode,
                num_speculative_blocks=0,
            )
        else:
            head_size = model.get_head_size()
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=cache.block_size,
                num_kv_heads=model.get_num_kv_heads(parallel),
                head_size=head_size,
                head_size_v=head_size,
                dtype=kv_cache_dtype_str_to_dtype(cache.cache_dtype, model),
            )
    return specs


def vllm_numbers(
    model_dir: Path,
    server_args: Sequence[str],
    *,
    max_model_len: int,
    kv_cache_space_gib: int,
) -> VllmNumbers:
    """Block size, blocks and KV-cache tokens of `vllm serve` on this CPU, computed by vLLM's
    own functions (`VLLM_CPU_KVCACHE_SPACE` = `kv_cache_space_gib` per rank)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core import kv_cache_utils

    # vLLM logs every resolved setting at INFO: keep the test output readable.
    space = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib)}
    with _env(space), contextlib.redirect_stdout(io.StringIO()):
        config = _engine_config(model_dir, max_model_len, server_args)
    if config.model_config.is_hybrid:
        # Each worker grows the attention block until its page holds one GDN state and pads the
        # state page to it, once the model's layers exist (vllm/platforms/cpu.py
        # update_block_size_for_backend, from vllm/v1/executor/multiproc_executor.py); the CPU
        # attention backend is the one it finds there.
        from vllm.platforms.cpu import CpuPlatform

        with contextlib.redirect_stdout(io.StringIO()):
            CpuPlatform._align_hybrid_block_size(config, CPUAttentionBackend)
    parallel = config.parallel_config
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    workers = [_layer_specs(config, stage) for stage in range(pp) for _ in range(tp)]
    kv_bytes = [kv_cache_space_gib << 30] * len(workers)
    # The engine core resolves one layout from what every worker's backends support
    # (vllm/v1/engine/core.py); on CPU that is the CPU attention backend's list.
    cpu_layouts = [layout.name for layout in CPUAttentionBackend.supported_kv_cache_layouts()]
    resolve_kv_cache_layout(
        config, [cpu_layouts] * len(workers), [s for w in workers for s in w.values()]
    )
    configs = kv_cache_utils.get_kv_cache_configs(config, workers, kv_bytes)
    scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    tokens, _ = kv_cache_utils.get_kv_cache_capacity(config, scheduler)
    cache = config.cache_config
    is_hybrid = any("linear_attn" in name for specs in workers for name in specs)
    return VllmNumbers(
        block_size=cache.block_size,
        num_blocks=configs[0].num_blocks,
        kv_cache_tokens=tokens,
        mamba_page_size_padded=cache.mamba_page_size_padded if is_hybrid else None,
        mamba_ssm_cache_dtype=cache.mamba_ssm_cache_dtype if is_hybrid else None,
    )
