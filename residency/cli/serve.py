"""`residency serve`: run the OpenAI-compatible router in front of one or more vLLM servers.

Every option is a field of `ServeSettings` (with its `RoutingSettings`, `RequestLimits`,
`PrunerSettings` and `QdrantOptions`; residency/cli/spec.py), but --no-log.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from residency.cli.spec import command
from residency.serve.settings import ServeSettings


class ServeArgs(BaseModel):
    """`residency serve`'s options: the router's settings, and where its query log goes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    settings: ServeSettings = Field(
        default_factory=lambda: ServeSettings(plan=Path("plan.json")),
        description="Everything the router needs.",
    )
    no_log: bool = Field(default=False, description="Do not write a query log.")


@command(ServeArgs)
def serve(args: ServeArgs) -> None:
    """Serve /v1/chat/completions and /v1/completions with the resident prefix first.

    SIGHUP (or --watch-plan) reloads --plan without downtime: the new plan is validated and its
    prefixes warmed on every upstream before new requests use it; requests in flight finish on
    the old one; a plan that fails is refused in one log line and the old plan keeps serving.
    SIGHUP and SIGUSR1 reopen the query log (logrotate's postrotate); a rotated or deleted log
    is also noticed on the next line.
    """
    settings = args.settings
    log = None if args.no_log else (settings.log or settings.plan.parent / "query-log.jsonl")
    settings = settings.model_copy(update={"log": log})
    from residency.serve.run import run_server  # the router's imports load only when serving

    run_server(settings)
