"""The progress bar the CLI draws on stderr for long library phases (`BuildProgress`)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)


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


def progress_bar(
    json: bool, *, transient: bool = True, eta: bool = False, terminal_only: bool = True
) -> Progress:
    """A bar on stderr (description, bar, done/total, and the time left with `eta`), hidden
    under --json and, with `terminal_only`, when stderr is not a terminal."""
    err = Console(stderr=True)
    columns: list[ProgressColumn] = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
    ]
    if eta:
        columns.append(TimeRemainingColumn())
    return Progress(
        *columns,
        console=err,
        transient=transient,
        disable=json or (terminal_only and not err.is_terminal),
    )
