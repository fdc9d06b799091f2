"""Token counts of corpus text with the target model's tokenizer, or a labelled approximation.

Three sources, in order of preference: a local tokenizer directory (its ``tokenizer.json``, read
with the `tokenizers` library), a running vLLM server's ``/tokenize``, or, with neither, an
approximation of ceil(UTF-8 bytes / 3) — about one token per CJK character, looser for ASCII —
which the index manifest records as method ``approx`` so a plan built on it says so.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from residency.errors import ConfigError
from residency.vllm_client import VllmClient

TokenCountMethod = Literal["tokenizer", "server", "approx"]
APPROX_BYTES_PER_TOKEN = 3


class TokenCountInfo(BaseModel):
    """How the token counts of an index were made (recorded in its manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: TokenCountMethod = Field(
        description="tokenizer (local tokenizer.json), server (vLLM /tokenize) or approx."
    )
    name: str = Field(
        min_length=1,
        max_length=4096,
        description="The tokenizer directory, server URL and model, or the approximation rule.",
    )
    fingerprint: str | None = Field(
        default=None,
        min_length=8,
        max_length=128,
        description="sha256 of tokenizer.json (local tokenizers only), to spot a changed file.",
    )


class TokenCounter(Protocol):
    """Counts the tokens of texts the way the served model will."""

    @property
    def info(self) -> TokenCountInfo:
        """How counts are made."""
        ...

    def count(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text (no special tokens)."""
        ...


class ApproxTokenCounter:
    """ceil(UTF-8 bytes / 3): no tokenizer needed, clearly labelled as an approximation."""

    @property
    def info(self) -> TokenCountInfo:
        """Method approx with its rule."""
        return TokenCountInfo(
            method="approx", name=f"approx: ceil(utf-8 bytes / {APPROX_BYTES_PER_TOKEN})"
        )

    def count(self, texts: Sequence[str]) -> list[int]:
        """Approximate token count of each text."""
        return [math.ceil(len(t.encode("utf-8")) / APPROX_BYTES_PER_TOKEN) for t in texts]


class LocalTokenCounter:
    """The model's own tokenizer from a local directory holding ``tokenizer.json``."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json" if directory.is_dir() else directory
        if not path.is_file():
            raise ConfigError(
                f"--tokenizer-dir {directory}: no tokenizer.json there; pass the model directory "
                "that holds it, or --server URL to count with a running vLLM"
            )
        data = path.read_bytes()
        try:
            self._tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # the Rust side raises a plain Exception
            raise ConfigError(f"--tokenizer-dir {directory}: cannot load {path}: {exc}") from None
        self._info = TokenCountInfo(
            method="tokenizer",
            name=str(directory.resolve()),
            fingerprint=hashlib.sha256(data).hexdigest(),
        )

    @property
    def info(self) -> TokenCountInfo:
        """Method tokenizer with the directory and the file's hash."""
        return self._info

    def count(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text without special tokens."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]


class ServerTokenCounter:
    """A running vLLM server's ``/tokenize`` (one request per text)."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self._client = VllmClient(base_url, timeout_s=timeout_s)
        self._model = self._client.models()[0].id
        self._info = TokenCountInfo(
            method="server", name=f"{self._client.base_url} ({self._model})"
        )

    @property
    def info(self) -> TokenCountInfo:
        """Method server with the URL and served model."""
        return self._info

    def count(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text as the server tokenizes it."""
        return [len(self._client.tokenize(t, model=self._model)) if t else 0 for t in texts]

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._client.close()


def get_token_counter(tokenizer_dir: Path | None, server: str | None) -> TokenCounter:
    """The counter for `--tokenizer-dir` or `--server` (not both), else the approximation."""
    if tokenizer_dir is not None and server is not None:
        raise ConfigError(
            f"--tokenizer-dir {tokenizer_dir} and --server {server} both given; pass one"
        )
    if tokenizer_dir is not None:
        return LocalTokenCounter(tokenizer_dir)
    if server is not None:
        return ServerTokenCounter(server)
    return ApproxTokenCounter()
