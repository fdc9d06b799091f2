"""Check a vLLM server against a plan before warming it: the served model, max_model_len, prefix
caching, the tokenizer (the plan's prefix hash recomputed through `/tokenize`), and the token-id
prompt every request shares.

What every request shares is not the prefix text but its chat-template rendering up to the start
of the user's content. `/tokenize` renders two requests that differ only in the question (and one
that adds a second system message, as retrieved chunks may come); the longest common prefix of
their token ids is the prompt warm sends. vLLM caches only full blocks and recomputes the last
prompt token, so a C-token prompt leaves floor((C - 1) / B) * B tokens cached (block size B);
e.g. C = 29,318, B = 128: 29,312.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from residency.capacity.profiles import ModelProfile, model_profile_names, profiles_dir
from residency.errors import ConfigError, UpstreamError, UpstreamMismatchError
from residency.planning.plan_model import PrefixInfo, ResidencyPlan
from residency.planning.prefix import hash_token_ids
from residency.vllm_client import ServedModel, VllmClient

# Request shapes the router sends: the question alone, or retrieved chunks in a second system
# message before it. Their common token prefix is what warm may prefill.
_SHAPES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "A"),),
    (("user", "B"),),
    (("system", "A"), ("user", "B")),
)


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
    warnings: list[str] = []
    served = _served_model(plan, client, allow_model_mismatch, warnings)
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
    ids = _prefix_ids(prefix, client, served.id, warnings)
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


def _served_model(
    plan: ResidencyPlan, client: VllmClient, allow_model_mismatch: bool, warnings: list[str]
) -> ServedModel:
    """The served model the plan names (else the first), refused unless its name and window
    match the plan's (`--allow-model-mismatch`: a name that differs is a warning)."""
    url, cap = client.base_url, plan.capacity
    served_all = client.models()
    served = next((s for s in served_all if served_matches(cap.model, s)), served_all[0])
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
        # A smaller window always fits the model; a larger one may be beyond what it allows.
        restart = (
            f", or restart vLLM with --max-model-len {cap.max_model_len}"
            if cap.max_model_len < served.max_model_len
            else ""
        )
        raise UpstreamMismatchError(
            f"plan was made for max_model_len {cap.max_model_len}; --server {url} runs "
            f"{served.max_model_len}; re-plan with --server {url} (it plans the server's own "
            f"window){restart}"
        )
    return served


def _prefix_ids(
    prefix: PrefixInfo, client: VllmClient, model: str, warnings: list[str]
) -> list[int]:
    """The prefix's token ids on the server, refused unless they hash as the plan's (a plan
    without a token hash: its text must hash as the plan's, and a warning says so)."""
    url = client.base_url
    ids = client.tokenize(prefix.text, model=model)
    if prefix.hash_of == "token_ids":
        server_hash = hash_token_ids(ids)
        if server_hash != prefix.hash:
            raise UpstreamMismatchError(
                f"plan was made with tokenizer {prefix.tokenizer}: {prefix.token_count:,} tokens / "
                f"hash {prefix.hash[:19]}…; --server {url} ({model}) tokenizes the prefix to "
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
    return ids


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
