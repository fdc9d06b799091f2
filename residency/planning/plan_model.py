"""plan.json: what is resident, why, and the exact prefix the router and `warm` send."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from residency.atomic import write_bytes_atomic
from residency.errors import ConfigError
from residency.planning.placement_model import Placement
from residency.planning.settings import PlanSettings as PlanSettings  # re-exported
from residency.planning.settings import Strategy

PLAN_FORMAT_VERSION = 1


class BlockPool(BaseModel):
    """Hybrid models in align mode: the one block pool every KV-cache group draws from (the
    prefix count is then counted in blocks, planner/prefixes.py `HybridPool`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    num_blocks: int = Field(ge=1, description="vLLM num_gpu_blocks (the null block included).")
    attention_groups: int = Field(ge=1, description="Full-attention KV-cache groups.")
    state_groups: int = Field(ge=1, description="Gated DeltaNet (Mamba state) groups.")
    prefill_chunk_tokens: int = Field(ge=1, description="--max-num-batched-tokens.")
    retention_interval: int | None = Field(
        default=0, ge=0, description="--prefix-cache-retention-interval (None: dense)."
    )


class CapacitySnapshot(BaseModel):
    """The capacity numbers the budget came from."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    model: str = Field(description="Model profile, path or served model.")
    host: str = Field(description="GPU profile, live GPU, server URL or explicit KV bytes.")
    max_model_len: int = Field(ge=1, description="--max-model-len.")
    kv_cache_tokens: int = Field(ge=0, description="KV-cache tokens (vLLM kv_cache_size_tokens).")
    block_size: int = Field(ge=1, description="Attention block size, tokens.")
    is_hybrid: bool = Field(description="Gated DeltaNet layers present (align mode).")
    resident_budget_tokens: int = Field(ge=1, description="Tokens the prefix may take.")
    binding_constraint: str = Field(description="max_model_len or kv_cache.")
    reasoning: str = Field(description="Why the budget is what it is.")
    context_limit_tokens: int | None = Field(
        default=None, description="max_model_len - per-request reserve: one prefix's window."
    )
    concurrency_reserve_tokens: int | None = Field(
        default=None, ge=0, description="KV tokens kept free for --concurrency requests."
    )
    concurrent_requests: int | None = Field(default=None, ge=1, description="--concurrency.")
    per_request_tokens: int | None = Field(
        default=None, ge=0, description="Tokens one request adds after its prefix."
    )
    block_pool: BlockPool | None = Field(
        default=None, description="Hybrid models in align mode: the shared block pool."
    )


class ResidentItem(BaseModel):
    """One resident section (or part of a section split at chunk boundaries)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str = Field(min_length=1, description="Section id, or 'section::partN' for a part.")
    section_id: str = Field(min_length=1, description="The section it comes from.")
    chunk_ids: tuple[str, ...] = Field(description="Chunks it covers (for routing).")
    tokens: int = Field(ge=0, description="Tokens it takes in the rendered prefix.")
    probability: float = Field(ge=0, le=1, description="p(s): evidence probability share.")
    frequency: float = Field(ge=0, le=1, description="Share of logged query mass.")
    density: float = Field(ge=0, description="p(s) per token.")
    pinned: bool = Field(description="Forced resident by --pin.")


class PrefixInfo(BaseModel):
    """The rendered prefix (system-message content) and its proof of identity."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    text: str = Field(description="Exactly what the router sends as the system message.")
    token_count: int = Field(ge=0, description="Tokens of `text` (no special tokens).")
    hash: str = Field(description="sha256 of the token ids (or of the text, see hash_of).")
    hash_of: Literal["token_ids", "text"] = Field(description="What `hash` covers.")
    tokenizer: str = Field(description="Tokenizer the ids and counts come from.")
    pad_tokens: int = Field(ge=0, description="Filler tokens added to reach a block boundary.")
    aligned_to: int | None = Field(default=None, description="Block size it ends on, if any.")


class Coverage(BaseModel):
    """What the plan predicts for the next questions."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    resident_share: float = Field(
        ge=0,
        le=1,
        description="Sum of p(s) over resident items: expected share of questions "
        "whose evidence is in the prefix.",
    )
    resident_sections: int = Field(ge=0, description="Sections wholly or partly resident.")
    total_sections: int = Field(ge=0, description="Sections in the index.")
    budget_used: float = Field(ge=0, description="Prefix tokens / budget.")


class LogFileSummary(BaseModel):
    """One query log file a plan read (one router replica's, say)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    path: str = Field(min_length=1, max_length=4096, description="The file.")
    entries: int = Field(ge=0, description="Lines used.")
    total_count: int = Field(ge=0, description="Questions in it, counting repeats.")
    skipped: int = Field(ge=0, description="Lines skipped as malformed.")
    first_ts: dt.datetime | None = Field(default=None, description="Earliest timestamp.")
    last_ts: dt.datetime | None = Field(default=None, description="Latest timestamp.")


class LogSummary(BaseModel):
    """The query log(s) the frequencies came from, merged by timestamp."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    path: str | None = Field(
        description="The one --log file (the first of several), or None (density-only)."
    )
    entries: int = Field(ge=0, description="Parsed lines, all files.")
    total_count: int = Field(ge=0, description="Questions counting repeats, all files.")
    skipped: int = Field(ge=0, description="Lines skipped as malformed, all files.")
    files: tuple[LogFileSummary, ...] = Field(
        default=(), max_length=10_000, description="Every file read, in --log order."
    )

    def describe_files(self) -> str:
        """' from 2 logs (a.jsonl 120 lines, b.jsonl 80 lines)' when several were merged."""
        if len(self.files) < 2:
            return ""
        shown = ", ".join(f"{Path(f.path).name} {f.entries} lines" for f in self.files[:5])
        return f" from {len(self.files)} logs ({shown}{', ...' if len(self.files) > 5 else ''})"


class PlanPrefix(BaseModel):
    """One of several resident prefixes: its sections, its exact text and its share of traffic."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str = Field(min_length=1, max_length=64, description="'p0', 'p1', ...: busiest first.")
    tokens: int = Field(ge=0, description="Tokens of the prefix text (= prefix.token_count).")
    sha256: str = Field(description="The prefix hash (= prefix.hash).")
    section_ids: tuple[str, ...] = Field(description="Sections wholly or partly in it.")
    traffic_share: float = Field(
        ge=0, le=1, description="Expected share of questions whose evidence is in it (sum p(s))."
    )
    resident: tuple[ResidentItem, ...] = Field(description="Its items, in prefix order.")
    prefix: PrefixInfo = Field(description="The exact prefix.")


class PrefixArithmetic(BaseModel):
    """How several prefixes share the KV cache: the one line `residency plan` prints."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kv_cache_tokens: int = Field(ge=0, description="vLLM kv_cache_size_tokens.")
    window_tokens: int = Field(ge=0, description="The most one prefix may take.")
    resident_kv_tokens: int = Field(
        ge=0, description="KV tokens the prefixes hold, each rounded up to whole blocks."
    )
    headroom_tokens: int = Field(description="KV tokens left for the requests' own tokens.")
    per_request_kv_tokens: int = Field(ge=1, description="One request's own tokens, in blocks.")
    shared_kv_tokens: int = Field(
        default=0,
        ge=0,
        description="Leading tokens every prefix shares (the shared head, whole blocks), held "
        "once in the KV cache and counted once in resident_kv_tokens.",
    )
    concurrency_requested: int = Field(ge=1, description="--concurrency.")
    concurrency_left: int = Field(ge=0, description="Requests the headroom holds at once.")
    prefixes_chosen_by: Literal["auto", "forced"] = Field(description="--prefixes or the planner.")
    counting_rule: str = Field(description="How a cached prefix is counted in the KV cache.")
    pool_blocks: int | None = Field(
        default=None, ge=0, description="Hybrid pool: usable blocks (num_gpu_blocks - 1)."
    )
    resident_blocks: int | None = Field(
        default=None, ge=0, description="Hybrid pool: blocks the cached prefixes hold."
    )
    per_request_blocks: int | None = Field(
        default=None, ge=1, description="Hybrid pool: blocks one running request needs."
    )


class ResidencyPlan(BaseModel):
    """The whole plan, as written to plan.json."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    format_version: Literal[1] = Field(default=1, description="plan.json layout version.")
    created_at: dt.datetime = Field(description="When the plan was made (UTC).")
    strategy: Strategy = Field(description="How residency was chosen.")
    index_dir: str = Field(description="The index the plan was made from.")
    corpus_hash: str = Field(description="The index's corpus hash.")
    capacity: CapacitySnapshot = Field(description="Budget and where it came from.")
    log: LogSummary = Field(description="The query log used.")
    selection_method: str = Field(description="dp, greedy, or the baseline's ordering.")
    optimality_gap_bound: float = Field(ge=0, description="Dantzig bound on lost p(s).")
    resident: tuple[ResidentItem, ...] = Field(description="In prefix order.")
    long_tail_section_ids: tuple[str, ...] = Field(description="Sections left to retrieval.")
    prefix: PrefixInfo = Field(description="The exact prefix.")
    coverage: Coverage = Field(description="Predicted coverage.")
    prefixes: tuple[PlanPrefix, ...] = Field(
        default=(),
        max_length=1024,
        description="Every resident prefix, busiest first (`prefix` and `resident` above are "
        "p0's and all prefixes' items); empty in plans written before several prefixes.",
    )
    arithmetic: PrefixArithmetic | None = Field(
        default=None, description="How the prefixes share the KV cache (None: older plans)."
    )
    placement: Placement | None = Field(
        default=None,
        description="Which replica holds which prefix (None: every replica holds every prefix).",
    )

    @model_validator(mode="after")
    def _prefixes_agree(self) -> ResidencyPlan:
        """`prefix` is p0's, and every prefix's tokens and sha256 are its text's (an edited
        plan.json is refused rather than warmed with one text and served with another)."""
        if self.prefixes and self.prefixes[0].prefix != self.prefix:
            raise ValueError(
                "prefix differs from prefixes[0].prefix: plan.json was edited; re-plan"
            )
        for p in self.prefixes:
            if (p.tokens, p.sha256) != (p.prefix.token_count, p.prefix.hash):
                raise ValueError(f"prefix {p.id}: tokens or sha256 differ from its text; re-plan")
        ids = {p.id for p in self.all_prefixes()}
        for r in self.placement.replicas if self.placement else ():
            if unknown := set(r.prefix_ids) - ids:
                raise ValueError(f"placement: replica {r.position} holds unknown {sorted(unknown)}")
        return self

    def resident_chunk_ids(self) -> frozenset[str]:
        """Chunk ids inside any prefix (what routing treats as resident somewhere)."""
        return frozenset(c for item in self.resident for c in item.chunk_ids)

    def resident_tokens(self) -> int:
        """Tokens of the resident sections, each counted once (a shared head is in every
        prefix's text but is corpus held once)."""
        return sum(r.tokens for r in self.resident)

    def all_prefixes(self) -> tuple[PlanPrefix, ...]:
        """`prefixes`, or the one prefix of a plan written before there were several."""
        if self.prefixes:
            return self.prefixes
        return (single_prefix(self.resident, self.prefix, self.coverage.resident_share),)

    def for_prefix(self, prefix_id: str) -> ResidencyPlan:
        """This plan seen through one prefix (what warm and the checks of one prefix need)."""
        for p in self.all_prefixes():
            if p.id == prefix_id:
                share = p.traffic_share
                coverage = self.coverage.model_copy(update={"resident_share": share})
                update = {"prefix": p.prefix, "resident": p.resident, "coverage": coverage}
                return self.model_copy(update={**update, "prefixes": (p,)})
        raise ConfigError(f"plan has no prefix {prefix_id!r}")


def single_prefix(
    resident: tuple[ResidentItem, ...], prefix: PrefixInfo, share: float, prefix_id: str = "p0"
) -> PlanPrefix:
    """The `PlanPrefix` of one prefix's items and rendered text."""
    return PlanPrefix(
        id=prefix_id,
        tokens=prefix.token_count,
        sha256=prefix.hash,
        section_ids=tuple(dict.fromkeys(i.section_id for i in resident)),
        traffic_share=min(share, 1.0),
        resident=resident,
        prefix=prefix,
    )


def write_plan(plan: ResidencyPlan, path: Path) -> None:
    """Write plan.json atomically (temp file + rename); ConfigError if `path` cannot be written."""
    data = orjson.dumps(plan.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    write_bytes_atomic(path, data + b"\n")


def read_plan(path: Path) -> ResidencyPlan:
    """Read and validate plan.json; `ConfigError` names the file and the first problem."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--plan {path}: cannot read it ({exc.strerror})") from None
    return parse_plan(data, path)


def parse_plan(data: bytes, path: Path) -> ResidencyPlan:
    """Validate plan.json's bytes (read from `path`, which errors name)."""
    remake = "make one with `residency plan`"
    if not data.strip():
        raise ConfigError(f"--plan {path}: the file is empty; {remake}")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--plan {path}: not valid JSON ({exc}); {remake}") from None
    if not isinstance(raw, dict):
        kind = "a JSON array" if isinstance(raw, list) else f"a JSON {type(raw).__name__}"
        raise ConfigError(f"--plan {path}: not a residency plan ({kind}); {remake}")
    missing = [
        name
        for name, f in ResidencyPlan.model_fields.items()
        if f.is_required() and name not in raw
    ]
    if len(missing) > 1:
        raise ConfigError(
            f"--plan {path}: not a residency plan (it lacks {', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}); {remake}"
        )
    try:
        return ResidencyPlan.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(
            f"--plan {path}: {'.'.join(map(str, err['loc']))}: {err['msg']}; {remake}"
        ) from None


def plan_index_dir(plan: ResidencyPlan, plan_path: Path) -> Path:
    """The index a plan was made from: recorded absolute; a relative path (plans written before
    paths were stored absolute) is read beside the plan, else from here."""
    recorded = Path(plan.index_dir)
    if recorded.is_absolute():
        return recorded
    beside = plan_path.parent / recorded
    return beside if beside.exists() or not recorded.exists() else recorded
