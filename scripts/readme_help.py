"""Regenerate (or, with --check, verify) the CLI reference, docs/cli.md.

Each block sits between `<!-- help: residency ARGS -->` and `<!-- /help -->` and holds the output
of `residency ARGS --help` at 80 columns without colour, so the reference cannot drift from the
CLI. --check also fails when a command has no block (a new command must be documented).

    PYTHONPATH=. python scripts/readme_help.py            # rewrite docs/cli.md
    PYTHONPATH=. python scripts/readme_help.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI_DOC = REPO / "docs" / "cli.md"
COLUMNS = 80
BLOCK = re.compile(
    r"(<!-- help: residency(?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /help -->)", re.S
)


def render_help(args: str) -> str:
    """`residency ARGS --help` as the reference shows it."""
    env = {
        **os.environ,
        "COLUMNS": str(COLUMNS),
        "NO_COLOR": "1",
        "TERM": "dumb",
        "_TYPER_FORCE_DISABLE_TERMINAL": "1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "residency", *args.split(), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"residency {args.strip()} --help failed ({out.returncode}): {out.stderr}")
    body = "\n".join(line.rstrip() for line in out.stdout.strip("\n").splitlines())
    return f"```text\n{body}\n```\n"


def regenerate(text: str) -> str:
    """The reference's text with every help block re-rendered."""
    return BLOCK.sub(lambda m: m.group(1) + render_help(m["args"]) + m.group(4), text)


def leaf_commands() -> Iterator[str]:
    """Every command a user can run ('plan', 'eval answers', ...), as the CLI declares them."""
    sys.path.insert(0, str(REPO))
    from typer.core import TyperGroup

    from residency.cli import walk_commands

    for path, command in walk_commands():
        if not isinstance(command, TyperGroup):
            yield " ".join(path)


def undocumented(text: str) -> list[str]:
    """Commands with no help block in the reference."""
    documented = {" ".join(m["args"].split()) for m in BLOCK.finditer(text)}
    return [c for c in leaf_commands() if c not in documented]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--file", type=Path, default=CLI_DOC, help="the reference to rewrite")
    args = parser.parse_args(argv)
    text = args.file.read_text(encoding="utf-8")
    new = regenerate(text)
    failed = False
    if args.check and new != text:
        print(
            f"{args.file} help blocks are stale: run "
            "PYTHONPATH=. python scripts/readme_help.py (or make cli-docs)"
        )
        failed = True
    if not args.check:
        args.file.write_text(new, encoding="utf-8")
    missing = undocumented(text)
    if missing:
        print(f"{args.file}: no help block for: " + ", ".join(f"residency {c}" for c in missing))
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
