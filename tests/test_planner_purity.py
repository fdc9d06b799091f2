"""The planner package stays pure: importing it pulls in no HTTP client and no application code."""

from __future__ import annotations

import subprocess
import sys


def test_importing_planner_pulls_in_neither_httpx_nor_residency() -> None:
    code = (
        "import sys, planner, planner.capacity_plan, planner.memory, planner.budget\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('httpx', 'residency', 'requests', 'typer', 'rich', 'orjson'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
