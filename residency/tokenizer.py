"""The served model's tokenizer, behind one protocol: `encode` (token ids) and `count`.

Three implementations, in order of preference: a local tokenizer directory (its
``tokenizer.json``, read with the `tokenizers` library), a running vLLM server's ``/tokenize``
(exactly the server's tokenizer), or, with neither, an approximation of ceil(UTF-8 bytes / 3)
— about one token per CJK character, looser for ASCII — which gives no ids and is labelled
``approx`` in the index manifest and the plan, so what is built on it says so.

Every count is without special tokens: the resident prefix and the corpus sections sit inside a
chat-template rendering whose own tokens the server adds.
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
APPROX_RULE = f"approx: ceil(utf-8 bytes / {APPROX_BYTES_PER_TOKEN})"


class TokenCountInfo(BaseModel):
    """How the token counts of an index were made (recorded in its manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

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


class ModelTokenizer(Protocol):
    """Turns text into the served model's token ids (None when only approximate) and counts."""

    @property
    def name(self) -> str:
        """The label a plan records: 'tokenizer:DIR', 'server:URL (MODEL)' or the rule."""
        ...

    @property
    def info(self) -> TokenCountInfo:
        """How counts are made (what an index manifest records)."""
        ...

    def encode(self, text: str) -> list[int] | None:
        """Token ids without special tokens, or None if this tokenizer cannot produce ids."""
        ...

    def count(self, text: str) -> int:
        """Token count of the text (no special tokens)."""
        ...

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text (no special tokens)."""
        ...


class ApproxTokenizer:
    """ceil(UTF-8 bytes / 3): no tokenizer needed, no ids, clearly labelled."""

    name = APPROX_RULE

    @property
    def info(self) -> TokenCountInfo:
        """Method approx with its rule."""
        return TokenCountInfo(method="approx", name=APPROX_RULE)

    def encode(self, text: str) -> list[int] | None:
        """No ids without a tokenizer."""
        return None

    def count(self, text: str) -> int:
        """Approximate token count."""
        return math.ceil(len(text.encode("utf-8")) / APPROX_BYTES_PER_TOKEN)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Approximate token count of each text."""
        return [self.count(t) for t in texts]


class LocalTokenizer:
    """The model's own tokenizer from a local directory holding ``tokenizer.json``."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        path = directory / "tokenizer.json" if directory.is_dir() else directory
        if not path.is_file():
            raise ConfigError(
                f"--tokenizer-dir {directory}: no tokenizer.json there; pass the model directory "
                "that holds it, or --server URL to count with a running vLLM"
            )
        data = path.read_bytes()
        try:
            self._tokenizer = HfTokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # the Rust side raises a plain Exception
            raise ConfigError(f"--tokenizer-dir {directory}: cannot load {path}: {exc}") from None
        self.name = f"tokenizer:{directory}"
        self._info = TokenCountInfo(
            method="tokenizer",
            name=str(directory.resolve()),
            fingerprint=hashlib.sha256(data).hexdigest(),
        )

    @property
    def info(self) -> TokenCountInfo:
        """Method tokenizer with the directory and the file's hash."""
        return self._info

    def encode(self, text: str) -> list[int] | None:
        """Token ids without special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        """Number of token ids."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text (one batched call)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]


class ServerTokenizer:
    """A running vLLM's ``/tokenize`` (one request per text): exactly the server's tokenizer."""

    def __init__(self, base_url: str, *, timeout_s: float = 60.0) -> None:
        self._client = VllmClient(base_url, timeout_s=timeout_s)
        self._model = self._client.models()[0].id
        self.name = f"server:{self._client.base_url} ({self._model})"
        self._info = TokenCountInfo(
            method="server", name=f"{self._client.base_url} ({self._model})"
        )

    @property
    def info(self) -> TokenCountInfo:
        """Method server with the URL and served model."""
        return self._info

    def encode(self, text: str) -> list[int] | None:
        """Token ids as the server tokenizes them."""
        return self._client.tokenize(text, model=self._model)

    def count(self, text: str) -> int:
        """Number of token ids (an empty text is 0 without a request)."""
        return len(self._client.tokenize(text, model=self._model)) if text else 0

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Token count of each text as the server tokenizes it."""
        return [self.count(t) for t in texts]

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._client.close()


class MemoTokenizer:
    """A tokenizer that remembers ids and counts per text (planning many budgets re-counts
    every section)."""

    def __init__(self, inner: ModelTokenizer) -> None:
        self._inner = inner
        self.name = inner.name
        self._ids: dict[str, list[int] | None] = {}
        self._counts: dict[str, int] = {}

    @property
    def info(self) -> TokenCountInfo:
        """The inner tokenizer's."""
        return self._inner.info

    def encode(self, text: str) -> list[int] | None:
        """The inner tokenizer's ids, once per text."""
        if text not in self._ids:
            self._ids[text] = self._inner.encode(text)
        return self._ids[text]

    def count(self, text: str) -> int:
        """The inner tokenizer's count, once per text."""
        if text not in self._counts:
            self._counts[text] = self._inner.count(text)
        return self._counts[text]

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Each text's count, once per text."""
        return [self.count(t) for t in texts]


def reopen_tokenizer(
    label: str, index_info: TokenCountInfo, *, server: bool = True
) -> ModelTokenizer | None:
    """The tokenizer a plan was made with (its label: 'tokenizer:DIR', or 'server:URL (MODEL)'
    when `server`), else the one its index was counted with; None when neither is reachable."""
    candidates: list[Path] = []
    if label.startswith("tokenizer:"):
        candidates.append(Path(label.removeprefix("tokenizer:")))
    elif server and label.startswith("server:"):
        return ServerTokenizer(label.removeprefix("server:").split(" (", 1)[0])
    if index_info.method == "tokenizer":
        candidates.append(Path(index_info.name))
    for path in candidates:
        if (path / "tokenizer.json").is_file():
            return LocalTokenizer(path)
    return None


def open_tokenizer(tokenizer_dir: Path | None, server: str | None) -> ModelTokenizer:
    """The tokenizer for `--tokenizer-dir` or `--server` (not both), else the approximation."""
    if tokenizer_dir is not None and server is not None:
        raise ConfigError(
            f"--tokenizer-dir {tokenizer_dir} and --server {server} both given; pass one"
        )
    if tokenizer_dir is not None:
        return LocalTokenizer(tokenizer_dir)
    if server is not None:
        return ServerTokenizer(server)
    return ApproxTokenizer()
