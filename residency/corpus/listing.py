"""Which files a corpus directory holds: every non-hidden file, names that are not UTF-8 kept
(escaped), and the symbolic links that cannot be read (a loop, a missing target, a directory)
listed with the reason instead of silently left out."""

from __future__ import annotations

from pathlib import Path

from residency.corpus.file_names import printable
from residency.corpus.model import SkippedInput

_MAX_REASON = 2000  # SkippedInput.reason's bound


def reason_text(text: str) -> str:
    """A skipped input's reason: printable, within the model's bound."""
    text = printable(text)
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def _link_problem(path: Path) -> str | None:
    """Why a symbolic link is not read (a loop, a missing target, a directory), or None."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python 3.11's "Symlink loop"
        return f"symbolic link not followed: {type(exc).__name__}: {exc}"
    if target.is_dir():
        return "symbolic link to a directory, not followed (it could loop)"
    return None


def corpus_files(root: Path) -> tuple[list[tuple[str, Path]], list[SkippedInput]]:
    """(relpath with '/', path) of every non-hidden file under root, sorted by relpath, and the
    links that cannot be read. A name that is not valid UTF-8 is kept, its relpath escaped."""
    found, problems = [], []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        name = printable(rel.as_posix())
        if path.is_symlink():
            problem = _link_problem(path)
            if problem is not None:
                problems.append(SkippedInput(file=name, line=0, reason=reason_text(problem)))
                continue
        if path.is_file():
            found.append((name, path))
    return sorted(found), sorted(problems, key=lambda s: s.file)
