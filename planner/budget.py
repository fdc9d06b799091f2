"""The resident budget: how many prefix tokens may stay cached and still leave room to answer.

    budget = min(max_model_len - per-request reserve,
                 kv_cache_tokens - concurrent_requests x per-request reserve (in whole blocks))

The per-request reserve is what each request adds after the shared prefix: the question, the
retrieved long-tail chunks, the answer and the chat template's own tokens. The prefix's blocks
are shared by every request (prefix caching), so the KV side pays for it once. Hybrid models
only cache whole attention blocks (align mode), so their budget is rounded down to a block.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import InfeasiblePlanError
from planner.units import round_up

# The share of the KV cache resident prefixes may take by default (--max-resident-share):
# 1.0 keeps the planner's rule (everything the concurrency reserve leaves); see docs/plan.md.
MAX_RESIDENT_SHARE = 1.0


ConcurrentRequests = Annotated[
    int, Field(ge=1, description="--concurrency: requests that run at the same time.")
]
"""`--concurrency`, declared once: `plan`'s reserve and the host `eval coverage` models."""


class Reserves(BaseModel):
    """Tokens each request needs beyond the resident prefix, and how many run at once."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    question_tokens: int = Field(
        default=256, ge=0, description="--reserve-question: tokens for the question."
    )
    retrieved_tokens: int = Field(
        default=2048,
        ge=0,
        description="--reserve-retrieved: tokens for retrieved long-tail chunks.",
    )
    output_tokens: int = Field(
        default=1024, ge=0, description="--reserve-output: tokens for the answer."
    )
    template_tokens: int = Field(
        default=64, ge=0, description="--reserve-template: chat-template overhead tokens."
    )
    concurrent_requests: ConcurrentRequests = 1
    max_resident_share: float = Field(
        default=MAX_RESIDENT_SHARE,
        gt=0,
        le=1,
        description="--max-resident-share: the most of the KV cache the resident prefixes may "
        "take; the rest stays free for other traffic (at least the --concurrency reserve). "
        "Measured: docs/plan.md#how-much-of-the-pool-to-keep-resident.",
    )

    @property
    def per_request_tokens(self) -> int:
        """Tokens one request adds after the shared prefix."""
        return (
            self.question_tokens + self.retrieved_tokens + self.output_tokens + self.template_tokens
        )


BindingConstraint = Literal["max_model_len", "kv_cache"]


class ResidentBudget(BaseModel):
    """The resident prefix budget and the constraint that sets it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    resident_budget_tokens: int = Field(ge=1, description="Tokens the prefix may take.")
    binding_constraint: BindingConstraint = Field(description="The smaller of the two limits.")
    context_limit_tokens: int = Field(description="max_model_len - per-request reserve.")
    kv_limit_tokens: int = Field(description="KV tokens - concurrency reserve.")
    concurrency_reserve_tokens: int = Field(ge=0, description="KV tokens kept for requests.")
    block_aligned: bool = Field(description="Rounded down to whole attention blocks.")
    reasoning: str = Field(description="One sentence on why the budget is what it is.")


def compute_resident_budget(
    *,
    max_model_len: int,
    kv_cache_tokens: int,
    block_size: int,
    reserves: Reserves,
    align_to_blocks: bool,
) -> ResidentBudget:
    """Resident budget in tokens; `InfeasiblePlanError` when it is at or below zero."""
    per_request = reserves.per_request_tokens
    context_limit = max_model_len - per_request
    # A request's own tokens never share blocks with other requests: whole blocks each.
    concurrency_reserve = reserves.concurrent_requests * round_up(per_request, block_size)
    # --max-resident-share: what the resident prefixes may not take stays free as well, e.g.
    # 0.5 of 12,288 KV tokens in 128-token blocks keeps 12,288 - 6,144 = 6,144 free.
    capped = int(kv_cache_tokens * reserves.max_resident_share) // block_size * block_size
    concurrency_reserve = max(concurrency_reserve, kv_cache_tokens - capped)
    kv_limit = kv_cache_tokens - concurrency_reserve
    binding: BindingConstraint = "max_model_len" if context_limit <= kv_limit else "kv_cache"
    budget = min(context_limit, kv_limit)
    if align_to_blocks:
        budget = budget // block_size * block_size
    if budget <= 0:
        if binding == "max_model_len":
            raise InfeasiblePlanError(
                f"no room for a resident prefix: --max-model-len {max_model_len} minus "
                f"{per_request} reserved tokens per request leaves {budget}; raise "
                f"--max-model-len to at least {per_request + block_size} or lower the "
                "--reserve-* flags"
            )
        raise InfeasiblePlanError(
            f"no room for a resident prefix: {kv_cache_tokens} KV-cache tokens minus "
            f"{concurrency_reserve} reserved for --concurrency {reserves.concurrent_requests} "
            f"leaves {budget}; lower --concurrency (at most "
            f"{max(kv_cache_tokens // round_up(per_request, block_size) - 1, 0)} leaves room) or "
            "raise --gpu-memory-utilization"
        )
    if binding == "max_model_len":
        why = (
            f"max_model_len {max_model_len} minus {per_request} tokens reserved per request "
            f"(question, retrieved chunks, output, template) is below the KV cache's "
            f"{kv_limit} after reserving {reserves.concurrent_requests} concurrent request(s)"
        )
    else:
        why = (
            f"the KV cache holds {kv_cache_tokens} tokens; {concurrency_reserve} stay free for "
            f"{reserves.concurrent_requests} concurrent request(s), which is less than the "
            f"{context_limit} tokens max_model_len would allow"
        )
    if align_to_blocks:
        why += f"; rounded down to whole {block_size}-token attention blocks"
    return ResidentBudget(
        resident_budget_tokens=budget,
        binding_constraint=binding,
        context_limit_tokens=context_limit,
        kv_limit_tokens=kv_limit,
        concurrency_reserve_tokens=concurrency_reserve,
        block_aligned=align_to_blocks,
        reasoning=why,
    )
