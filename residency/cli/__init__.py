"""The `residency` command: one module per subcommand; this module wires them and maps errors.

Imported by nothing but `residency.__main__`. May import: everything.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from residency.cli.help import use_readable_help
from residency.errors import USER_ERRORS

app = typer.Typer(
    name="residency",
    help="Plan, warm and serve a resident prompt prefix for vLLM hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_err = Console(stderr=True, soft_wrap=True)


_COMMANDS = (
    "plan", "profiles", "index", "eval", "corpus", "model", "warm", "serve", "bench", "demo",
)  # fmt: skip


_GROUPS = frozenset({"eval", "corpus", "model"})


def _register(only: str | None = None) -> None:
    """Register every command, or only `only` (and a hidden placeholder that keeps `residency`
    a group): `residency plan ...` then imports the plan command's module and not the others'."""
    import importlib

    def load(name: str) -> ModuleType:
        return importlib.import_module(f"residency.cli.{name}")

    wanted = [only] if only else list(_COMMANDS)
    for name in wanted:
        module = load(name)
        if name in _GROUPS:
            app.add_typer(module.app, name=name)
        else:
            app.command(name)(getattr(module, name))
    if only:
        app.command("_", hidden=True)(lambda: None)
    use_readable_help(app)


def _register_summaries() -> None:
    """`residency --help` alone: each command as a stub carrying its own help, read from its
    module's source (the command's docstring, a group's `Typer(help=...)`) without importing it."""
    import ast
    from pathlib import Path

    here = Path(__file__).parent
    # typer lists commands before groups: the same order here
    for name in sorted(_COMMANDS, key=lambda n: n in _GROUPS):
        summary = ""
        for node in ast.parse((here / f"{name}.py").read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                summary = ast.get_docstring(node) or ""
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "app" for t in node.targets)
                and isinstance(node.value, ast.Call)
            ):
                helps = [k.value for k in node.value.keywords if k.arg == "help"]
                summary = str(ast.literal_eval(helps[0])) if helps else ""
        app.command(name, help=summary)(lambda: None)
    use_readable_help(app)


def _invoked(argv: list[str]) -> tuple[bool, str | None]:
    """(ran as the CLI, the command it names): `residency plan ...` or `python -m residency
    plan ...`; (False, None) in any other process (tests, library use: every command is
    registered)."""
    program = argv[0] if argv else ""
    ran_as_cli = program.endswith(("residency", "residency/__main__.py"))
    named = argv[1] if ran_as_cli and len(argv) > 1 and argv[1] in _COMMANDS else None
    return ran_as_cli, named


_ran_as_cli, _command = _invoked(sys.argv)
if _ran_as_cli and sys.argv[1:] in ([], ["--help"]):
    _register_summaries()
else:
    _register(_command)


def main() -> None:
    """Console-script entry: run the app; a user error becomes one line on stderr, exit 1."""
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
    _err.print("aborted")
    sys.exit(130)


def _fail(message: str) -> NoReturn:
    _err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    sys.exit(1)
