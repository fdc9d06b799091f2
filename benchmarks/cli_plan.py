"""Plans for the benchmarks, made by the CLI as a user makes them (`python -m residency plan`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def plan_with_cli(
    index: Path,
    out: Path,
    max_model_len: int,
    *more: str,
    cwd: Path | None = None,
    timeout_s: float | None = 300,
) -> Path:
    """`residency plan --index INDEX --max-model-len N [MORE] -o OUT`; asserts it succeeded."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "residency",
            "plan",
            "--index",
            str(index),
            "--max-model-len",
            str(max_model_len),
            *more,
            "-o",
            str(out),
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr
    return out
