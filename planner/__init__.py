"""Pure planning: KV-cache capacity math mirroring vLLM v1, and the resident budget.

No I/O and no dependency beyond the standard library and pydantic: a test checks that importing
it pulls in neither `httpx` nor `residency`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.budget import Reserves, ResidentBudget, compute_resident_budget
    from planner.capacity import KVCapacity, compute_kv_capacity, max_len_that_fits
    from planner.capacity_plan import CapacityPlan, plan_capacity
    from planner.errors import CapacityError, InfeasiblePlanError, ModelConfigError, PlannerError
    from planner.kv_layout import CacheSettings, KVGroup, KVLayout, build_kv_layout
    from planner.memory import GpuMemoryEstimate, MemoryTerm, estimate_gpu_kv_memory
    from planner.model_spec import GdnSpec, ModelSpec, model_spec_from_hf_config

__all__ = [
    "CacheSettings",
    "CapacityError",
    "CapacityPlan",
    "GdnSpec",
    "GpuMemoryEstimate",
    "InfeasiblePlanError",
    "KVCapacity",
    "KVGroup",
    "KVLayout",
    "MemoryTerm",
    "ModelConfigError",
    "ModelSpec",
    "PlannerError",
    "Reserves",
    "ResidentBudget",
    "build_kv_layout",
    "compute_kv_capacity",
    "compute_resident_budget",
    "estimate_gpu_kv_memory",
    "max_len_that_fits",
    "model_spec_from_hf_config",
    "plan_capacity",
]

# Loaded on first use (PEP 562), so `import planner.errors` (which every residency module does
# through residency.errors) does not build every planner model: the CLI's --help stays instant.
_SUBMODULES = ("budget", "capacity", "capacity_plan", "errors", "kv_layout", "memory", "model_spec")


def __getattr__(name: str) -> object:
    if name in __all__:
        for sub in _SUBMODULES:
            module = importlib.import_module(f"planner.{sub}")
            if name in vars(module):
                value = vars(module)[name]
                globals()[name] = value
                return value
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
