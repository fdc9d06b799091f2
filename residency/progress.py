"""How a long library phase reports progress (`BuildProgress`): the CLI draws it as a bar on a
terminal and as log lines elsewhere (residency/cli/progress.py); libraries only call it."""

from __future__ import annotations

from typing import Protocol


class BuildProgress(Protocol):
    """Where a long phase (an index build, a plan, a warm-up) reports its steps."""

    def start(self, description: str, total: int) -> None:
        """A phase of `total` steps begins."""

    def advance(self, steps: int) -> None:
        """`steps` more steps are done."""
