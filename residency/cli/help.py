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
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass
from typing import TextIO

from typer import _click as click  # typer ships its own click; its commands are built on it
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
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


def _wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped at spaces to ``width`` columns (a longer word is cut), as rich wraps."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines.extend(
            textwrap.wrap(paragraph, max(width, 1), break_on_hyphens=False, tabsize=1) or [""]
        )
    return lines


class _Style:
    """ANSI styles when the console has colour, else nothing (pipes, NO_COLOR, TERM=dumb)."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, codes: str) -> str:
        return f"\x1b[{codes}m{text}\x1b[0m" if self.colour and text else text


def _panel(title: str, rows: list[tuple[str, str, bool]], width: int, style: _Style) -> list[str]:
    """A rounded box titled ``title``: each row's names in a column never cut (a longer one on
    its own line, the help indented below it), the help wrapped beside."""
    inner = width - 4  # border and one space each side
    name_width = max(len(names) + (2 if required else 0) for names, _, required in rows)
    column = min(name_width, max(int(inner * NAME_SHARE), 16))
    body: list[tuple[str, int]] = []  # (styled text, its visible width)
    for names, help_text, required in rows:
        plain = ("* " if required else "") + names
        styled = (style("* ", "31") if required else "") + style(names, "1;36")
        if len(plain) <= column:
            helps = _wrap(help_text, inner - column - 2) if help_text else [""]
            pad = " " * (column - len(plain) + 2)
            body.append((styled + pad + helps[0], column + 2 + len(helps[0])))
            body.extend((" " * (column + 2) + h, column + 2 + len(h)) for h in helps[1:])
        else:
            for start in range(0, len(plain), inner):  # folded, as rich folds
                piece = plain[start : start + inner]
                body.append((style(piece, "1;36"), len(piece)))
            if help_text:
                body.extend(("    " + h, 4 + len(h)) for h in _wrap(help_text, inner - 4))
    border = "2"
    head = f"╭─ {title} "
    out = [style(head, border) + style("─" * (width - len(head) - 1) + "╮", border)]
    bar = style("│", border)
    out.extend(f"{bar} {text}{' ' * max(inner - seen, 0)} {bar}" for text, seen in body)
    out.append(style("╰" + "─" * (width - 2) + "╯", border))
    return out


def _first_paragraph(text: str | None) -> str:
    """A docstring's first paragraph on one line (the line breaks of the source dropped)."""
    if not text:
        return ""
    return " ".join(inspect.cleandoc(text).split("\f")[0].split("\n\n")[0].split())


@dataclass(frozen=True)
class Terminal:
    """Where help goes: the stream, its width and whether it shows colour (rich's own rules:
    COLUMNS, else the terminal's width, else 80; colour on a terminal unless NO_COLOR or
    TERM=dumb, or with FORCE_COLOR). Plain, so no `--help` imports rich."""

    file: TextIO
    width: int
    colour: bool

    @classmethod
    def stdout(cls) -> Terminal:
        """This process's stdout as it is now (a test runner's capture included)."""
        file = sys.stdout
        env = os.environ
        tty = hasattr(file, "isatty") and file.isatty()
        width = shutil.get_terminal_size((80, 24)).columns if tty else 80
        if env.get("COLUMNS", "").isdigit():
            width = int(env["COLUMNS"])
        colour = tty and "NO_COLOR" not in env and env.get("TERM") != "dumb"
        return cls(file, width, colour or (bool(env.get("FORCE_COLOR")) and "NO_COLOR" not in env))


def render_command_help(command: click.Command, ctx: click.Context, out: Terminal) -> None:
    """Print `command`'s help on `out` (usage, description, option panels; a group's commands
    last). Drawn as plain lines (ANSI colour where the terminal has it): rich's panel and table
    layout cost more than the rest of a `--help`."""
    width = out.width
    style = _Style(out.colour)
    pieces = " ".join(command.collect_usage_pieces(ctx))
    usage = _wrap(f" Usage: {ctx.command_path} {pieces}", width)
    lines = [
        usage[0].replace(" Usage: ", " Usage: " + "\x1b[1m", 1) + "\x1b[0m"
        if style.colour
        else usage[0],
        *usage[1:],
        "",
    ]
    if command.help:
        text = inspect.cleandoc(command.help).split("\f")[0]
        # Docstring line breaks are not paragraph breaks: rewrap each paragraph to the width.
        for paragraph in text.split("\n\n"):
            lines.extend(" " + line for line in _wrap(" ".join(paragraph.split()), width - 2))
            lines.append("")
    panels = _records(command, ctx)
    order = [ARGUMENTS_PANEL, DEFAULT_PANEL] + [
        p for p in panels if p not in (ARGUMENTS_PANEL, DEFAULT_PANEL)
    ]
    for name in order:
        rows = panels.get(name)
        if rows:
            lines.extend(_panel(name, rows, width, style))
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
            lines.extend(_panel(COMMANDS_PANEL, rows, width, style))
    out.file.write("\n".join(lines) + "\n")
    out.file.flush()


def _plain_help_option(option: TyperOption | None) -> TyperOption | None:
    """--help off by default as a bool, not None: typer then takes the value as it is, instead
    of building a pydantic validator for it (and loading pydantic's plugins) on every run,
    `--help` included."""
    if option is not None:
        option.default = False
    return option


class ResidencyCommand(TyperCommand):
    """A typer command whose --help is rendered by `render_command_help`."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        render_command_help(self, ctx, Terminal.stdout())

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        return _plain_help_option(super().get_help_option(ctx))


class ResidencyGroup(TyperGroup):
    """A typer group whose --help is rendered by `render_command_help`."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        render_command_help(self, ctx, Terminal.stdout())

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        return _plain_help_option(super().get_help_option(ctx))


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
