"""`residency plan --server` against the shared SmolLM2 server (vLLM CPU, max_model_len 8,192,
which is also the model's own limit), as the new user of issue 33 met it: the server's facts
come first, a flag the server contradicts is refused in one line naming both values, and advice
names only what the model can run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from residency_cli import run_cli
from vllm_server import VllmServer

from residency.capacity.request import CapacityRequest
from residency.corpus.samples import EN_SAMPLE
from residency.planning.run import PlanJob, choose_sample

pytestmark = pytest.mark.vllm


def _refused(out: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused run (asserting it is one line and no traceback)."""
    assert out.returncode == 1, out.stdout
    stderr = out.stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error:"), stderr
    return lines[0]


def test_a_cpu_server_is_planned_as_cpu_without_the_platform_flag(
    vllm_real_server: VllmServer,
) -> None:
    """No --platform: the server's block size and KV bytes say it is vLLM CPU, and the planner
    agrees with it (the issue: "planner and vLLM disagree", block_size 16 vs 128)."""
    out = run_cli("plan", "--server", vllm_real_server.base_url, "--capacity-only", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["inputs"]["settings"]["platform"] == "cpu"
    assert report["block_size"] == 128
    assert report["server"]["agrees"] is True, report["server"]
    assert report["inputs"]["settings"]["max_model_len"] == 8192


def test_a_window_the_server_does_not_run_is_refused_without_impossible_advice(
    vllm_real_server: VllmServer,
) -> None:
    url = vllm_real_server.base_url
    line = _refused(run_cli("plan", "--server", url, "--max-model-len", "16384", "--capacity-only"))
    assert "--max-model-len 16384" in line
    assert "runs max_model_len 8192" in line
    # SmolLM2's config allows 8,192: restarting vLLM with 16,384 is not advice it can follow.
    assert "restart vLLM" not in line
    assert "model's limit is 8192" in line


def test_a_block_size_the_server_does_not_run_is_refused(vllm_real_server: VllmServer) -> None:
    url = vllm_real_server.base_url
    line = _refused(run_cli("plan", "--server", url, "--block-size", "16", "--capacity-only"))
    assert "--block-size 16" in line
    assert "block_size 128" in line


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        pytest.param(("--kv-cache-memory-bytes", "1000000000"), "--kv-cache-memory-bytes", id="kv"),
        pytest.param(("--profile", "rtx4070-12gb"), "--profile", id="profile"),
    ],
)
def test_a_second_host_beside_the_server_is_refused(
    vllm_real_server: VllmServer, flags: tuple[str, ...], named: str, tmp_path: Path
) -> None:
    out_path = tmp_path / "plan.json"
    out_path.write_text("previous")
    url = vllm_real_server.base_url
    line = _refused(run_cli("plan", "--server", url, *flags, "-o", str(out_path)))
    assert named in line
    assert "--server" in line
    assert out_path.read_text() == "previous"


def test_without_an_index_an_english_model_gets_the_english_sample(
    vllm_real_server: VllmServer,
) -> None:
    """`plan --server` without --index: SmolLM2's tokenizer spends several tokens per Japanese
    character, so the English sample is planned, and the warning says why and how to plan a
    corpus of one's own (the issue: the Japanese sample planned for an English model)."""
    job = PlanJob(CapacityRequest(server=vllm_real_server.base_url))
    assert choose_sample(job) is EN_SAMPLE
    (warning,) = job.warnings
    assert "harbor-lights-en" in warning
    assert "English-first tokenizer" in warning
    assert "--index" in warning
