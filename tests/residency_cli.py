"""`python -m residency ARGS` as a user runs it (from the repository root), for the tests that
drive the CLI in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the CLI to the end; stdout and stderr as text. Wide output (COLUMNS=250, as
    conftest sets): rich never wraps a phrase a test looks for at a long tmp path."""
    return subprocess.run(
        [sys.executable, "-m", "residency", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "250")},
    )
