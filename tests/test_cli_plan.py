"""`residency plan` (capacity part) through the real console entry point, as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from model_configs import ISSUE15_CONFIG
from residency_cli import run_cli

REQUIRED_KEYS = {
    "kv_cache_tokens",
    "block_size",
    "num_blocks",
    "max_concurrency",
    "resident_budget_tokens",
    "binding_constraint",
    "kv_bytes_per_token",
    "inputs",
}


def run_capacity_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The capacity part only (`--capacity-only`): residency planning has its own tests."""
    return run_cli(*args, "--capacity-only", timeout=60)


def test_default_plan_json_gives_a_budget_near_30k_with_its_reasoning() -> None:
    out = run_capacity_cli(
        "plan",
        "--profile",
        "rtx4070-12gb",
        "--model",
        "qwen3.5-4b-fp8",
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.90",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report.keys() >= REQUIRED_KEYS
    assert 28_000 <= report["resident_budget_tokens"] <= 31_000
    assert report["binding_constraint"] == "max_model_len"
    assert report["block_size"] == 528
    assert "max_model_len 32768" in report["reasoning"]
    assert report["inputs"]["gpu"].startswith("rtx4070-12gb")
    assert report["inputs"]["settings"]["max_model_len"] == 32768


def test_default_plan_prints_a_readable_table() -> None:
    out = run_capacity_cli("plan")
    assert out.returncode == 0, out.stderr
    assert "Resident budget" in out.stdout
    assert "KV-cache tokens" in out.stdout
    assert "Gated DeltaNet" in out.stdout


def test_kv_cache_memory_bytes_bypasses_the_memory_estimate() -> None:
    out = run_capacity_cli(
        "plan",
        "--model",
        "llama-3.1-8b-instruct",
        "--max-model-len",
        "8192",
        "--kv-cache-memory-bytes",
        str(4 << 30),
        "--profile",  # its 16 GB of weights and the 4 GiB of KV fit a 24 GB card, not 12
        "rtx4090-24gb",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["memory"] is None
    assert report["num_blocks"] == (4 << 30) // (2 << 20)  # 2 MiB blocks
    assert report["kv_bytes_per_token"] == 128 * 1024


def test_local_model_dir_sizes_weights_from_safetensors(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with (tmp_path / "model.safetensors").open("wb") as f:
        f.truncate(988_000_000)
    out = run_capacity_cli("plan", "--model", str(tmp_path), "--profile", "rtx4090-24gb", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    weights = report["memory"]["terms"][0]
    assert weights["bytes"] == 988_000_000
    assert str(tmp_path) in weights["source"]
    assert report["kv_bytes_per_token"] == 24 * 2 * 64 * 2 * 2  # head_dim 896 / 14 = 64


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        pytest.param(
            ["--profile", "rtx9999"], ["rtx9999", "--profile", "rtx4070-12gb"], id="unknown-profile"
        ),
        pytest.param(
            ["--model", "no-such-model"], ["no-such-model", "--model"], id="unknown-model"
        ),
        pytest.param(["--gpu-memory-utilization", "0"], ["(0, 1]", "got 0"], id="utilization-zero"),
        pytest.param(
            ["--gpu-memory-utilization", "1.5"], ["(0, 1]", "1.5"], id="utilization-above-one"
        ),
        pytest.param(
            ["--model", "llama-3.1-8b-instruct"],
            ["14.96 GiB", "0.92 of 11.99 GiB", "11.03 GiB", "--gpu-memory-utilization"],
            id="weights-do-not-fit",
        ),
        pytest.param(
            ["--max-model-len", "2048"], ["--max-model-len 2048", "3392"], id="budget-below-zero"
        ),
        pytest.param(["--gpu", "auto"], ["--gpu auto", "--profile"], id="no-nvidia-driver"),
        pytest.param(
            ["--kv-cache-memory-bytes", "12000000000"],
            ["--kv-cache-memory-bytes 12,000,000,000", "weights", "rtx4070-12gb", "at most"],
            id="kv-and-weights-above-the-gpu",
        ),
        pytest.param(
            ["--platform", "cpu", "--kv-cache-memory-bytes", "1000000000000000000"],
            ["--kv-cache-memory-bytes 1,000,000,000,000,000,000", "this host's memory", "--server"],
            id="kv-above-the-host-on-cpu",
        ),
        pytest.param(
            ["--model", "llama-3.1-8b-instruct", "--kv-cache-memory-bytes", "1000000000"],
            ["llama-3.1-8b-instruct", "weights alone", "--profile"],
            id="weights-alone-above-the-gpu",
        ),
        pytest.param(
            ["--kv-cache-memory-bytes", "1"],
            ["holds no block", "--kv-cache-memory-bytes"],
            id="kv-of-one-byte",
        ),
        pytest.param(
            ["--max-model-len", "300000"],
            ["--max-model-len 300000", "limit of 262144", "at most 262144"],
            id="window-above-the-model",
        ),
        pytest.param(
            ["--server", "http://127.0.0.1:9", "--profile", "rtx4070-12gb"],
            ["--profile", "--server", "drop it"],
            id="profile-beside-server",
        ),
        pytest.param(
            ["--server", "http://127.0.0.1:9"], ["127.0.0.1:9", "vLLM"], id="server-unreachable"
        ),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_1(args: list[str], fragments: list[str]) -> None:
    out = run_capacity_cli("plan", *args)
    assert out.returncode == 1, out.stdout
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    message = " ".join(lines)
    assert message.startswith("error:")
    for fragment in fragments:
        assert fragment in message
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param("[1, 2]", "JSON object", id="not-an-object"),
        pytest.param(
            '{"architectures": ["X"], "hidden_size": 64}', "num_attention_heads", id="missing-field"
        ),
    ],
)
def test_malformed_config_json_is_refused(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    out = run_capacity_cli("plan", "--model", str(path), "--kv-cache-memory-bytes", "1073741824")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert fragment in out.stderr
    assert str(path) in out.stderr


@pytest.mark.parametrize(
    ("flags", "block_size", "kv_cache_tokens", "ssm_dtype", "reason_fragments"),
    [
        # vLLM CPU on an AVX512-BF16 host resets an auto SSM dtype to float32 (issue #15's server).
        pytest.param(
            ["--cpu-avx512-bf16"],
            640,
            3_702_219,
            "float32",
            ["reset to float32", "vllm/platforms/cpu.py", "yes: --cpu-avx512-bf16"],
            id="avx512-bf16-cpu",
        ),
        pytest.param(
            ["--no-cpu-avx512-bf16"],
            384,
            3_890_131,
            "bfloat16",
            ["conv-state dtype bfloat16", "mamba_utils.py", "no: --no-cpu-avx512-bf16"],
            id="cpu-without-avx512-bf16",
        ),
        pytest.param(
            ["--cpu-avx512-bf16", "--mamba-ssm-cache-dtype", "bfloat16"],
            384,
            3_890_131,
            "bfloat16",
            ["--mamba-ssm-cache-dtype bfloat16", "kept on an AVX512-BF16 CPU"],
            id="explicit-bf16-state",
        ),
        pytest.param(
            ["--no-cpu-avx512-bf16", "--mamba-ssm-cache-dtype", "float32"],
            640,
            3_702_219,
            "float32",
            ["--mamba-ssm-cache-dtype float32"],
            id="explicit-fp32-state",
        ),
    ],
)
def test_cpu_hybrid_plan_says_which_ssm_state_dtype_it_assumed(
    tmp_path: Path,
    flags: list[str],
    block_size: int,
    kv_cache_tokens: int,
    ssm_dtype: str,
    reason_fragments: list[str],
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(ISSUE15_CONFIG))
    common = ["plan", "--model", str(config), "--kv-cache-memory-bytes", str(1 << 30)]
    common += ["--max-model-len", "32768", "--platform", "cpu", *flags]
    out = run_capacity_cli(*common, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    layout = report["plan"]["layout"]
    assert (report["block_size"], report["kv_cache_tokens"]) == (block_size, kv_cache_tokens)
    assert layout["mamba_ssm_cache_dtype"] == ssm_dtype
    explained = layout["mamba_ssm_cache_dtype_reason"] + report["inputs"]["cpu_avx512_bf16_source"]
    for fragment in reason_fragments:
        assert fragment in explained
    text = run_capacity_cli(*common)
    assert text.returncode == 0, text.stderr
    assert f"GDN SSM state {ssm_dtype}:" in text.stdout
    assert f"{kv_cache_tokens:,}" in text.stdout


def test_cpu_hybrid_plan_without_the_flag_names_the_host_it_detected_on(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(ISSUE15_CONFIG))
    out = run_capacity_cli(
        "plan",
        "--model",
        str(config),
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--platform",
        "cpu",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    source = report["inputs"]["cpu_avx512_bf16_source"]
    detected = report["inputs"]["settings"]["cpu_avx512_bf16"]
    assert source.startswith("yes: detected on this host" if detected else "no: not detected")
    assert report["plan"]["layout"]["mamba_ssm_cache_dtype"] == (
        "float32" if detected else "bfloat16"
    )


def test_without_the_flag_the_window_is_the_models_own_when_shorter(tmp_path: Path) -> None:
    """vLLM derives --max-model-len from the model when the flag is absent: a config that allows
    8,192 is planned at 8,192 (not refused for residency's 32,768 default, a flag never typed);
    given explicitly, 16,384 is refused with both numbers."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    common = ("plan", "--model", str(tmp_path), "--platform", "cpu")
    out = run_capacity_cli(*common, "--kv-cache-memory-bytes", str(1 << 30), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["inputs"]["settings"]["max_model_len"] == 8192
    typed = run_capacity_cli(
        *common, "--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "16384"
    )
    assert typed.returncode == 1
    assert "--max-model-len 16384 is above the model's limit of 8192" in typed.stderr
