"""`residency warm`: check a vLLM server against a plan, prefill the prompt prefix every request
shares, and prove with vLLM's own numbers that it is cached.

What every request shares is not the prefix text but its chat-template rendering up to the start
of the user's content. `/tokenize` renders two requests that differ only in the question (and one
that adds a second system message, as retrieved chunks may come); the longest common prefix of
their token ids is the prompt warm sends, as token ids, to `/v1/completions` (max_tokens=1). vLLM
caches only full blocks and recomputes the last prompt token, so a C-token prompt leaves
floor((C - 1) / B) * B tokens cached (block size B); e.g. C = 29,318, B = 128: 29,312. Hybrid
models (align mode) may need to see a prefix more than once before it is admitted, so warm
re-sends until a send hits, within `max_sightings`.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from residency.errors import ConfigError, UpstreamError, UpstreamMismatchError
from residency.planning.plan_model import ResidencyPlan
from residency.planning.prefix import hash_token_ids
from residency.profiles import ModelProfile, model_profile_names, profiles_dir
from residency.vllm_client import TTFT_METHOD, SendResult, ServedModel, VllmClient, wait_for_health

# Request shapes the router sends: the question alone, or retrieved chunks in a second system
# message before it. Their common token prefix is what warm may prefill.
_SHAPES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "A"),),
    (("user", "B"),),
    (("system", "A"), ("user", "B")),
)


class WarmOptions(BaseModel):
    """How `residency warm` talks to the server and how hard it tries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str = Field(min_length=1, description="--server: the vLLM base URL.")
    timeout_s: float = Field(default=120.0, gt=0, description="--timeout: wait for /health.")
    request_timeout_s: float = Field(default=300.0, gt=0, description="--request-timeout.")
    max_sightings: int = Field(default=4, ge=0, le=64, description="--max-sightings.")
    allow_model_mismatch: bool = Field(default=False, description="--allow-model-mismatch.")
    api_key: str | None = Field(default=None, description="--api-key (Bearer token).")


class WarmReport(BaseModel):
    """What `residency warm` did and what vLLM says about it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """The token-id prompt warm sends and what vLLM should cache of it."""

    served_model: str
    prompt_ids: tuple[int, ...]
    prefix_tokens: int
    block_size: int
    warnings: tuple[str, ...]

    @property
    def expected_cached_tokens(self) -> int:
        """Full blocks before the last prompt token (vLLM always recomputes that one)."""
        return (len(self.prompt_ids) - 1) // self.block_size * self.block_size


def open_client(options: WarmOptions) -> VllmClient:
    """The client of `options.server` (one request may take `request_timeout_s`)."""
    return VllmClient(options.server, timeout_s=options.request_timeout_s, api_key=options.api_key)


def model_names(plan_model: str) -> set[str]:
    """Comparable names of the plan's model: itself, its directory name, a profile's HF repo."""
    names = {plan_model, Path(plan_model).name}
    if plan_model in model_profile_names():
        path = profiles_dir() / "models" / f"{plan_model}.toml"
        with suppress(OSError, tomllib.TOMLDecodeError, ValidationError):
            names.add(ModelProfile.model_validate(tomllib.loads(path.read_text("utf-8"))).hf_repo)
    return {_norm(n) for n in names if n}


def _norm(name: str) -> str:
    """'Qwen/Qwen3.5-4B-FP8' and 'qwen3.5-4b-fp8' compare equal; paths by their last part."""
    return "".join(c for c in name.rstrip("/").rsplit("/", 1)[-1].lower() if c.isalnum())


def served_matches(plan_model: str, served: ServedModel) -> bool:
    """The plan's model names the served one: same path, served id or root, or profile repo."""
    root = Path(served.root) if served.root else None
    if root and root.exists() and Path(plan_model).exists() and root.samefile(plan_model):
        return True
    theirs = {_norm(served.id), _norm(served.root or "")}
    return bool(model_names(plan_model) & theirs)


def check_server(plan: ResidencyPlan, client: VllmClient, allow_model_mismatch: bool) -> WarmTarget:
    """Refuse a server whose model, tokenizer or max_model_len differ from the plan's."""
    url, cap, prefix = client.base_url, plan.capacity, plan.prefix
    served_all = client.models()
    served = next((s for s in served_all if served_matches(cap.model, s)), served_all[0])
    warnings: list[str] = []
    if not served_matches(cap.model, served):
        what = f"--server {url} serves {served.id!r} (root {served.root!r})"
        if not allow_model_mismatch:
            raise UpstreamMismatchError(
                f"plan was made for model {cap.model!r}; {what}; re-plan with --server {url}, "
                "or pass --allow-model-mismatch if it is the same model under another name "
                "(the tokenizer is still checked)"
            )
        warnings.append(f"model differs: plan {cap.model!r}, {what} (--allow-model-mismatch)")
    if served.max_model_len is not None and served.max_model_len != cap.max_model_len:
        raise UpstreamMismatchError(
            f"plan was made for max_model_len {cap.max_model_len}; --server {url} runs "
            f"{served.max_model_len}; re-plan with --server {url}, or restart vLLM with "
            f"--max-model-len {cap.max_model_len}"
        )
    labels = client.cache_config_info()
    if labels.get("enable_prefix_caching", "True") == "False":
        raise UpstreamMismatchError(
            f"--server {url} runs with prefix caching off (vllm:cache_config_info "
            "enable_prefix_caching=False): nothing can stay resident; restart vLLM with "
            "--enable-prefix-caching"
        )
    block_size = int(labels.get("block_size") or cap.block_size)
    if block_size != cap.block_size:
        warnings.append(
            f"block size differs: plan {cap.block_size}, server {block_size} (expected cached "
            "tokens use the server's)"
        )
    ids = client.tokenize(prefix.text, model=served.id)
    if prefix.hash_of == "token_ids":
        server_hash = hash_token_ids(ids)
        if server_hash != prefix.hash:
            raise UpstreamMismatchError(
                f"plan was made with tokenizer {prefix.tokenizer}: {prefix.token_count:,} tokens / "
                f"hash {prefix.hash[:19]}…; --server {url} ({served.id}) tokenizes the prefix to "
                f"{len(ids):,} tokens / hash {server_hash[:19]}…; re-plan with --server {url}"
            )
    else:
        text_hash = "sha256:" + hashlib.sha256(prefix.text.encode("utf-8")).hexdigest()
        if text_hash != prefix.hash:
            raise ConfigError(
                f"plan prefix text hash {text_hash[:19]}… differs from the plan's "
                f"{prefix.hash[:19]}…: plan.json was edited; re-plan"
            )
        warnings.append(
            f"plan has no token hash ({prefix.tokenizer}): tokenizer not verified; the server "
            f"counts {len(ids):,} tokens, the plan {prefix.token_count:,}"
        )
    prompt = shared_prefix_ids(client, served.id, prefix.text)
    length = served.max_model_len or cap.max_model_len
    if len(prompt) >= length:
        raise UpstreamMismatchError(
            f"the prefix renders to {len(prompt):,} tokens with the chat template; --server {url} "
            f"max_model_len is {length:,}: no room for a question; re-plan with --server {url}"
        )
    target = WarmTarget(served.id, tuple(prompt), len(ids), block_size, tuple(warnings))
    if target.expected_cached_tokens == 0:
        raise ConfigError(
            f"the shared prefix has {len(prompt):,} tokens, not more than one {block_size}-token "
            "block: vLLM caches only full blocks, so nothing would stay resident"
        )
    return target


def shared_prefix_ids(client: VllmClient, model: str, prefix_text: str) -> list[int]:
    """The longest common prefix of the rendered request shapes (system = the prefix text)."""
    common: list[int] | None = None
    for i, shape in enumerate(_SHAPES):
        messages = [{"role": "system", "content": prefix_text}]
        messages += [{"role": role, "content": text} for role, text in shape]
        try:
            ids = client.tokenize_chat(model, messages)
        except UpstreamError as exc:
            if i < 2:  # the plain question shape must render
                raise UpstreamError(
                    f"{exc}; the server cannot render chat messages (pass vLLM --chat-template)"
                ) from None
            continue  # a template that refuses a second system message: that shape is unused
        common = ids if common is None else _common_prefix(common, ids)
    assert common is not None
    return common


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return list(a[:n])


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


def warm(plan: ResidencyPlan, options: WarmOptions) -> WarmReport:
    """Wait for the server, check it against the plan, prefill and verify the shared prefix."""
    with open_client(options) as client:
        wait_for_health(client, options.timeout_s)
        target = check_server(plan, client, options.allow_model_mismatch)
        sends = admit(client, target, options.max_sightings)
        return build_report(client, plan, target, sends)
