"""How commands print: one JSON object for --json, and the pieces of their tables."""

from __future__ import annotations

import orjson
import typer
from pydantic import BaseModel
from rich import box
from rich.table import Table


def echo_json(report: BaseModel) -> None:
    """The report as one indented JSON object on stdout."""
    typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))


def pct(value: float | None) -> str:
    """A share as '12.3%' ('n/a' for None)."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def compact_table(title: str, lead: tuple[str, ...], tail: tuple[str, ...] = ()) -> Table:
    """A table with a simple head: `lead` columns left, `tail` columns right-aligned."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name in lead:
        table.add_column(name, no_wrap=True)
    for name in tail:
        table.add_column(name, justify="right", no_wrap=True)
    return table
