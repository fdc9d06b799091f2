"""The rich progress bar the CLI draws for long library phases (`BuildProgress`)."""

from __future__ import annotations

from rich.progress import Progress, TaskID


class BarProgress:
    """`residency.index.BuildProgress` drawn on a rich `Progress` (one bar per phase)."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._task: TaskID | None = None

    def start(self, description: str, total: int) -> None:
        """Begin a new bar (the previous one stays, completed)."""
        self._task = self._bar.add_task(description, total=total)

    def advance(self, steps: int) -> None:
        """Move the current bar."""
        if self._task is not None:
            self._bar.advance(self._task, steps)
