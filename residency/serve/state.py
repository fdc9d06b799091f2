"""The serving state: one plan's context builder and the plan file's sha256, built whole and
swapped whole on reload (a request keeps the state it started with)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from residency.context.builder import ContextBuilder
from residency.errors import ConfigError
from residency.index import Index, open_index
from residency.keep.token_count import KeepWarmPolicy, policy_of
from residency.planning.plan_model import ResidencyPlan, parse_plan, plan_index_dir
from residency.serve.settings import ServeSettings


@dataclass(frozen=True, slots=True)
class ServingState:
    """What requests are served with; never mutated, only replaced."""

    builder: ContextBuilder
    plan_sha256: str  # of the plan file's bytes, hex
    keep_warm: KeepWarmPolicy

    @property
    def short_sha(self) -> str:
        """The first 12 hex digits, for log lines."""
        return self.plan_sha256[:12]


class Current:
    """The serving state now: replaced whole on reload (reload.py), read by every part that
    serves it (the router, the keeper, the canary)."""

    __slots__ = ("state",)

    def __init__(self, state: ServingState) -> None:
        self.state = state


def read_plan_bytes(path: Path) -> bytes:
    """The plan file's bytes; `ConfigError` names the file when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--plan {path}: cannot read it ({exc.strerror})") from None


def load_state(
    settings: ServeSettings, data: bytes | None = None, current: ServingState | None = None
) -> ServingState:
    """Parse plan.json (`data`, else the file), open its index (the current state's when it
    is the same directory holding the same corpus) and build the context builder."""
    raw = read_plan_bytes(settings.plan) if data is None else data
    plan = parse_plan(raw, settings.plan)
    path = settings.index or _plan_index(plan, settings)
    index: Index | None = None
    if current is not None:
        old = current.builder.index
        same_dir = Path(old.directory).resolve() == path.resolve()
        if same_dir and old.manifest.corpus_hash == plan.corpus_hash:
            index = old  # read-only: both states may search it at once
    if index is None:
        backend = None
        if settings.qdrant is not None:
            from residency.index.qdrant_backend import QdrantBackend  # optional dependency

            backend = QdrantBackend(settings.qdrant)
        index = open_index(path, backend=backend)
    builder = ContextBuilder(plan, index, settings.context)
    return ServingState(builder, plan_sha256(raw), policy_of(plan, settings.keep_warm))


def plan_sha256(data: bytes) -> str:
    """The hex sha256 of plan.json's bytes: the plan's identity in logs, /health and metrics."""
    return hashlib.sha256(data).hexdigest()


def _plan_index(plan: ResidencyPlan, settings: ServeSettings) -> Path:
    """The plan's index (recorded absolute; an older plan's relative path beside the plan)."""
    return plan_index_dir(plan, settings.plan)
