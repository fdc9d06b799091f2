"""Command help that never cuts a flag name: usage, description, then each option panel with
every name and metavar whole and the help text wrapped beside or below it.

typer's rich help lays options out as a table of up to six columns (names, short names,
negative names, types, help) and lets rich shrink them all when the terminal is narrow, so at
80 columns `--gpu-memory-utilization` printed as `--gpu-memory-utiliz…`. Here the first column
(click's own help record: every name of the option and its metavar) is never shrunk; a name too
long for it goes on its own line with the help indented below.

Groups (`residency`, `residency eval`, ...) are drawn the same way, with a Commands panel of each
command's first help paragraph, rewrapped: typer's own group help would also import its rich
help module (rich.markdown, markdown-it: ~40 ms of every `--help`, issue #23).
"""

from __future__ import annotations

import inspect

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer import _click as click  # typer ships its own click; its commands are built on it
from typer.core import TyperArgument, TyperCommand, TyperGroup
from typer.main import Typer
from typer.models import DefaultPlaceholder

DEFAULT_PANEL = "Options"
COMMANDS_PANEL = "Commands"
ARGUMENTS_PANEL = "Arguments"
# The name column takes at most this share of the width; longer names get their own line.
NAME_SHARE = 0.42


def _records(command: click.Command, ctx: click.Context) -> dict[str, list[tuple[str, str, bool]]]:
    """(names and metavar, help, required) per panel, in declaration order."""
    panels: dict[str, list[tuple[str, str, bool]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        default = ARGUMENTS_PANEL if isinstance(param, TyperArgument) else DEFAULT_PANEL
        panel = getattr(param, "rich_help_panel", None) or default
        panels.setdefault(panel, []).append((names, help_text, bool(param.required)))
    return panels


def _panel_body(rows: list[tuple[str, str, bool]], width: int) -> RenderableType:
    name_width = max(len(names) + (2 if required else 0) for names, _, required in rows)
    column = min(name_width, max(int(width * NAME_SHARE), 16))
    parts: list[RenderableType] = []
    for names, help_text, required in rows:
        label = Text(names, style="bold cyan", no_wrap=True, overflow="fold")
        if required:
            label = Text.assemble(("* ", "red"), label)
        help_renderable = Text(help_text)
        if label.cell_len <= column:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(width=column, no_wrap=True)
            grid.add_column(ratio=1)
            grid.add_row(label, help_renderable)
            parts.append(grid)
        else:
            parts.append(label)
            parts.append(Padding(help_renderable, (0, 0, 0, 4)))
    return Group(*parts)


def _first_paragraph(text: str | None) -> str:
    """A docstring's first paragraph on one line (the line breaks of the source dropped)."""
    if not text:
        return ""
    return " ".join(inspect.cleandoc(text).split("\f")[0].split("\n\n")[0].split())


def render_command_help(command: click.Command, ctx: click.Context, console: Console) -> None:
    """Print `command`'s help on `console` (usage, description, option panels; a group's
    commands last)."""
    pieces = " ".join(command.collect_usage_pieces(ctx))
    console.print(Text.assemble(" Usage: ", (f"{ctx.command_path} {pieces}", "bold")))
    console.print()
    if command.help:
        text = inspect.cleandoc(command.help).split("\f")[0]
        # Docstring line breaks are not paragraph breaks: rewrap each paragraph to the width.
        for paragraph in text.split("\n\n"):
            console.print(Padding(Text(" ".join(paragraph.split())), (0, 1)))
            console.print()
    panels = _records(command, ctx)
    order = [ARGUMENTS_PANEL, DEFAULT_PANEL] + [
        p for p in panels if p not in (ARGUMENTS_PANEL, DEFAULT_PANEL)
    ]
    inner = console.width - 4  # panel border and padding
    for name in order:
        rows = panels.get(name)
        if rows:
            console.print(
                Panel(
                    _panel_body(rows, inner),
                    title=name,
                    title_align="left",
                    border_style="dim",
                )
            )
    if isinstance(command, TyperGroup):
        summary = getattr(command, "summary", None)
        if callable(summary):  # a lazy group: each command's help without importing it
            rows = [(n, _first_paragraph(summary(n)), False) for n in command.list_commands(ctx)]
        else:
            rows = [
                (name, _first_paragraph(sub.help), False)
                for name in command.list_commands(ctx)
                if (sub := command.get_command(ctx, name)) is not None and not sub.hidden
            ]
        if rows:
            console.print(
                Panel(
                    _panel_body(rows, inner),
                    title=COMMANDS_PANEL,
                    title_align="left",
                    border_style="dim",
                )
            )


class ResidencyCommand(TyperCommand):
    """A typer command whose --help is rendered by `render_command_help`."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        render_command_help(self, ctx, Console(highlight=False))


class ResidencyGroup(TyperGroup):
    """A typer group whose --help is rendered by `render_command_help`."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        render_command_help(self, ctx, Console(highlight=False))


def use_readable_help(app: Typer) -> None:
    """Give `app` and its sub-apps `ResidencyGroup`, and every command registered so far
    `ResidencyCommand`."""
    if app.info.cls in (None, TyperGroup) or isinstance(app.info.cls, DefaultPlaceholder):
        app.info.cls = ResidencyGroup
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = ResidencyCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_readable_help(group.typer_instance)
