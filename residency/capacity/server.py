"""`residency plan --server`: vLLM's own numbers for a running server, and the planner's
prediction from the same inputs.

The server's facts come first. Its `vllm:cache_config_info` names the block size, the blocks,
the KV bytes, the KV-cache dtype, prefix caching and (hybrid models) the resolved GDN state
dtype; `/v1/models` names max_model_len. What the metrics do not name, the platform (`--platform
cpu` or `cuda`) and the model dtype (`--dtype`), is read from the numbers: the one combination
whose layout reproduces the server's block size and splits its KV bytes into exactly its block
count (a float32 server holds half the blocks a bfloat16 one holds in the same bytes; a CPU
server's default block is 128 tokens, a GPU's 16). A flag the user gave that contradicts the
server is refused in one line naming both values; the rest are filled from the server.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from planner import CacheSettings, build_kv_layout, plan_capacity
from planner.kv_layout import Platform
from planner.units import DTypeFlag
from residency.capacity.assemble import (
    CapacityReport,
    ServerComparison,
    assemble_report,
    report_inputs,
    resolve_settings,
)
from residency.capacity.profiles import ResolvedModel, resolve_model
from residency.capacity.request import CapacityRequest
from residency.errors import ConfigError
from residency.vllm_client import VllmClient
from residency.vllm_client.sync_client import label_int

PLATFORMS: tuple[Platform, ...] = ("cpu", "cuda")
DTYPES: tuple[DTypeFlag, ...] = ("auto", "bfloat16", "float32", "float16")


def _fits(
    model: ResolvedModel,
    settings: CacheSettings,
    block_size: int | None,
    kv_bytes: int | None,
    num_blocks: int,
) -> bool:
    """Whether these settings reproduce the server's block size and block count."""
    layout = build_kv_layout(model.spec, settings)
    if block_size is not None and layout.block_size != block_size:
        return False
    return kv_bytes is None or kv_bytes // layout.bytes_per_block == num_blocks


def infer_settings(
    model: ResolvedModel,
    settings: CacheSettings,
    fixed: frozenset[str],
    block_size: int | None,
    kv_bytes: int | None,
    num_blocks: int,
) -> tuple[CacheSettings, bool]:
    """`settings` with the platform and dtype the server runs (those in `fixed` kept), and whether
    a combination reproduced its numbers; the given values are tried first."""
    platforms = [settings.platform]
    if "cache.platform" not in fixed:
        platforms += [p for p in PLATFORMS if p != settings.platform]
    dtypes = [settings.dtype] + [d for d in DTYPES if d != settings.dtype]
    if "cache.dtype" in fixed:
        dtypes = [settings.dtype]
    for platform, dtype in itertools.product(platforms, dtypes):
        tried = settings.model_copy(update={"platform": platform, "dtype": dtype})
        if _fits(model, tried, block_size, kv_bytes, num_blocks):
            return tried, True
    return settings, False


def _refuse_contradictions(
    req: CapacityRequest,
    model: ResolvedModel,
    settings: CacheSettings,
    served_len: int | None,
    labels: dict[str, str],
    kv_bytes: int | None,
    num_blocks: int,
) -> None:
    """ConfigError for the first flag the user gave that the server contradicts."""
    server = f"the server at {req.server}"
    fixed = req.fixed()
    if "cache.max_model_len" in fixed and served_len and req.cache.max_model_len != served_len:
        wanted, limit = req.cache.max_model_len, model.spec.max_model_len_limit
        restart = f"or restart vLLM with --max-model-len {wanted} to plan that window"
        if limit is not None and wanted > limit:  # advice only of what the model can run
            restart = f"the model's limit is {limit} (config.json), so vLLM cannot run {wanted}"
        raise ConfigError(
            f"--max-model-len {wanted}: {server} runs max_model_len {served_len} (its "
            f"/v1/models); drop the flag, {restart}"
        )
    label_block = label_int(labels, "block_size")
    if "cache.block_size" in fixed and label_block and req.cache.block_size != label_block:
        raise ConfigError(
            f"--block-size {req.cache.block_size}: {server} runs block_size {label_block} "
            "(vllm:cache_config_info); drop the flag"
        )
    label_kv = labels.get("cache_dtype")
    if "cache.kv_cache_dtype" in fixed and label_kv and req.cache.kv_cache_dtype != label_kv:
        raise ConfigError(
            f"--kv-cache-dtype {req.cache.kv_cache_dtype}: {server} runs cache_dtype {label_kv} "
            "(vllm:cache_config_info); drop the flag"
        )
    for path, flag in (("cache.platform", "--platform"), ("cache.dtype", "--dtype")):
        if path not in fixed:
            continue
        free = fixed - {path}
        found, ok = infer_settings(model, settings, free, label_block, kv_bytes, num_blocks)
        _, fits = infer_settings(model, settings, fixed, label_block, kv_bytes, num_blocks)
        if ok and not fits:
            value = getattr(req.cache, path.split(".")[1])
            actual = getattr(found, path.split(".")[1])
            raise ConfigError(
                f"{flag} {value}: {server} runs {flag} {actual} (its block size "
                f"{label_block} and {num_blocks:,} blocks in {kv_bytes or 0:,} bytes fit "
                f"{flag} {actual}, not {value}); drop the flag"
            )


def _refuse_other_hosts(req: CapacityRequest) -> None:
    """ConfigError when another host flag comes with --server: the server's own KV numbers are
    the host, and a second description of it would be silently ignored."""
    given = [
        flag
        for flag, value in (
            ("--kv-cache-memory-bytes", req.kv_cache_memory_bytes),
            ("--profile", req.profile),
            ("--gpu", req.gpu),
        )
        if value is not None
    ]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} with --server {req.server}: the server's own KV cache is "
            "the host; drop " + ("them" if len(given) > 1 else "it") + " (or drop --server to "
            "plan from " + ("them" if len(given) > 1 else "it") + ")"
        )


def server_report(req: CapacityRequest) -> CapacityReport:
    """The capacity of a running vLLM, in its own numbers, beside the planner's prediction."""
    assert req.server is not None
    _refuse_other_hosts(req)
    with VllmClient(req.server) as client:
        served = client.models()[0]
        labels = client.cache_config_info()
    ref = req.model or served.root
    if ref is None or (req.model is None and not Path(ref).is_dir()):
        raise ConfigError(
            f"--server {req.server} serves {served.id!r} from {ref!r}, which is not a local "
            "directory here; pass --model with its config.json or a model profile"
        )
    model = resolve_model(ref)
    length = served.max_model_len or req.cache.max_model_len
    overrides, avx_source = _server_overrides(labels, model, length)
    num_blocks = label_int(labels, "num_gpu_blocks") or 0
    kv_bytes = label_int(labels, "kv_cache_memory_bytes")
    if label_int(labels, "num_gpu_blocks_override") is not None:
        kv_bytes = None  # --num-gpu-blocks-override caps the pool below the KV bytes
    settings = resolve_settings(req, None, **overrides)
    _refuse_contradictions(req, model, settings, served.max_model_len, labels, kv_bytes, num_blocks)
    settings, _ = infer_settings(
        model, settings, req.fixed(), label_int(labels, "block_size"), kv_bytes, num_blocks
    )
    layout = build_kv_layout(model.spec, settings)
    source = "server label kv_cache_memory_bytes"
    if kv_bytes is None:
        # Profiled on the server's GPU (or overridden): vLLM's block count is the measurement.
        kv_bytes = num_blocks * layout.bytes_per_block
        source = "server num_gpu_blocks x planner bytes per block (vLLM's own block count)"
    plan = plan_capacity(model.spec, settings, kv_bytes, req.reserves, check_model_limit=False)
    comparison = ServerComparison(
        served_model=served.id,
        max_model_len=length,
        block_size=label_int(labels, "block_size") or 0,
        num_blocks=num_blocks,
        kv_cache_tokens=label_int(labels, "kv_cache_size_tokens") or 0,
        predicted_block_size=plan.layout.block_size,
        predicted_num_blocks=plan.capacity.num_blocks,
        predicted_kv_cache_tokens=plan.capacity.kv_cache_tokens,
        agrees=(
            plan.layout.block_size == label_int(labels, "block_size")
            and plan.capacity.num_blocks == num_blocks
            and plan.capacity.kv_cache_tokens == label_int(labels, "kv_cache_size_tokens")
        ),
        cache_config_info=labels,
    )
    inputs = report_inputs(req, model, settings, source, cpu_avx512_bf16_source=avx_source)
    return assemble_report(plan, inputs, server=comparison)


def _server_overrides(
    labels: dict[str, str], model: ResolvedModel, max_model_len: int
) -> tuple[dict[str, object], str | None]:
    """The cache settings the server's labels fix, and how the AVX512-BF16 answer is known
    when its resolved GDN state dtype is among them."""
    overrides: dict[str, object] = {"max_model_len": max_model_len}
    if labels.get("user_specified_block_size") == "True" and label_int(labels, "block_size"):
        overrides["block_size"] = label_int(labels, "block_size")
    if labels.get("cache_dtype"):
        overrides["kv_cache_dtype"] = labels["cache_dtype"]
    avx_source = None
    ssm_label = labels.get("mamba_ssm_cache_dtype")
    if ssm_label and model.spec.is_hybrid:
        # The label is the server's resolved value: vllm/platforms/cpu.py has already applied
        # its AVX512-BF16 rule on the server's own CPU, so it must not be applied again here
        # (a server without AVX512-BF16 reports "auto", which stays the conv-state dtype).
        overrides["mamba_ssm_cache_dtype"] = ssm_label
        overrides["cpu_avx512_bf16"] = False
        avx_source = (
            f"not applied: the server's mamba_ssm_cache_dtype label ({ssm_label}) is vLLM's "
            "value, already resolved on the server's CPU"
        )
    if labels.get("enable_prefix_caching") in ("True", "False"):
        overrides["enable_prefix_caching"] = labels["enable_prefix_caching"] == "True"
    return overrides, avx_source
