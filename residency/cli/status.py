"""`residency status`: which planned prefixes each upstream holds, from a running router's
`GET /residency` or, with --plan, from a vLLM server's own KV events (no router)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field

from residency.cli.spec import command
from residency.flags import (
    Flag,
    JsonOutput,
    RouterApiKey,
    VllmApiKey,
    Watch,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from rich.console import RenderableType

    from residency.status.client import Reader
    from residency.status.model import ResidencyStatus

RECENT_MAX = 100  # the router keeps this many outcomes per upstream and prefix
COLUMNS = ("up", "prefix", "blocks", "state", "hit/miss", "rewarms", "last eviction", "mode")


class StatusArgs(BaseModel):
    """`residency status`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    url: Annotated[str, Flag(argument=True, metavar="URL")] = Field(
        description="The router's URL; with --plan, a vLLM server's (its KV events on)."
    )
    plan: Path | None = Field(
        default=None,
        description="Read the vLLM server at URL directly, no router: the plan whose prefixes "
        "to show (its events replayed from the publisher's buffer; no request is sent).",
    )
    last: int = Field(
        default=RECENT_MAX,
        ge=1,
        le=RECENT_MAX,
        description="Hits and misses over the last N requests per upstream and prefix.",
    )
    watch: Watch = False
    refresh: float = Field(
        default=1.0, gt=0, le=3600, description="--watch: seconds between redraws."
    )
    json_output: JsonOutput = False
    api_key: RouterApiKey = None
    vllm_api_key: VllmApiKey = None  # with --plan: the vLLM server's own key


@command(StatusArgs)
def status(args: StatusArgs) -> None:
    """Show which planned prefixes each upstream holds: blocks, state, hits, last eviction."""
    import anyio

    anyio.run(_run, args)


async def _run(args: StatusArgs) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console(soft_wrap=False)
    async with _source(args) as read:
        if not args.watch:
            _show(console, await read(), args.json_output)
            return
        if args.json_output:
            while True:
                _show(console, await read(), True)
                await _sleep(args.refresh)
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:  # redrawn in place: one frame replaces the last (no clear, no flicker)
                live.update(render(await read(), time.strftime("%H:%M:%S")), refresh=True)
                await _sleep(args.refresh)


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


def _show(console: object, picture: ResidencyStatus, json_output: bool) -> None:
    from rich.console import Console

    assert isinstance(console, Console)
    if json_output:
        typer.echo(picture.model_dump_json())
    else:
        console.print(render(picture, None))


def _source(args: StatusArgs) -> AbstractAsyncContextManager[Reader]:
    """An async context yielding a coroutine function that reads the picture now."""
    from residency.serve.direct_status import direct_source
    from residency.status.client import router_source

    if args.plan is not None:
        return direct_source(args.plan, args.url, args.vllm_api_key, args.last)
    return router_source(args.url, args.api_key, args.last)


def render(picture: ResidencyStatus, clock: str | None) -> RenderableType:
    """The table: upstream x prefix (one line per upstream when nothing is planned)."""

    from rich.table import Table

    ready = "ready" if picture.ready else f"NOT READY (missing {', '.join(picture.missing)})"
    title = f"plan {picture.plan_sha256[:12]} · {ready}"
    if not picture.prefixes:
        title = "nothing planned (--plan shows a server's prefixes)"
    title += f" · {clock}" if clock else ""
    table = Table(
        title=title, title_justify="left", pad_edge=False, box=None, header_style="bold underline"
    )
    for name in COLUMNS:
        right = name in ("up", "blocks", "hit/miss", "rewarms")
        table.add_column(
            name, justify="right" if right else "left", no_wrap=name != "last eviction"
        )
    health = {u.upstream: u for u in picture.upstreams}
    if not picture.prefixes:
        for u in picture.upstreams:
            state = "healthy" if u.healthy else "down"
            seen = f"{u.evictions} seen"
            table.add_row(u.upstream, "-", "-", state, "-", "-", seen, _mode(u.mode))
        return table
    now = time.time()
    for p in picture.prefixes:
        blocks = "-" if p.resident_blocks is None else f"{p.resident_blocks}/{p.total_blocks or 0}"
        up = p.upstream + ("" if health[p.upstream].healthy else " (down)")
        state = _STATE_STYLE[p.state].format(p.state)
        hits = f"{p.hits}/{p.misses}"
        last = _eviction(p.last_eviction, now)
        table.add_row(up, p.prefix, blocks, state, hits, str(p.rewarms), last, _mode(p.mode))
    return table


_STATE_STYLE = {
    "resident": "[green]{}[/]",
    "partial": "[yellow]{}[/]",
    "evicted": "[red]{}[/]",
    "warming": "[cyan]{}[/]",
}


def _mode(mode: str) -> str:
    return "events" if mode == "events" else "tokens"


def _eviction(e: object, now: float) -> str:
    from residency.status.model import EvictionRecord

    if not isinstance(e, EvictionRecord):
        return "-"
    ago = max(now - e.at_unix_s, 0.0)
    when = f"{ago:.0f}s" if ago < 120 else f"{ago / 60:.0f}m"
    routed = sum(a.uncached_tokens or 0 for a in e.admitted)
    admitted = f"{len(e.admitted)}req {routed}tok" if e.admitted else "past router"
    return f"{when} ago -{e.blocks_lost} {admitted}"
