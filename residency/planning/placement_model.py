"""plan.json's `placement`: which replica of a fleet holds which resident prefix."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaPlacement(BaseModel):
    """One replica (its position in `serve --upstream` / `warm --server` order) and its prefixes."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    position: int = Field(ge=0, le=1023, description="Its position in --upstream order.")
    host: str = Field(max_length=4096, description="Its GPU profile or server URL.")
    kv_cache_tokens: int = Field(ge=0, description="Its KV cache (vLLM kv_cache_size_tokens).")
    room_tokens: int = Field(ge=0, description="KV tokens its prefixes may take.")
    prefix_ids: tuple[str, ...] = Field(max_length=1024, description="The prefixes it holds.")
    resident_kv_tokens: int = Field(ge=0, description="KV tokens those prefixes take.")
    load_share: float = Field(
        ge=0, description="Traffic it takes: its prefixes' shares, each split over its copies."
    )


class Placement(BaseModel):
    """The fleet: every replica's prefixes (a prefix on several replicas is replicated)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    replicas: tuple[ReplicaPlacement, ...] = Field(
        min_length=1, max_length=1024, description="Every replica, in position order."
    )
    method: str = Field(max_length=200, description="How the prefixes were placed.")

    def holders(self, prefix_id: str) -> tuple[int, ...]:
        """Positions of the replicas that hold `prefix_id`."""
        return tuple(r.position for r in self.replicas if prefix_id in r.prefix_ids)

    def prefix_ids_of(self, position: int) -> tuple[str, ...] | None:
        """The prefixes the replica at `position` holds (None: not in the placement)."""
        for r in self.replicas:
            if r.position == position:
                return r.prefix_ids
        return None
