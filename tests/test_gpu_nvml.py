"""`--gpu auto` through NVML, on machines without a GPU: the real CLI in a subprocess with a
stand-in `pynvml` (tests/nvml_standin) first on its path. The same paths ran against a real H200
through `make gpu-check` (docs/measurements/gpu-check-h200.json)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from residency.capacity.gpu import LiveGpu, largest_startable_utilization

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDIN = Path(__file__).resolve().parent / "nvml_standin"
GiB = 1 << 30
# Two H200s as NVML reports them (150,754,820,096 B total, measured), the second half full.
H200 = 150_754_820_096
DEVICES = [
    {"name": "NVIDIA H200", "uuid": "GPU-aaaa", "total": H200, "free": H200 - 615 * (1 << 20)},
    {"name": "NVIDIA H200", "uuid": "GPU-bbbb", "total": H200, "free": H200 // 2},
]
LLAMA = ("--model", "llama-3.1-8b-instruct")


def plan(
    *args: str, devices: list[dict[str, Any]] | None = DEVICES, visible: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(REPO_ROOT)])
    env["COLUMNS"] = "250"
    env.pop("NVML_STANDIN_DEVICES", None)
    if devices is not None:
        env["NVML_STANDIN_DEVICES"] = json.dumps(devices)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        [sys.executable, "-m", "residency", "plan", "--capacity-only", "--gpu", "auto", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
    )


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_every_visible_device_is_listed_and_device_0_planned() -> None:
    out = plan(*LLAMA, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    devices = report["inputs"]["devices"]
    assert [(d["index"], d["nvml_index"], d["uuid"]) for d in devices] == [
        (0, 0, "GPU-aaaa"),
        (1, 1, "GPU-bbbb"),
    ]
    assert report["inputs"]["used_devices"] == [0]
    assert report["memory"]["total_memory_bytes"] == H200
    # vllm/v1/worker/utils.py request_memory: ceil(total x 0.92, vLLM's default utilization).
    assert report["memory"]["requested_memory_bytes"] == math.ceil(H200 * 0.92)


@pytest.mark.parametrize(
    ("visible", "expected_nvml"),
    [
        pytest.param("1", [1], id="index"),
        pytest.param("GPU-bbbb,GPU-aaaa", [1, 0], id="uuids-reordered"),
        pytest.param("", [0, 1], id="empty-is-unset"),
    ],
)
def test_cuda_visible_devices_is_applied(visible: str, expected_nvml: list[int]) -> None:
    out = plan(*LLAMA, "--gpu-memory-utilization", "0.4", "--json", visible=visible)
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)["inputs"]["devices"]
    assert [d["nvml_index"] for d in devices] == expected_nvml
    assert [d["index"] for d in devices] == list(range(len(expected_nvml)))


def test_gpu_index_picks_the_visible_device() -> None:
    out = plan(*LLAMA, "--gpu-index", "1", "--gpu-memory-utilization", "0.4", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["inputs"]["used_devices"] == [1]


def test_free_memory_below_the_request_is_refused_as_vllm_does() -> None:
    # Device 1 has exactly half its memory free: ceil(total x 0.5) fits, 0.92 does not.
    line = one_line_error(plan(*LLAMA, "--gpu-index", "1"))
    assert line.startswith("error: GPU 1 (NVIDIA H200) has 70.20 GiB free of 140.40 GiB")
    assert "--gpu-memory-utilization 0.92 asks vLLM for 129.17 GiB" in line
    assert "vllm/v1/worker/utils.py request_memory" in line
    assert "--gpu-memory-utilization 0.50 is the largest that would start" in line
    ok = plan(*LLAMA, "--gpu-index", "1", "--gpu-memory-utilization", "0.5", "--json")
    assert ok.returncode == 0, ok.stderr


def test_tensor_parallel_uses_two_devices_and_checks_both() -> None:
    line = one_line_error(plan(*LLAMA, "--tensor-parallel-size", "2"))
    assert "GPU 1 (NVIDIA H200)" in line
    assert "0.50 is the largest" in line
    out = plan(*LLAMA, "-tp", "2", "--gpu-memory-utilization", "0.45", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["inputs"]["used_devices"] == [0, 1]
    assert report["plan"]["layout"]["num_kv_heads_per_rank"] == 4
    assert report["memory"]["tensor_parallel_size"] == 2


@pytest.mark.parametrize(
    ("args", "visible", "expected"),
    [
        pytest.param(
            ("-tp", "4"),
            None,
            "--tensor-parallel-size x --pipeline-parallel-size = 4 GPUs from device 0 needs "
            "devices 0-3, but only 2 are visible (0-1)",
            id="tp-past-the-devices",
        ),
        pytest.param(
            ("--gpu-index", "2"),
            None,
            "--gpu-index 2: one GPU from device 2 needs devices 2-2, but only 2 are visible",
            id="index-past-the-devices",
        ),
        pytest.param(
            (),
            "5",
            "CUDA_VISIBLE_DEVICES=5: device 5 does not exist; NVML sees 2 device(s), indices 0-1",
            id="hidden-device-missing",
        ),
        pytest.param(
            (),
            "GPU-zzzz",
            "CUDA_VISIBLE_DEVICES=GPU-zzzz: no NVIDIA GPU has the id 'GPU-zzzz'",
            id="unknown-uuid",
        ),
    ],
)
def test_device_selection_mistakes_get_one_line(
    args: tuple[str, ...], visible: str | None, expected: str
) -> None:
    assert expected in one_line_error(plan(*LLAMA, *args, visible=visible))


def test_no_driver_names_the_alternatives() -> None:
    line = one_line_error(plan(*LLAMA, devices=None))
    assert "no NVIDIA driver answered (NVML Shared Library Not Found)" in line
    assert "--profile NAME" in line


@pytest.mark.parametrize(
    ("total", "free", "expected"),
    [
        pytest.param(100 * GiB, 50 * GiB, 0.5, id="exact-half"),
        pytest.param(H200, 89_405_000_000, 0.59, id="h200-measured-0.59"),
        pytest.param(100 * GiB, 0, 0.0, id="nothing-free"),
    ],
)
def test_largest_startable_utilization_satisfies_vllms_rule(
    total: int, free: int, expected: float
) -> None:
    u = largest_startable_utilization(total, free)
    assert u == expected
    assert math.ceil(total * u) <= free
    assert math.ceil(total * round(u + 0.01, 2)) > free


def test_live_gpu_model_is_strict() -> None:
    with pytest.raises(ValueError, match="total_memory_bytes"):
        LiveGpu(index=0, name="x", total_memory_bytes=0, free_memory_bytes=0)
