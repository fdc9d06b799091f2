"""The `residency` command: one module per subcommand; this module wires them and maps errors."""

from __future__ import annotations

import sys
from typing import NoReturn

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from residency.errors import USER_ERRORS

app = typer.Typer(
    name="residency",
    help="Plan, warm and serve a resident prompt prefix for vLLM hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_err = Console(stderr=True, soft_wrap=True)


def _register() -> None:
    from residency.cli import plan, profiles

    app.command("plan")(plan.plan)
    app.command("profiles")(profiles.profiles)


_register()


def main() -> None:
    """Console-script entry: run the app; a user error becomes one line on stderr, exit 1."""
    try:
        rv = app(prog_name="residency", standalone_mode=False)
    except USER_ERRORS as exc:
        _fail(str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        _fail(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}")
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        _err.print("aborted")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str) -> NoReturn:
    _err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    sys.exit(1)
