"""The warm stage: check a vLLM server against a plan (`verify`), prefill the prefix every
request shares and prove it is cached (`prefill`), and keep it so (`watch.watch`, for
`warm --watch`: not re-exported, the name is its module's). Re-exported lazily, so the CLI reads
`options` without the HTTP client.

Takes plan.json from the plan stage; hands a warmed server to serve. May import: planner, the
cross-cutting modules, capacity, planning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from residency.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from residency.warm.options import WarmOptions, WatchSettings
    from residency.warm.prefill import PrefixWarm, WarmReport, warm
    from residency.warm.verify import WarmTarget, check_server, served_matches, shared_prefix_ids
    from residency.warm.watch import WatchEvent

__all__ = [
    "PrefixWarm",
    "WarmOptions",
    "WarmReport",
    "WarmTarget",
    "WatchEvent",
    "WatchSettings",
    "check_server",
    "served_matches",
    "shared_prefix_ids",
    "warm",
]

__getattr__ = lazy_exports(__name__, __file__)
