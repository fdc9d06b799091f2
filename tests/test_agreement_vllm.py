"""The capacity planner agrees with vLLM on vLLM CPU, exactly.

For each tiny configuration the real CLI predicts vLLM's block size, number of blocks and
KV-cache tokens from the model's config.json and the `vllm serve` flags alone
(`residency plan --model DIR --kv-cache-memory-bytes N --platform cpu FLAGS --json`, as a user
plans before starting a server); for hybrid models the GDN state dtype, the attention block and
the mamba page padding too. Two sources of vLLM's own numbers:

- vLLM's functions, in-process (tests/vllm_oracle.py: `EngineArgs.create_engine_config`, then
  `get_kv_cache_configs` / `get_kv_cache_capacity`) for the whole matrix;
- real vLLM CPU servers for a representative subset, each started once: the suite's shared dense
  and hybrid servers, SmolLM2 (tests/test_real_model_vllm.py) and one tensor-parallel hybrid
  server. There `residency plan --server URL` reads vLLM's `vllm:cache_config_info`, both
  predictions must equal it and the "KV cache size: N tokens" log line, and the in-process numbers
  must equal the server's (which holds the oracle to a running engine).

Every flag set gets this CPU's `--dtype` (tests/conftest.py SERVER_DTYPE) unless it names one,
and the KV space is scaled with it, as the pool starts servers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agreement import BLOCK_LOG, PADDING_LOG, assert_planner_agrees, plan_offline
from conftest import CACHE_DIR, HYBRID_SERVER_ARGS, MAX_MODEL_LEN
from vllm_oracle import VllmNumbers, vllm_numbers
from vllm_pool import ServerSpec, VllmServerPool
from vllm_server import VllmServer

from residency.models.tiny import DENSE_SPEC, HYBRID_SPEC, TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.vllm


def _hybrid(**fields: object) -> TinyModelSpec:
    """HYBRID_SPEC with some fields changed, validated."""
    return TinyModelSpec.model_validate({**HYBRID_SPEC.model_dump(), **fields})


# Issue #15: 256 B per attention token, GDN state 134,144 B (fp32 SSM) or 68,608 B (bf16): the
# state is larger than one 128-token attention page (32,768 B) either way.
ISSUE15_SPEC = _hybrid(
    hidden_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)
# 2 KV heads x head_dim 128: 1,024 B per token, a 131,072 B page at the 128-token minimum block;
# the GDN state (4 x 64 x 64 x 4 + 512 x 3 x 2 = 68,608 B fp32) is smaller, so the block stays
# 128 and the state is padded up to the attention page.
SMALL_STATE_SPEC = _hybrid(num_attention_heads=4, num_key_value_heads=2, head_dim=128)
# 8 layers (6 GDN in groups of 2, 2 attention) and a wide state: 8 value heads of 128,
# 8 x 128 x 128 x 4 + (2 x 2 x 128 + 8 x 128) x 3 x 2 = 533,504 B against 65,536 B per 128-token
# page: 128 x cdiv(533,504, 65,536) = 1,152-token blocks, two layers per group.
WIDE_STATE_SPEC = _hybrid(
    num_hidden_layers=8,
    linear_num_key_heads=2,
    linear_num_value_heads=8,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)

# (id, model spec, vLLM flags that shape the KV cache, max_model_len, KV GiB in bfloat16)
CONFIGS: list[tuple[str, TinyModelSpec, tuple[str, ...], int, int]] = [
    ("dense-gqa", DENSE_SPEC, (), 32768, 1),
    ("dense-mqa", DENSE_SPEC.model_copy(update={"num_key_value_heads": 1}), (), 32768, 1),
    (
        "dense-head128",
        DENSE_SPEC.model_copy(update={"head_dim": 128, "hidden_size": 512}),
        (),
        32768,
        1,
    ),
    ("dense-6-layers", DENSE_SPEC.model_copy(update={"num_hidden_layers": 6}), (), 32768, 1),
    ("dense-fp8-kv", DENSE_SPEC, ("--kv-cache-dtype", "fp8"), 32768, 1),
    # A length that is not a multiple of the block: a request's last block is never full.
    ("dense-block64-len20000", DENSE_SPEC, ("--block-size", "64"), 20000, 2),
    ("hybrid-gdn-align", HYBRID_SPEC, ("--enable-prefix-caching",), 32768, 1),
    ("hybrid-gdn-no-prefix-cache", HYBRID_SPEC, ("--no-enable-prefix-caching",), 32768, 1),
    ("hybrid-gdn-fp8-kv", HYBRID_SPEC, ("--kv-cache-dtype", "fp8"), 32768, 1),
    # Issue #15's command line; its state page is larger than one attention page.
    (
        "hybrid-issue15",
        ISSUE15_SPEC,
        ("--enable-prefix-caching", "--dtype", "bfloat16"),
        32768,
        1,
    ),
    # The same model with a 16-bit SSM state asked for explicitly: vLLM keeps it (block 384).
    ("hybrid-issue15-ssm-bf16", ISSUE15_SPEC, ("--mamba-ssm-cache-dtype", "bfloat16"), 32768, 1),
    ("hybrid-state-below-one-page", SMALL_STATE_SPEC, (), 32768, 1),
    ("hybrid-8-layers-wide-state", WIDE_STATE_SPEC, (), 32768, 1),
]


def _bind_per_rank(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND with one core list per rank ("0|1" on 2 cores): vLLM's "auto"
    binding wants a NUMA node per rank, and these machines have one."""
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // ranks
    return "|".join(
        ",".join(str(c) for c in cores[i * share : (i + 1) * share]) for i in range(ranks)
    )


# Tensor and pipeline parallel on vLLM CPU (2 ranks, one core each on a 2-core machine):
# (id, model spec, parallel flags, max_model_len, VLLM_CPU_KVCACHE_SPACE GiB per rank).
PARALLEL_CONFIGS: list[tuple[str, TinyModelSpec, tuple[str, ...], int, int]] = [
    # 1 KV head over 2 ranks is replicated (max(1, 1 // 2)), not halved: 4,096 blocks per GiB as
    # at TP=1.
    (
        "dense-mqa-tp2",
        DENSE_SPEC.model_copy(update={"num_key_value_heads": 1}),
        ("--tensor-parallel-size", "2"),
        32768,
        1,
    ),
    # 2 KV heads split 1 + 1 and the GDN state halved (value heads and conv channels / 2): the
    # block and the page change with TP.
    ("hybrid-gdn-tp2", HYBRID_SPEC, ("--tensor-parallel-size", "2"), 32768, 1),
    # 5 layers over 2 stages hold [3, 2]: the 3-layer stage sets every stage's blocks.
    (
        "dense-5-layers-pp2",
        DENSE_SPEC.model_copy(update={"num_hidden_layers": 5}),
        ("--pipeline-parallel-size", "2"),
        32768,
        1,
    ),
]


def _model(spec: TinyModelSpec, name: str, tokenizer_dir: Path) -> Path:
    return build_tiny_model(spec, CACHE_DIR / f"agreement-{name}", tokenizer_dir)


def _assert_hybrid_layout(layout: dict[str, object], numbers: VllmNumbers) -> None:
    """The planner's GDN state dtype, attention block and mamba page padding are vLLM's."""
    label = numbers.mamba_ssm_cache_dtype  # post-rule; "auto" means the conv-state dtype
    assert layout["mamba_ssm_cache_dtype"] == (
        layout["mamba_cache_dtype"] if label == "auto" else label
    )
    page, state = layout["page_size_bytes"], layout["mamba_page_size_bytes"]
    assert isinstance(page, int)
    assert isinstance(state, int)
    # vLLM pads the state page up to the attention page when the attention page is larger
    # (vllm/platforms/interface.py _align_hybrid_block_size); equal pages need no padding.
    assert numbers.mamba_page_size_padded == (page if page > state else None)


@pytest.mark.parametrize(
    ("spec", "flags", "max_model_len", "kv_gib"),
    [pytest.param(*c[1:], id=c[0]) for c in CONFIGS],
)
def test_planner_matches_vllms_own_numbers(
    vllm_pool: VllmServerPool,
    tiny_tokenizer_dir: Path,
    request: pytest.FixtureRequest,
    spec: TinyModelSpec,
    flags: tuple[str, ...],
    max_model_len: int,
    kv_gib: int,
) -> None:
    model_dir = _model(spec, request.node.callspec.id, tiny_tokenizer_dir)
    server = ServerSpec(model_dir, flags, max_model_len, kv_gib)
    args, gib = vllm_pool.args_of(server), vllm_pool.kv_gib_of(server)
    assert gib is not None
    numbers = vllm_numbers(
        model_dir, ("--enforce-eager", *args), max_model_len=max_model_len, kv_cache_space_gib=gib
    )
    offline = plan_offline(model_dir, max_model_len, gib, *args)
    predicted = (offline["block_size"], offline["num_blocks"], offline["kv_cache_tokens"])
    assert predicted == (numbers.block_size, numbers.num_blocks, numbers.kv_cache_tokens)
    if spec.kind == "hybrid":
        _assert_hybrid_layout(offline["plan"]["layout"], numbers)


@pytest.mark.parametrize(
    ("spec", "parallel_args", "max_model_len", "kv_gib"),
    [pytest.param(*c[1:], id=c[0]) for c in PARALLEL_CONFIGS],
)
def test_planner_matches_vllms_own_numbers_in_parallel(
    vllm_pool: VllmServerPool,
    tiny_tokenizer_dir: Path,
    request: pytest.FixtureRequest,
    spec: TinyModelSpec,
    parallel_args: tuple[str, ...],
    max_model_len: int,
    kv_gib: int,
) -> None:
    name = request.node.callspec.id
    model_dir = _model(spec, name, tiny_tokenizer_dir)
    server = ServerSpec(model_dir, parallel_args, max_model_len, kv_gib)
    args, gib = vllm_pool.args_of(server), vllm_pool.kv_gib_of(server)
    assert gib is not None
    numbers = vllm_numbers(
        model_dir,
        ("--enforce-eager", "--distributed-executor-backend", "mp", *args),
        max_model_len=max_model_len,
        kv_cache_space_gib=gib,
    )
    offline = plan_offline(model_dir, max_model_len, gib, *args)
    predicted = (offline["block_size"], offline["num_blocks"], offline["kv_cache_tokens"])
    assert predicted == (numbers.block_size, numbers.num_blocks, numbers.kv_cache_tokens)
    # The same flags without the parallel sizes predict a different pool: the test can fail.
    single = plan_offline(model_dir, max_model_len, gib, *vllm_pool.args_of(ServerSpec(model_dir)))
    if name == "dense-mqa-tp2":
        assert single["num_blocks"] == offline["num_blocks"]  # replicated: one head per rank
    else:
        assert single["num_blocks"] != offline["num_blocks"]


# --- real servers: the representative subset -------------------------------------------------


# Flags that shape no KV cache: the API server's (vLLM's engine parser does not know them)
# and the planner's unknowns; the value after a flag that takes one goes with it.
_NOT_KV = {
    "--enforce-eager": 0,
    "--enable-prompt-tokens-details": 0,
    "--structured-outputs-config": 1,
    "--distributed-executor-backend": 1,
}


def kv_shaping(args: tuple[str, ...]) -> tuple[str, ...]:
    """The server's flags that the planner and vLLM's engine parser both take."""
    out: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in _NOT_KV:
            skip = 0 if "=" in arg else _NOT_KV[name]
            continue
        out.append(arg)
    return tuple(out)


def test_kv_shaping_drops_flags_and_their_values() -> None:
    args = (
        "--enforce-eager",
        "--structured-outputs-config",
        '{"a": 1}',
        "--block-size",
        "16",
        "--structured-outputs-config={}",
        "--enable-prefix-caching",
    )
    assert kv_shaping(args) == ("--block-size", "16", "--enable-prefix-caching")


def _assert_server_agrees(
    pool: VllmServerPool, server: VllmServer, spec: ServerSpec, parallel_args: tuple[str, ...] = ()
) -> dict[str, object]:
    """`plan --server` and the offline plan equal the server, and so do vLLM's functions."""
    gib = pool.kv_gib_of(spec)
    assert gib is not None
    args = pool.args_of(spec)
    plan_flags = kv_shaping(args)
    report, offline = assert_planner_agrees(
        server,
        spec.model_dir,
        spec.max_model_len,
        gib,
        tuple(a for a in plan_flags if a not in parallel_args),
        parallel_args,
    )
    engine_flags = tuple(a for a in args if a != "--enable-prompt-tokens-details")  # API server's
    numbers = vllm_numbers(
        spec.model_dir, engine_flags, max_model_len=spec.max_model_len, kv_cache_space_gib=gib
    )
    served = report["server"]
    assert isinstance(served, dict)
    assert (numbers.block_size, numbers.num_blocks, numbers.kv_cache_tokens) == (
        served["block_size"],
        served["num_blocks"],
        served["kv_cache_tokens"],
    )
    return offline


def test_planner_and_vllms_functions_match_the_dense_server(
    vllm_pool: VllmServerPool, vllm_dense_server: VllmServer, dense_model_dir: Path
) -> None:
    from conftest import dense_server_spec

    _assert_server_agrees(vllm_pool, vllm_dense_server, dense_server_spec(dense_model_dir))


def test_planner_and_vllms_functions_match_the_hybrid_server(
    vllm_pool: VllmServerPool, vllm_hybrid_server: VllmServer, hybrid_model_dir: Path
) -> None:
    from conftest import hybrid_server_spec

    spec = hybrid_server_spec(hybrid_model_dir)
    offline = _assert_server_agrees(vllm_pool, vllm_hybrid_server, spec)
    layout = offline["plan"]["layout"]  # type: ignore[index]
    log = vllm_hybrid_server.log_text()
    default_block = 128
    grown = BLOCK_LOG.findall(log)
    assert [int(b) for b in grown[-1:]] == (
        [layout["block_size"]] if layout["block_size"] > default_block else []
    )
    page, state = layout["page_size_bytes"], layout["mamba_page_size_bytes"]
    padding = PADDING_LOG.findall(log)
    assert padding[-1:] == ([f"{100 * (page - state) / state:.2f}"] if page > state else [])


def test_planner_and_vllms_functions_match_a_tensor_parallel_hybrid_server(
    vllm_pool: VllmServerPool, hybrid_model_dir: Path
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks need two cores")  # pragma: no cover - CI has two
    parallel = ("--tensor-parallel-size", "2")
    spec = ServerSpec(
        hybrid_model_dir,
        (*HYBRID_SERVER_ARGS, "--distributed-executor-backend", "mp", *parallel),
        MAX_MODEL_LEN,
        1,
        env=(("VLLM_CPU_OMP_THREADS_BIND", _bind_per_rank(2)),),
        name="hybrid-tp2",
    )
    try:
        _assert_server_agrees(vllm_pool, vllm_pool.get(spec), spec, parallel)
    finally:
        vllm_pool.release(spec)  # two ranks' worth of memory: no other test uses it
