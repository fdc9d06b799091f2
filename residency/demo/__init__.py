"""`residency demo`: the whole product on a CPU-only machine, from a local model to real answers
and the TTFT picture, within a time budget; it runs every stage in order.

May import: planner, the cross-cutting modules, bench, capacity, context, corpus, eval, index,
models, planning, retrieval, serve, status, timex, warm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.demo.options import DemoOptions
    from residency.demo.questions import QuestionResult
    from residency.demo.report import DemoReport, StepResult
    from residency.demo.run import run_demo
    from residency.demo.servers import ProcessInfo, Terminated

__all__ = [
    "DemoOptions",
    "DemoReport",
    "ProcessInfo",
    "QuestionResult",
    "StepResult",
    "Terminated",
    "run_demo",
]

__getattr__ = lazy_exports(__name__, __file__)
