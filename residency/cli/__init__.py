"""The `residency` command: one module per subcommand; this module wires them and maps errors.

Imported by nothing but `residency.__main__`. May import: everything.
"""

from __future__ import annotations

import sys
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


def _register() -> None:
    from residency.cli import bench as bench_cli
    from residency.cli import corpus as corpus_cli
    from residency.cli import demo as demo_cli
    from residency.cli import eval as eval_cli
    from residency.cli import index as index_cli
    from residency.cli import model as model_cli
    from residency.cli import plan, profiles
    from residency.cli import serve as serve_cli
    from residency.cli import warm as warm_cli

    app.command("plan")(plan.plan)
    app.command("profiles")(profiles.profiles)
    app.command("index")(index_cli.index)
    app.add_typer(eval_cli.app, name="eval")
    app.add_typer(corpus_cli.app, name="corpus")
    app.add_typer(model_cli.app, name="model")
    app.command("warm")(warm_cli.warm)
    app.command("serve")(serve_cli.serve)
    app.command("bench")(bench_cli.bench)
    app.command("demo")(demo_cli.demo)
    use_readable_help(app)


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
