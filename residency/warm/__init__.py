"""The warm stage: check a vLLM server against a plan (`verify`), prefill the prefix every
request shares and prove it is cached (`prefill`), and keep it so (`watch`, `warm --watch`).

Takes plan.json from the plan stage; hands a warmed server to serve. May import: planner, the
cross-cutting modules, capacity, planning.
"""

from residency.warm.prefill import PrefixWarm, WarmOptions, WarmReport, warm
from residency.warm.verify import WarmTarget, check_server, served_matches, shared_prefix_ids
from residency.warm.watch import WatchEvent, WatchSettings, watch

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
    "watch",
]
