"""Cold vs warm TTFT on a running vLLM server, per prompt length (`residency bench`).

Every prompt is N token ids of real text (the sample corpus or the plan's prefix, tokenized by
the server's `/tokenize`, cycled if the text is shorter). Cold never assumes an empty cache: each
cold send starts with a fresh random salt (`bench nonce <128-bit hex>` tokenized), so its first
block — and through the hash chain every later block — matches nothing vLLM has seen; the
prompt stays exactly N tokens (the salt replaces the text's last tokens), and the send's own
cached-token count (< one block) is checked and reported. Warm re-sends the last cold prompt
until a send hits floor((N - 1) / B) * B cached tokens (block size B; hybrid models in align
mode may need more than one sighting, bounded by `max_sightings`), then times `repeats` sends.
With a plan, one more row measures its chat-rendered shared prefix exactly as `warm` sends it
(cold: salted, same length).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

from residency.bench.options import BenchOptions
from residency.bench.report import BenchReport, CachedSource, LengthResult
from residency.errors import ConfigError, UpstreamError
from residency.index import BuildProgress
from residency.machine import machine_info
from residency.planning.plan_model import ResidencyPlan
from residency.stats import TimingStats
from residency.vllm_client import SendResult, VllmClient
from residency.vllm_client.sync_client import label_int
from residency.warm import shared_prefix_ids

OUTPUT_TOKENS = 1  # max_tokens of every send: vLLM needs prompt + max_tokens <= max_model_len
_TOKENIZE_CHARS = 4000  # /tokenize the text in pieces, so no request nears max_model_len
_TEXT_SUFFIXES = (".md", ".txt", ".jsonl")


def check_lengths(lengths: Sequence[int], max_model_len: int, block_size: int) -> None:
    """Refuse lengths that vLLM would reject or that could not cache a single block."""
    if not lengths:
        raise ConfigError("--lengths: give at least one prompt length, e.g. 2000,8000")
    longest = max_model_len - OUTPUT_TOKENS
    for n in lengths:
        if n > longest:
            raise ConfigError(
                f"--lengths {n} is over the server's max_model_len {max_model_len} minus "
                f"{OUTPUT_TOKENS} output token ({longest}): pass --lengths at most {longest}, "
                "or restart vLLM with a larger --max-model-len"
            )
        if n <= block_size:
            raise ConfigError(
                f"--lengths {n} is not more than one {block_size}-token block: vLLM caches only "
                f"full blocks; pass --lengths above {block_size}"
            )


def corpus_text(text_dir: Path) -> str:
    """The text of every .md/.txt/.jsonl file under text_dir, in path order."""
    if not text_dir.is_dir():
        raise ConfigError(
            f"{text_dir}: no corpus text to build prompts from; pass --plan to use its prefix"
        )
    files = sorted(p for p in text_dir.rglob("*") if p.suffix in _TEXT_SUFFIXES and p.is_file())
    text = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    if not text.strip():
        raise ConfigError(f"{text_dir}: no .md, .txt or .jsonl text there")
    return text


def _pieces(text: str) -> Iterator[str]:
    """`text` in consecutive pieces of at most _TOKENIZE_CHARS characters."""
    for start in range(0, len(text), _TOKENIZE_CHARS):
        yield text[start : start + _TOKENIZE_CHARS]


def text_token_ids(client: VllmClient, model: str, text: str, n: int) -> list[int]:
    """The first n token ids of `text` (cycled when it is shorter), via the server's /tokenize."""
    ids: list[int] = []
    for piece in _pieces(text):
        ids += client.tokenize(piece, model=model)
        if len(ids) >= n:
            return ids[:n]
    if not ids:
        raise ConfigError("the prompt text tokenizes to nothing")
    return (ids * (n // len(ids) + 1))[:n]


def salt_ids(client: VllmClient, model: str) -> list[int]:
    """Token ids of a fresh random nonce: a first block no cache can hold."""
    return client.tokenize(f"bench nonce {secrets.token_hex(16)}\n", model=model)


def salted(salt: Sequence[int], ids: Sequence[int]) -> list[int]:
    """`salt` then `ids`, cut back to len(ids): e.g. [9], [1, 2, 3] -> [9, 1, 2]."""
    return [*salt, *ids][: len(ids)]


def cold_ttfts(
    client: VllmClient, model: str, text: str, lengths: Sequence[int], repeats: int = 1
) -> dict[int, list[float]]:
    """TTFT of `repeats` salted cold prefills of the first n tokens of `text`, for each n in
    `lengths` (one short send first, so no timing carries the server's first-request setup)."""
    ids = text_token_ids(client, model, text, max(lengths))
    client.prefill(model, salted(salt_ids(client, model), ids[:64]))
    return {
        n: [
            client.prefill(model, salted(salt_ids(client, model), ids[:n])).ttft_s
            for _ in range(repeats)
        ]
        for n in lengths
    }


def measure_prompt(
    client: VllmClient,
    model: str,
    label: str,
    ids: Sequence[int],
    block_size: int,
    options: BenchOptions,
    progress: BuildProgress | None = None,
    warm_ids: Sequence[int] | None = None,
) -> LengthResult:
    """Salted cold sends of `ids`, then warm sends of `warm_ids` (default: the last cold prompt)."""
    n = len(ids)
    expected = (n - 1) // block_size * block_size
    cold: list[SendResult] = []
    prompt: list[int] = list(ids)
    for _ in range(options.cold_sends):
        prompt = salted(salt_ids(client, model), ids)
        cold.append(client.prefill(model, prompt))
        if progress is not None:
            progress.advance(1)
    warm_prompt = list(warm_ids) if warm_ids is not None else prompt
    admit_sends = 0
    for _ in range(options.max_sightings + 1):
        admit_sends += 1
        if client.prefill(model, warm_prompt).hit_tokens() >= expected:
            break
    warm: list[SendResult] = []
    for _ in range(options.warm_sends):
        warm.append(client.prefill(model, warm_prompt))
        if progress is not None:
            progress.advance(1)
    cold_stats = TimingStats.of([s.ttft_s for s in cold])
    warm_stats = TimingStats.of([s.ttft_s for s in warm])
    return LengthResult(
        label=label,
        prompt_tokens=n,
        expected_cached_tokens=expected,
        cold=cold_stats,
        warm=warm_stats,
        warm_over_cold=(warm_stats.median_s / cold_stats.median_s) if cold_stats.median_s else None,
        cold_ttft_s=tuple(s.ttft_s for s in cold),
        warm_ttft_s=tuple(s.ttft_s for s in warm),
        cold_cached_tokens=tuple(s.hit_tokens() for s in cold),
        warm_cached_tokens=tuple(s.hit_tokens() for s in warm),
        cold_verified=all(s.hit_tokens() < block_size for s in cold),
        warm_resident=all(s.hit_tokens() >= expected for s in warm),
        admit_sends=admit_sends,
    )


def pick_model(client: VllmClient, wanted: str | None) -> tuple[str, int | None]:
    """The served model to measure (the only one unless --model) and its max_model_len."""
    served = client.models()
    if wanted is not None:
        found = next((s for s in served if s.id == wanted), None)
        if found is None:
            names = ", ".join(s.id for s in served)
            raise ConfigError(f"--served-model {wanted}: --server {client.base_url} serves {names}")
        return found.id, found.max_model_len
    if len(served) > 1:
        names = ", ".join(s.id for s in served)
        raise ConfigError(
            f"--server {client.base_url} serves {names}: pick one with --served-model"
        )
    return served[0].id, served[0].max_model_len


def run_bench(
    options: BenchOptions,
    plan: ResidencyPlan | None = None,
    progress: BuildProgress | None = None,
) -> BenchReport:
    """Measure cold and warm TTFT at every length (and at the plan's prefix) on one server."""
    with VllmClient(
        options.url, timeout_s=options.request_timeout_s, api_key=options.api_key
    ) as client:
        return _run(client, options, plan, progress)


def _run(
    client: VllmClient,
    options: BenchOptions,
    plan: ResidencyPlan | None,
    progress: BuildProgress | None,
) -> BenchReport:
    model, max_model_len = pick_model(client, options.model)
    block_size, kv_tokens = _cache_config(client)
    if max_model_len is None:
        raise UpstreamError(f"--server {client.base_url}: /v1/models gives no max_model_len")
    check_lengths(options.prompt_lengths, max_model_len, block_size)
    warnings: list[str] = []
    plan_ids: list[int] | None = None
    if plan is not None:
        text, source = plan.prefix.text, f"plan prefix ({plan.prefix.hash[:19]}…)"
        plan_ids = _plan_ids(client, model, plan.prefix.text, block_size, max_model_len)
    else:
        text, source = corpus_text(options.text_dir), str(options.text_dir)
    longest = max([*options.prompt_lengths, len(plan_ids or [])])
    if kv_tokens is not None and 2 * longest > kv_tokens:
        warnings.append(
            f"the KV cache holds {kv_tokens:,} tokens, less than twice the longest prompt "
            f"({longest:,}): a cold send may evict the warm prompt"
        )
    cached_source: CachedSource = "usage"
    if client.prefill(model, salt_ids(client, model)).cached_tokens is None:
        cached_source = "metrics"
        warnings.append(
            "the server gives no per-request cached_tokens (vLLM --enable-prompt-tokens-details "
            "off): cached tokens are server-wide prefix-cache metric deltas"
        )
    rows = len(options.prompt_lengths) + (plan_ids is not None)
    if progress is not None:
        progress.start("cold and warm sends", rows * (options.cold_sends + options.warm_sends))
    base = text_token_ids(client, model, text, max(options.prompt_lengths))
    results = [
        measure_prompt(client, model, str(n), base[:n], block_size, options, progress)
        for n in options.prompt_lengths
    ]
    if plan_ids is not None:
        results.append(
            measure_prompt(client, model, "plan", plan_ids, block_size, options, progress, plan_ids)
        )
    warnings += _row_warnings(results, block_size)
    return BenchReport(
        timestamp=dt.datetime.now(dt.UTC),
        server=client.base_url,
        served_model=model,
        max_model_len=max_model_len,
        block_size=block_size,
        kv_cache_tokens=kv_tokens,
        text_source=source,
        cached_source=cached_source,
        repeats=options.warm_sends,
        cold_repeats=options.cold_sends,
        machine=machine_info(),
        results=tuple(results),
        warnings=tuple(warnings),
    )


def _cache_config(client: VllmClient) -> tuple[int, int | None]:
    """The server's block size and KV-cache tokens (None: not given); prefix caching must be on."""
    labels = client.cache_config_info()
    if labels.get("enable_prefix_caching") == "False":
        raise UpstreamError(
            f"--server {client.base_url} runs with prefix caching off (vllm:cache_config_info "
            "enable_prefix_caching=False): warm sends cannot hit; restart vLLM with "
            "--enable-prefix-caching"
        )
    block_size = label_int(labels, "block_size") or 16
    blocks = label_int(labels, "num_gpu_blocks")
    kv_tokens = label_int(labels, "kv_cache_size_tokens") or (
        blocks * block_size if blocks else None
    )
    return block_size, kv_tokens


def _plan_ids(
    client: VllmClient, model: str, prefix: str, block_size: int, max_model_len: int
) -> list[int]:
    """The plan prefix's token ids on this server, checked to fit one block to the window."""
    plan_ids = shared_prefix_ids(client, model, prefix)
    if not block_size < len(plan_ids) <= max_model_len - OUTPUT_TOKENS:
        raise ConfigError(
            f"--plan: its prefix renders to {len(plan_ids):,} tokens on --server "
            f"{client.base_url}, which must lie between one {block_size}-token block and "
            f"max_model_len {max_model_len} minus {OUTPUT_TOKENS}: re-plan with --server"
        )
    return plan_ids


def _row_warnings(results: Sequence[LengthResult], block_size: int) -> list[str]:
    """A warning for each row whose cold sends hit the cache or whose warm sends did not."""
    warnings: list[str] = []
    for row in results:
        if not row.cold_verified:
            warnings.append(
                f"length {row.label}: a cold send found {max(row.cold_cached_tokens):,} cached "
                f"tokens (one block is {block_size}): cold TTFT may be too low"
            )
        if not row.warm_resident:
            warnings.append(
                f"length {row.label}: warm sends cached {min(row.warm_cached_tokens):,} of "
                f"{row.expected_cached_tokens:,} expected tokens after {row.admit_sends} "
                "admission send(s): the prefix did not stay resident"
            )
    return warnings
