"""`residency demo`: the whole product on a CPU-only machine, from tiny model to TTFT picture."""

from residency.demo.questions import QuestionResult
from residency.demo.run import DemoOptions, DemoReport, StepResult, run_demo
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
