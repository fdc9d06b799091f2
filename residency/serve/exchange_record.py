"""The query-log line of one finished exchange (record.py appends it)."""

from __future__ import annotations

import time

from residency.serve.exchange import Exchange
from residency.serve.record import RouterLogRecord
from residency.vllm_client import Usage


def log_record(ex: Exchange, usage: Usage) -> RouterLogRecord:
    """The line for `ex`, with the usage read from its answer; its total time ends now."""
    r = ex.ctx.retrieval
    prune = ex.ctx.prune
    return RouterLogRecord(
        query=r.question,
        ts=ex.ts,
        endpoint=ex.endpoint,
        route=r.route,
        prefix=ex.ctx.retrieval.prefix_id,
        retrieved=ex.ctx.section_ids,
        chunks=ex.ctx.kept_chunk_ids,
        top_chunk=r.top_chunk_id,
        period=ex.ctx.block.period_line,
        pruned=len(r.chunk_ids) - len(ex.ctx.kept_chunk_ids) if prune is not None else None,
        pruner_valid=prune.valid if prune is not None else None,
        upstream=ex.upstream.label if ex.upstream is not None else None,
        outcome=ex.outcome,
        source=ex.source,
        status_code=ex.status_code,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        retrieval_ms=r.retrieval_s * 1000,
        prune_ms=prune.elapsed_s * 1000 if prune is not None else None,
        forward_ms=ex.forward_s * 1000 if ex.forward_s is not None else None,
        ttft_ms=ex.ttft_s * 1000 if ex.ttft_s is not None else None,
        total_ms=(time.perf_counter() - ex.started) * 1000,
    )
