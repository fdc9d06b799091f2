"""The exception tree drawn in residency/errors.py names every exception class the code defines,
under the parent it really has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import residency.errors

ROOT = Path(__file__).resolve().parent.parent
DOC = residency.errors.__doc__ or ""


def _defined() -> dict[str, list[str]]:
    """Exception classes (name -> base names) defined in planner/ and residency/."""
    found: dict[str, list[str]] = {}
    for path in [*(ROOT / "residency").rglob("*.py"), *(ROOT / "planner").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (
                node.name.endswith("Error") or node.name in ("ResidencyError",)
            ):
                found[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]
    return found


def test_every_exception_class_is_drawn() -> None:
    drawn = set(re.findall(r"\b(_?[A-Z]\w*Error)\b", DOC))
    missing = sorted(set(_defined()) - drawn)
    assert missing == []


def test_drawn_parents_are_the_real_ones() -> None:
    # A row's depth is the column its class name starts at; its parent is the nearest row above
    # that starts further left ("├── Child" / "└── Child" under "Parent").
    rows: list[tuple[int, str]] = []
    for line in DOC.splitlines():
        match = re.search(r"(_?[A-Z]\w*Error)\b", line)
        if match and set(line[: match.start()]) <= set(" │├└─.abcdefghijklmnopqrstuvwxyz_"):
            glyph = "──" in line[: match.start()]
            depth = match.start() if glyph else len(line) - len(line.lstrip())
            rows.append((depth, match.group(1)))
    defined = _defined()
    for i, (depth, name) in enumerate(rows):
        parents = [n for d, n in reversed(rows[:i]) if d < depth]
        if parents:
            assert parents[0] in defined.get(name, []), f"{name} drawn under {parents[0]}"
