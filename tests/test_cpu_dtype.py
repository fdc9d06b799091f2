"""The dtype residency starts vLLM's CPU build with, from the CPU's flags, and the planner reading
the dtype a running server uses from its own block count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import CacheSettings, build_kv_layout
from residency.capacity.profiles import resolve_model
from residency.capacity.server import infer_settings
from residency.cpu_dtype import choose_cpu_dtype, same_tokens_gib, with_dtype
from residency.errors import ConfigError

# /proc/cpuinfo of the kinds of 2-core cloud VM seen (flags abridged).
XEON_AMX = (
    "model name\t: Intel(R) Xeon(R) Platinum 8481C\n"
    "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
)
XEON_AVX512 = "model name\t: Intel(R) Xeon(R) CPU @ 2.80GHz\nflags\t\t: fpu avx2 avx512f avx512bw\n"
EPYC_AVX2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\n"

# SmolLM2-135M-Instruct's attention: 30 layers, 3 KV heads of 64, bfloat16 weights.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "torch_dtype": "bfloat16",
}


def _proc(root: Path, cpuinfo: str | None) -> Path:
    root.mkdir(parents=True)
    if cpuinfo is not None:
        (root / "cpuinfo").write_text(cpuinfo)
    return root


@pytest.mark.parametrize(
    ("cpuinfo", "dtype", "said"),
    [
        pytest.param(XEON_AMX, "bfloat16", "amx_bf16, avx512_bf16", id="xeon-amx"),
        pytest.param(XEON_AVX512, "float32", "neither amx_bf16 nor avx512_bf16", id="xeon-avx512"),
        pytest.param(EPYC_AVX2, "float32", "emulate bfloat16", id="epyc-avx2"),
        pytest.param(GRAVITON, "float32", "neither", id="arm-features"),
        pytest.param(None, "float32", "neither", id="no-cpuinfo"),
    ],
)
def test_auto_picks_bfloat16_only_where_the_cpu_computes_it(
    tmp_path: Path, cpuinfo: str | None, dtype: str, said: str
) -> None:
    choice = choose_cpu_dtype("auto", _proc(tmp_path / "proc", cpuinfo))
    assert choice.dtype == dtype
    assert said in choice.reason


@pytest.mark.parametrize("flag", ["bfloat16", "float32"])
@pytest.mark.parametrize("cpuinfo", [XEON_AMX, EPYC_AVX2], ids=["xeon-amx", "epyc-avx2"])
def test_a_given_dtype_wins_over_the_cpu(tmp_path: Path, flag: str, cpuinfo: str) -> None:
    choice = choose_cpu_dtype(flag, _proc(tmp_path / "proc", cpuinfo))  # type: ignore[arg-type]
    assert (choice.dtype, choice.reason) == (flag, f"--dtype {flag} (given)")


@pytest.mark.parametrize(
    ("cpuinfo", "said"),
    [
        pytest.param(XEON_AMX, "native here", id="xeon-amx"),
        pytest.param(EPYC_AVX2, "emulated on this CPU", id="epyc-avx2"),
    ],
)
def test_a_hybrid_model_runs_bfloat16_on_every_cpu(tmp_path: Path, cpuinfo: str, said: str) -> None:
    # vLLM's CPU GDN kernel asserts bfloat16: a float32 hybrid server dies on its first request.
    proc = _proc(tmp_path / "proc", cpuinfo)
    choice = choose_cpu_dtype("auto", proc, hybrid=True)
    assert choice.dtype == "bfloat16"
    assert "GDN" in choice.reason
    assert said in choice.reason
    assert choose_cpu_dtype("bfloat16", proc, hybrid=True).dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"^--dtype float32: .*bfloat16 only.*--dtype auto"):
        choose_cpu_dtype("float32", proc, hybrid=True)


def test_server_args_get_the_dtype_unless_they_name_one() -> None:
    fp32 = choose_cpu_dtype("float32")
    assert with_dtype(("--enforce-eager",), fp32) == ("--enforce-eager", "--dtype", "float32")
    assert with_dtype(("--dtype", "bfloat16"), fp32) == ("--dtype", "bfloat16")
    assert with_dtype(("--dtype=half",), fp32) == ("--dtype=half",)


def test_float32_gets_twice_the_space_for_the_same_tokens() -> None:
    assert [same_tokens_gib(d, 1) for d in ("bfloat16", "float16", "float32")] == [1, 1, 2]
    assert same_tokens_gib("float32", 3) == 6


@pytest.mark.parametrize("served", ["bfloat16", "float32"])
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_the_planner_reads_the_servers_dtype_and_platform_from_its_numbers(
    tmp_path: Path, served: str, platform: str
) -> None:
    # 30 layers x 3 KV heads x (64 + 64) x dtype bytes per token. A CPU server's blocks hold 128
    # tokens, a GPU's 16: in 2 GiB a float32 CPU server holds 364 blocks, a bfloat16 one 728.
    # The block size names the platform and the count the dtype.
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMOLLM2_CONFIG))
    model = resolve_model(str(config))
    start = CacheSettings(platform="cuda", max_model_len=8192)  # the CLI's default platform
    kv_bytes = 2 << 30
    truth = start.model_copy(update={"dtype": served, "platform": platform})
    layout = build_kv_layout(model.spec, truth)
    blocks = kv_bytes // layout.bytes_per_block
    block = {"cpu": 128, "cuda": 16}[platform]
    per_token = 30 * 3 * (64 + 64) * {"bfloat16": 2, "float32": 4}[served]
    assert (layout.block_size, blocks) == (block, kv_bytes // (block * per_token))
    assert platform == "cuda" or blocks == {"bfloat16": 728, "float32": 364}[served]
    found, ok = infer_settings(model, start, frozenset(), layout.block_size, kv_bytes, blocks)
    assert ok
    found_layout = build_kv_layout(model.spec, found)
    assert (found.platform, found_layout.model_dtype) == (platform, served)
    # A count no dtype explains leaves the settings alone (the comparison shows the difference).
    same, ok = infer_settings(model, start, frozenset(), layout.block_size, kv_bytes, blocks + 1)
    assert (same, ok) == (start, False)
    # A stated platform is kept: it cannot be explained away.
    stated = frozenset({"cache.platform"})
    other = "cuda" if platform == "cpu" else "cpu"
    fixed = start.model_copy(update={"platform": other})
    kept, ok = infer_settings(model, fixed, stated, layout.block_size, kv_bytes, blocks)
    assert (kept.platform, ok) == (other, False)
