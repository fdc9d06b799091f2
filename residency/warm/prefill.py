"""`residency warm`: prefill the prompt prefix every request shares on a checked server
(`warm.verify`), and prove with vLLM's own numbers that it is cached.

Warm sends the shared prompt as token ids to `/v1/completions` (max_tokens=1) and reads the
request's `cached_tokens` and the prefix-cache metric deltas. Hybrid models (align mode) may need
to see a prefix more than once before it is admitted, so warm re-sends until a send hits, within
`max_sightings`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from residency.planning.plan_model import ResidencyPlan
from residency.progress import BuildProgress
from residency.vllm_client import TTFT_METHOD, SendResult, VllmClient, wait_for_health
from residency.warm.options import WarmOptions
from residency.warm.verify import WarmTarget, check_server


class PrefixWarm(BaseModel):
    """One resident prefix after every prefix was warmed: vLLM's cached tokens for it."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str = Field(description="The plan's prefix id.")
    prefix_hash: str = Field(description="Its hash, recomputed through /tokenize.")
    prefix_tokens: int = Field(ge=0, description="Tokens of its text (no special tokens).")
    shared_prefix_tokens: int = Field(ge=1, description="Chat-rendered tokens its requests share.")
    expected_cached_tokens: int = Field(ge=0, description="floor((shared - 1) / block) * block.")
    cached_tokens: int = Field(
        ge=0, description="Cached tokens of a probe sent after every prefix was warmed."
    )
    resident: bool = Field(description="That probe hit the expected cached tokens.")
    sightings: int = Field(ge=0, description="Sends before its warm hit (0: already resident).")
    cold_ttft_s: float = Field(ge=0, description="TTFT of its first send.")
    probe_ttft_s: float = Field(ge=0, description="TTFT of the final probe.")


class WarmReport(BaseModel):
    """What `residency warm` did and what vLLM says about it (the top-level fields describe the
    first prefix; `prefixes` every one, and `resident` is true only when all are)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    server: str = Field(description="--server URL.")
    served_model: str = Field(description="/v1/models id.")
    prefix_hash: str = Field(description="plan.prefix.hash, recomputed through /tokenize.")
    prefix_tokens: int = Field(ge=0, description="Tokens of plan.prefix.text (no special tokens).")
    shared_prefix_tokens: int = Field(
        ge=1, description="Chat-rendered tokens every request shares."
    )
    block_size: int = Field(ge=1, description="The server's block_size (vllm:cache_config_info).")
    expected_cached_tokens: int = Field(ge=0, description="floor((shared - 1) / block) * block.")
    cached_tokens: int = Field(ge=0, description="Cached tokens of the last send.")
    resident: bool = Field(description="The last send hit the expected cached tokens.")
    sightings: int = Field(ge=0, description="Sends before the one that hit (0: already resident).")
    cold_ttft_s: float = Field(ge=0, description="TTFT of the first send (the prefill).")
    warm_ttft_s: float = Field(ge=0, description="TTFT of the last send (the probe).")
    ttft_method: str = Field(default=TTFT_METHOD, description="How TTFT is measured.")
    sends: tuple[SendResult, ...] = Field(description="Every send, in order.")
    warnings: tuple[str, ...] = Field(default=(), description="Things that did not stop warm.")
    prefixes: tuple[PrefixWarm, ...] = Field(
        default=(), description="Every prefix of the plan, probed after all were warmed."
    )


def open_client(options: WarmOptions) -> VllmClient:
    """The client of `options.url` (one request may take `request_timeout_s`)."""
    return VllmClient(options.url, timeout_s=options.request_timeout_s, api_key=options.api_key)


def admit(client: VllmClient, target: WarmTarget, max_sightings: int) -> list[SendResult]:
    """Send the prefix until a send hits the expected cached tokens: at most max_sightings + 1."""
    sends: list[SendResult] = []
    for _ in range(max_sightings + 1):
        sends.append(client.prefill(target.served_model, target.prompt_ids))
        if sends[-1].hit_tokens() >= target.expected_cached_tokens:
            break
    return sends


def build_report(
    client: VllmClient, plan: ResidencyPlan, target: WarmTarget, sends: Sequence[SendResult]
) -> WarmReport:
    """The WarmReport of a finished admit()."""
    last = sends[-1]
    resident = last.hit_tokens() >= target.expected_cached_tokens
    return WarmReport(
        server=client.base_url,
        served_model=target.served_model,
        prefix_hash=plan.prefix.hash,
        prefix_tokens=target.prefix_tokens,
        shared_prefix_tokens=len(target.prompt_ids),
        block_size=target.block_size,
        expected_cached_tokens=target.expected_cached_tokens,
        cached_tokens=last.hit_tokens(),
        resident=resident,
        sightings=len(sends) - 1 if resident else len(sends),
        cold_ttft_s=sends[0].ttft_s,
        warm_ttft_s=last.ttft_s,
        sends=tuple(sends),
        warnings=target.warnings,
    )


def warm(
    plan: ResidencyPlan, options: WarmOptions, progress: BuildProgress | None = None
) -> WarmReport:
    """Wait for the server, check it against the plan, prefill every prefix, then probe each
    once more: the proof that all of them are cached at the same time (a later warm could
    have evicted an earlier prefix). `progress` hears one step per prefix prefilled."""
    with open_client(options) as client:
        wait_for_health(client, options.timeout_s)
        # Every prefix is checked against the server before the first is prefilled: a
        # mismatch is one error line, with nothing sent and no progress begun.
        checked = [
            (p.id, view, check_server(view, client, options.allow_model_mismatch))
            for p in plan.all_prefixes()
            for view in (plan.for_prefix(p.id),)
        ]
        warmed: list[tuple[str, ResidencyPlan, WarmTarget, list[SendResult]]] = []
        if progress is not None:
            progress.start("prefilling prefixes", len(checked))
        for prefix_id, view, target in checked:
            warmed.append((prefix_id, view, target, admit(client, target, options.max_sightings)))
            if progress is not None:
                progress.advance(1)
        entries: list[PrefixWarm] = []
        first: WarmReport | None = None
        for prefix_id, view, target, sends in warmed:
            report = build_report(client, view, target, sends)
            # One prefix: its last warm send is the proof; several: probe each again.
            if len(warmed) == 1:
                probe = sends[-1]
            else:
                probe = client.prefill(target.served_model, target.prompt_ids)
            entries.append(
                PrefixWarm(
                    id=prefix_id,
                    prefix_hash=view.prefix.hash,
                    prefix_tokens=target.prefix_tokens,
                    shared_prefix_tokens=len(target.prompt_ids),
                    expected_cached_tokens=target.expected_cached_tokens,
                    cached_tokens=probe.hit_tokens(),
                    resident=probe.hit_tokens() >= target.expected_cached_tokens,
                    sightings=report.sightings,
                    cold_ttft_s=sends[0].ttft_s,
                    probe_ttft_s=probe.ttft_s,
                )
            )
            first = first or report
        assert first is not None
        resident = first.resident and all(e.resident for e in entries)
        return first.model_copy(update={"prefixes": tuple(entries), "resident": resident})
