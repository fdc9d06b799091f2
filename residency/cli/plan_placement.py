"""How `residency plan` prints a fleet's placement: replica x prefixes x tokens x traffic."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from residency.planning.plan_model import ResidencyPlan


def render_placement(plan: ResidencyPlan, console: Console) -> None:
    """One row per replica: its prefixes, their KV tokens against its room, its traffic."""
    placement = plan.placement
    if placement is None:
        return
    table = Table(title=f"Placement over {len(placement.replicas)} replicas ({placement.method})")
    for name in ("replica", "host", "prefixes", "KV tokens / room", "traffic share"):
        table.add_column(name, justify="right" if name != "prefixes" else "left")
    for r in placement.replicas:
        table.add_row(
            str(r.position),
            escape(r.host),
            ", ".join(r.prefix_ids) or "-",
            f"{r.resident_kv_tokens:,} / {r.room_tokens:,}",
            f"{r.load_share:.1%}",
        )
    console.print(table)
    unique = plan.resident_tokens()
    copies = sum(len(placement.holders(p.id)) for p in plan.all_prefixes())
    console.print(
        f"fleet: {len(plan.all_prefixes())} prefixes ({copies} copies) hold {unique:,} "
        "distinct resident tokens; --upstream order must match the replica positions"
    )
