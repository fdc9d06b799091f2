"""Help is readable at 80 columns (issue #23): every flag name of every command is printed whole,
no line is wider than the terminal, and nothing is cut with an ellipsis. Rendered in process
through typer's test runner with COLUMNS=80, as a terminal of that width would show it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer.core
from typer.testing import CliRunner

from residency.cli import app, walk_commands

WIDTH = 80


def _commands() -> Iterator[tuple[tuple[str, ...], object]]:
    for path, command in walk_commands():
        if not isinstance(command, typer.core.TyperGroup):
            yield path, command


COMMANDS = list(_commands())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_flag_name_is_whole_at_80_columns(path: tuple[str, ...], command: object) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= WIDTH
    names = [
        name
        for param in getattr(command, "params", [])
        for name in (*param.opts, *getattr(param, "secondary_opts", []))
        if name.startswith("-")
    ]
    assert names, f"{path} has no options?"
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), f"{name} cut in {path}"


def test_profile_names_are_whole_at_80_columns() -> None:
    from residency.capacity.profiles import gpu_profile_names, model_profile_names

    result = CliRunner().invoke(app, ["profiles"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    for name in (*gpu_profile_names(), *model_profile_names()):
        assert re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", result.output), name


def _groups() -> list[tuple[tuple[str, ...], typer.core.TyperGroup]]:
    return [(p, c) for p, c in walk_commands() if isinstance(c, typer.core.TyperGroup)]


GROUPS = _groups()


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[" ".join(p) or "root" for p, _ in GROUPS])
def test_a_group_lists_every_command_with_its_help_at_80_columns(
    path: tuple[str, ...], group: typer.core.TyperGroup
) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH
    assert "…" not in result.output
    children = {p[-1]: c for p, c in walk_commands() if p[:-1] == path and p}
    assert children, path
    for name, command in children.items():
        first_words = " ".join((command.help or "").split()[:2])
        assert re.search(rf"│ {re.escape(name)} +{re.escape(first_words)}", result.output), name
