"""Regenerate (or, with --check, verify) the CLI help blocks in README.md.

Each block sits between `<!-- help: residency ARGS -->` and `<!-- /help -->` and holds the output
of `residency ARGS --help` at 100 columns without colour, so the README cannot drift from the CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(
    r"(<!-- help: residency (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /help -->)", re.S
)


def render_help(args: str) -> str:
    """`residency ARGS --help` as the README shows it."""
    env = {
        **os.environ,
        "COLUMNS": "100",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "_TYPER_FORCE_DISABLE_TERMINAL": "1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "residency", *args.split(), "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    body = "\n".join(line.rstrip() for line in out.strip("\n").splitlines())
    return f"```text\n{body}\n```\n"


def regenerate(text: str) -> str:
    """README text with every help block re-rendered."""
    return BLOCK.sub(lambda m: m.group(1) + render_help(m["args"]) + m.group(4), text)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    new = regenerate(text)
    if "--check" in sys.argv:
        if new != text:
            print("README.md help blocks are stale: run python scripts/readme_help.py")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
