"""Planner speed: `residency plan` (capacity part) must take well under a second."""

from __future__ import annotations

from pytest_benchmark.fixture import BenchmarkFixture

from planner import CacheSettings, Reserves, estimate_gpu_kv_memory, plan_capacity
from residency.capacity.profiles import load_gpu_profile, resolve_model
from residency.capacity.report import build_capacity_report
from residency.capacity.request import CapacityRequest


def test_plan_capacity_pure(benchmark: BenchmarkFixture) -> None:
    """The pure planner on the default host (Qwen3.5-4B FP8, RTX 4070, 32K)."""
    model = resolve_model("qwen3.5-4b-fp8")
    gpu = load_gpu_profile("rtx4070-12gb")
    assert model.weights_bytes is not None
    weights = model.weights_bytes

    def run() -> int:
        memory = estimate_gpu_kv_memory(
            total_memory_bytes=gpu.total_memory_bytes,
            gpu_memory_utilization=0.9,
            weights_bytes=weights,
            weights_source="profile",
            model=model.spec,
            max_num_batched_tokens=2048,
            max_num_seqs=256,
        )
        plan = plan_capacity(model.spec, CacheSettings(max_model_len=32768), memory, Reserves())
        return plan.budget.resident_budget_tokens

    budget = benchmark(run)
    assert budget > 0
    assert benchmark.stats is not None
    assert benchmark.stats.stats.median < 0.05  # target: well under a second


def test_capacity_report_with_profile_loading(benchmark: BenchmarkFixture) -> None:
    """Everything `residency plan` does after argument parsing: profiles read from disk."""
    report = benchmark(build_capacity_report, CapacityRequest())
    assert report.resident_budget_tokens > 0
    assert benchmark.stats is not None
    assert benchmark.stats.stats.median < 0.5
