"""The `residency` command: one module per subcommand; this module wires them and maps errors.

Imported by nothing but `residency.__main__`. May import: everything.
"""

from __future__ import annotations

import ast
import atexit
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from pydantic import ValidationError
from typer import _click as click  # typer ships its own click
from typer.core import TyperGroup
from typer.models import CommandInfo

from residency.cli.help import ResidencyCommand, ResidencyGroup, use_readable_help
from residency.errors import USER_ERRORS

if TYPE_CHECKING:
    from rich.console import Console

_COMMANDS = (
    "plan",
    "profiles",
    "index",
    "eval",
    "corpus",
    "model",
    "warm",
    "serve",
    "status",
    "bench",
    "demo",
)
_GROUPS = frozenset({"eval", "corpus", "model"})
_HERE = Path(__file__).parent


def summary(name: str) -> str:
    """A command's help read from its module's source without importing it (the command
    function's docstring, or a group's `Typer(help=...)`): `residency --help` stays instant."""
    for node in ast.parse((_HERE / f"{name}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_docstring(node) or ""
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "app" for t in node.targets)
            and isinstance(node.value, ast.Call)
        ):
            helps = [k.value for k in node.value.keywords if k.arg == "help"]
            return str(ast.literal_eval(helps[0])) if helps else ""
    return ""


class LazyGroup(ResidencyGroup):
    """`residency`: each command's module is imported when click looks the command up by name
    (`residency plan ...` imports cli/plan.py and no other command's module)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        # typer lists commands before groups: the same order here
        return sorted(_COMMANDS, key=lambda n: n in _GROUPS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module = importlib.import_module(f"residency.cli.{cmd_name}")
        if cmd_name in _GROUPS:
            sub: typer.Typer = module.app
            use_readable_help(sub)
            return typer.main.get_group(sub)
        info = CommandInfo(name=cmd_name, callback=getattr(module, cmd_name), cls=ResidencyCommand)
        return typer.main.get_command_from_info(
            info, pretty_exceptions_short=True, rich_markup_mode=None
        )

    def summary(self, cmd_name: str) -> str:
        """The command's first help paragraph, without importing it."""
        return summary(cmd_name)


app = typer.Typer(
    name="residency",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Plan, warm and serve a resident prompt prefix for vLLM hosts."""


def walk_commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and group of the CLI, each loaded, root first (docs and tests)."""
    root = typer.main.get_command(app)

    def walk(
        command: click.Command, path: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        yield path, command
        if isinstance(command, TyperGroup):
            ctx = click.Context(command, info_name=path[-1] if path else "residency")
            for name in command.list_commands(ctx):
                child = command.get_command(ctx, name)
                if child is not None and not child.hidden:
                    yield from walk(child, (*path, name))

    yield from walk(root, ())


def _err() -> Console:
    """stderr through rich, imported when an error is printed (not on every `--help`)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


# Set by the console entry points (not by tests that call `main` in their own process): after
# Ctrl-C or SIGTERM the process ends itself (see `_aborted`).
_OWN_PROCESS = False


def console_main() -> None:
    """The `residency` command and `python -m residency`: `main` in a process of its own."""
    global _OWN_PROCESS
    _OWN_PROCESS = True
    main()


def main() -> None:
    """Run the app; a user error becomes one line on stderr, exit 1; Ctrl-C exits 130."""
    try:
        rv = app(prog_name="residency", standalone_mode=False)
    except USER_ERRORS as exc:
        _fail(str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        _fail(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}")
    except typer.TyperException as exc:  # usage errors: typer ships its own click
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        sys.exit(getattr(exc, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt):
        _aborted()
    if rv == 130:  # typer returns 130 on Ctrl-C in non-standalone mode
        _aborted()
    sys.exit(rv if isinstance(rv, int) else 0)


def _aborted() -> NoReturn:
    _err().print("aborted")
    if _OWN_PROCESS:
        # A KeyboardInterrupt that passed out of code run by exec() or eval() (an import,
        # a generated class) sets CPython's "unhandled KeyboardInterrupt" flag even though it
        # is handled here, and the interpreter then ends itself by SIGINT at exit (status -2,
        # not 130; seen on a loaded machine). So: the exit handlers (servers this process
        # started), the streams, then the exit status itself.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(130)


def _fail(message: str) -> NoReturn:
    from rich.markup import escape

    _err().print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    sys.exit(1)
