"""`residency plan` (capacity part) through the real console entry point, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The capacity part only (`--capacity-only`): residency planning has its own tests."""
    return subprocess.run(
        [sys.executable, "-m", "residency", *args, "--capacity-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_default_plan_json_gives_a_budget_near_30k_with_its_reasoning() -> None:
    out = run_cli(
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
    out = run_cli("plan")
    assert out.returncode == 0, out.stderr
    assert "Resident budget" in out.stdout
    assert "KV-cache tokens" in out.stdout
    assert "Gated DeltaNet" in out.stdout


def test_kv_cache_memory_bytes_bypasses_the_memory_estimate() -> None:
    out = run_cli(
        "plan",
        "--model",
        "llama-3.1-8b-instruct",
        "--max-model-len",
        "8192",
        "--kv-cache-memory-bytes",
        str(4 << 30),
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
    out = run_cli("plan", "--model", str(tmp_path), "--profile", "rtx4090-24gb", "--json")
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
            ["14.96 GiB", "10.79 GiB", "--gpu-memory-utilization"],
            id="weights-do-not-fit",
        ),
        pytest.param(
            ["--max-model-len", "2048"], ["--max-model-len 2048", "3392"], id="budget-below-zero"
        ),
        pytest.param(["--gpu", "auto"], ["--gpu auto", "--profile"], id="no-nvidia-driver"),
        pytest.param(
            ["--server", "http://127.0.0.1:9"], ["127.0.0.1:9", "vLLM"], id="server-unreachable"
        ),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_1(args: list[str], fragments: list[str]) -> None:
    out = run_cli("plan", *args)
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
    out = run_cli("plan", "--model", str(path), "--kv-cache-memory-bytes", "1073741824")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert fragment in out.stderr
    assert str(path) in out.stderr
