"""The README stays true: its CLI help blocks are generated from the CLI itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_help_blocks_match_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_help.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_readme_starts_with_the_two_fresh_machine_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "make install && .venv/bin/residency demo" in first_block
    assert "make test" in first_block
